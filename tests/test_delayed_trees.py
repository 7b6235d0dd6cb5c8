"""Delayed draft trees (DDTE: Thomas, Kitanovski, Goldblum & Pal, arXiv 2602.16994): one shared draft path of
length L1 = ``delay`` from the root, then K i.i.d. rows (or K first tokens without replacement) of length
L2 = ``length - delay`` branching from its end.

Exact: the REAL decoder with ``delay`` in its exact mode gives the target's law of the first T tokens to
1e-12 for every rule that takes delayed trees (level by level kseq / rrs / optimal, traversal, gbv, layer on
iid; rrs / kseq / optimal_embedded without replacement, traversal, layer on without_replacement; spectr_gbv on
both), eager and
with the static-shape step, with processed laws and EOS. Planted bugs, each caught by the same check with its
law error stated: the shared path's node given k copies of its one draft (the tree built as if the rows had
been drawn from the root), the without-replacement verifier run at the root instead of at the branching node,
and SpecTr-GBV blind to the delay (the k rows verified as k draws at the root).

The one-step tree LP on delayed trees (``tree_optimum(..., delay=)``) bounds every rule; the DDTE comparison
(traversal against the OT-based level-by-level rules on delayed trees) is a research sweep
(``test_ddte_claim_table``), its numbers in docs (the delayed-trees section).
"""

from __future__ import annotations

import pytest
import torch

from otm.analysis.tree_optimum import draft_rows, rule_tokens_per_call, tree_law, tree_optimum
from otm.decode import Sampling, speculative_decode
from otm.decode.exact_mode import exact_decode_law, law_error, target_law
from otm.decode.toy import ToyLM, model_law
from otm.decode.tree import DraftTree
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [0, 2]


def _error(rule, scheme="iid", *, V=3, k=2, L=3, delay=1, T=3, seeds=(2, 3), sampling=None, eos=None, **options):
    """Law error of the decoder's first T tokens (T = 3 cuts the depth to 2: the shared token, then one per row)."""
    prompt = PROMPT if V > 2 else [0, 1]
    target, draft = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
    law = exact_decode_law(target, draft, prompt, max_new_tokens=T, k=k, length=L, delay=delay, verifier=rule,
                           scheme=scheme, sampling=sampling, eos_token_id=eos, **options)
    return law_error(law, target_law(model_law(target, prompt, sampling), T, eos=eos))


# -- the tree --------------------------------------------------------------------------------


def test_delayed_tree_holds_one_draw_per_shared_node():
    tree = DraftTree.from_rows([[5, 3, 1], [5, 3, 2], [5, 3, 1]], root_token=0, delay=2)
    assert tree.rows_through[:3] == [[0], [0], [0, 1, 2]]  # root and depth 1: one draw each; depth 2: the K draws
    assert tree.node_of[:, 2].tolist() == [2, 2, 2] and tree.delay == 2
    plain = DraftTree.from_rows([[5, 3], [5, 4]], root_token=0)
    assert plain.delay == 0 and plain.rows_through[0] == [0, 1]
    with pytest.raises(ValueError, match="sharing their first 2 tokens"):
        DraftTree.from_rows([[5, 3, 1], [5, 4, 2]], root_token=0, delay=2)


# -- exact mode: every rule that takes delayed trees -------------------------------------------

IID = ["kseq", "rrs", "optimal", "traversal", "gbv", "layer", "spectr_gbv"]
WOR = ["rrs_without_replacement", "kseq_without_replacement", "optimal_embedded", "traversal", "layer", "spectr_gbv"]


@pytest.mark.parametrize("rule", IID)
def test_delayed_iid_is_exact(rule):
    """V = 2, k = 2, depth 2 (L = 3 cut by T = 3), delay 1: the shared token, then 2 i.i.d. rows of one token."""
    assert _error(rule, V=2) < 1e-12


def test_delayed_iid_is_exact_deeper():
    """V = 3 (traversal, gbv), and V = 2 with rows of 2 tokens after the shared one (T = 4): GBV's skewed law
    below the branching node (the research sweep runs every rule there)."""
    assert _error("traversal") < 1e-12
    assert _error("gbv") < 1e-12
    assert _error("gbv", V=2, T=4) < 1e-12


@pytest.mark.parametrize("rule,V", [("rrs_without_replacement", 3), ("traversal", 3), ("kseq_without_replacement", 2),
                                    ("optimal_embedded", 2), ("layer", 2)])
def test_delayed_without_replacement_is_exact(rule, V):
    """The k distinct tokens are drawn at the shared path's end: the without-replacement verifier runs there."""
    assert _error(rule, "without_replacement", V=V) < 1e-12


@pytest.mark.parametrize("rule,scheme", [("kseq", "iid"), ("traversal", "iid"), ("gbv", "iid"),
                                         ("rrs_without_replacement", "without_replacement")])
def test_delayed_static_step_is_exact(rule, scheme):
    """The static step: its draft cache always has k rows; the shared path is fed at batch 1 (to every row)."""
    assert _error(rule, scheme, V=2, static=True) < 1e-12


def test_delayed_is_exact_with_processed_laws_eos_and_refeed():
    s = Sampling(temperature=0.7, top_k=2)
    assert _error("kseq", V=3, k=3, L=2, T=3, seeds=(6, 7), sampling=s, eos=1, target_rollback="refeed") < 1e-12


# -- planted bugs --------------------------------------------------------------------------------


def test_planted_k_copies_of_the_shared_draft_is_caught(monkeypatch):
    """Planted bug: the shared node's one draft counted k times (the tree built as if every row drew it at the
    root, ``rows_through`` = all rows): kseq then verifies k identical 'i.i.d.' drafts.
    Law error 0.0071 (V = 2, k = 2, depth 2, delay 1; rrs: 0.085 at V = 3)."""
    original = DraftTree.from_rows.__func__

    def k_copies(cls, rows, root_token, delay=0):
        tree = original(cls, rows, root_token)  # rows_through: every row, at every node
        tree.delay = delay
        return tree

    monkeypatch.setattr(DraftTree, "from_rows", classmethod(k_copies))
    assert _error("kseq", V=2) > 5e-3


def test_planted_without_replacement_update_at_the_root_is_caught(monkeypatch):
    """Planted bug: traversal's without-replacement update of the draft law after a rejection made at the root
    (as before delayed trees) instead of at the branching node, where the k distinct tokens were drawn.
    Law error 4.6e-4 (V = 3, k = 2, depth 2, delay 1). (The level-by-level walk with the same bug fails loudly:
    the single-draft rule is handed the k drafts.)"""
    original = DraftTree.from_rows.__func__

    def root_verifier_at_root(cls, rows, root_token, delay=0):
        tree = original(cls, rows, root_token, delay)
        tree.delay = 0  # rows_through stays delayed; only the verifier's choice moves
        return tree

    monkeypatch.setattr(DraftTree, "from_rows", classmethod(root_verifier_at_root))
    assert _error("traversal", "without_replacement") > 1e-4


@pytest.mark.parametrize("scheme,V,T", [("iid", 3, 3), ("iid", 2, 4), ("without_replacement", 3, 3)])
def test_spectr_gbv_on_delayed_trees_is_exact(scheme, V, T):
    """SpecTr-GBV on a delayed tree: the K rows verified in turn from the shared path's end, then the shared path
    by block verification from there up (otm.tree_verifiers.spectr_gbv.SpectrGbvState.shared_block)."""
    assert _error("spectr_gbv", scheme, V=V, T=T) < 1e-12


def test_planted_spectr_gbv_rows_from_the_root_on_a_delayed_tree_is_caught(monkeypatch):
    """Planted bug: SpecTr-GBV blind to the delay, verifying the K rows as K draws at the root although the
    shared path was drawn once (what the rule did before it knew delayed trees): law error 0.085 (V = 3, k = 2,
    depth 2, delay 1, T = 3)."""
    from otm.tree_verifiers import spectr_gbv

    real = spectr_gbv.SpectrGbvState.__init__

    class Undelayed:
        def __init__(self, tree):
            self.tokens, self.node_of, self.delay = tree.tokens, tree.node_of, 0

    monkeypatch.setattr(spectr_gbv.SpectrGbvState, "__init__",
                        lambda self, tree, *a, **kw: real(self, Undelayed(tree), *a, **kw))
    assert _error("spectr_gbv") > 5e-2


def test_a_rule_that_refuses_a_delay_says_so_in_one_line(monkeypatch):
    """The registry's refusal (TreeRuleSpec.no_delay), for a rule that cannot take a delayed tree."""
    from dataclasses import replace

    from otm.decode.tree_registry import TREE_RULES

    monkeypatch.setitem(TREE_RULES, "spectr_gbv", replace(TREE_RULES["spectr_gbv"], no_delay="a planted reason"))
    with pytest.raises(OtmError, match="spectr_gbv rule takes no delayed tree.*a planted reason"):
        _error("spectr_gbv")


@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_tree_lp_on_delayed_trees_is_exact_and_reaches_the_lp(scheme):
    """The tree LP's plan for the delayed shape (solve_tree_plan(delay=)) drawn by TreeLP: the target's law to
    1e-12, and its first step's tokens per call equal the LP's value on the delayed tree."""
    from otm.analysis.tree_optimum import rule_tokens_per_call, tree_optimum

    assert _error("tree_lp", scheme, V=2, k=2, L=2, delay=1, T=3) < 1e-12
    t, d = ToyLM(2, seed=2), ToyLM(2, seed=3)
    got = rule_tokens_per_call(t, d, [0, 1], 2, 2, "tree_lp", scheme, delay=1)
    assert got == pytest.approx(tree_optimum(t, d, [0, 1], 2, 2, scheme, delay=1).value, abs=1e-9)


def test_bad_delay_is_refused():
    target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
    for delay in (3, -1, 1.5):
        with pytest.raises(OtmError, match="0 <= delay < length"):
            speculative_decode(target, draft, PROMPT, k=2, length=3, delay=delay, max_new_tokens=4, seed=0)



def test_shared_path_is_drafted_at_batch_one(monkeypatch):
    """Draft calls of a step: the context feed, L1 forwards at batch 1 (the path's tokens), then L2 - 1 at batch k."""
    from otm.decode.runner import Runner

    batches = []
    forward = Runner.forward

    def spy(self, ids, *args, **kwargs):
        if self.role == "draft":
            batches.append(ids.shape[0])
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(Runner, "forward", spy)
    target, draft = ToyLM(4, seed=0), ToyLM(4, seed=1)
    g = speculative_decode(target, draft, PROMPT, k=3, length=4, delay=2, verifier="traversal", max_new_tokens=5,
                           seed=0)
    assert batches[:4] == [1, 1, 1, 3]  # feed, path tokens 1 and 2 (batch 1), then row tokens 3 (batch 3)
    assert g.stats.method.endswith("delay=2")


# -- the tree LP on delayed trees -----------------------------------------------------------------


def test_delayed_tree_law_and_lp_bound_every_rule():
    t, d = ToyLM(3, seed=0), ToyLM(3, seed=1)
    law = model_law(d, PROMPT)
    assert abs(sum(tree_law(law, 2, 2, delay=1).values()) - 1) < 1e-12
    assert all(len({r[0] for r in rows}) == 1 for rows, _ in draft_rows(law, 2, 2, delay=1))  # one shared token
    opt = tree_optimum(t, d, PROMPT, 2, 2, delay=1)
    assert opt.delay == 1
    for rule in ("kseq", "optimal", "traversal"):
        assert rule_tokens_per_call(t, d, PROMPT, 2, 2, rule, delay=1) <= opt.value + 1e-9
    # k = 1: the delayed tree is the same chain
    assert abs(tree_optimum(t, d, PROMPT, 1, 2, delay=1).value - tree_optimum(t, d, PROMPT, 1, 2).value) < 1e-9
    with pytest.raises(OtmError, match="0 <= delay < L"):
        tree_optimum(t, d, PROMPT, 2, 2, delay=2)


# -- research: wider sweeps and the DDTE comparison ----------------------------------------------


@pytest.mark.research
@pytest.mark.parametrize("scheme,rules", [("iid", IID), ("without_replacement", WOR)])
def test_delayed_exact_sweep(scheme, rules):
    """Deeper steps (V = 2, T = 4: depth 3, delay 1 and 2), V = 3 with k = 3, and the static step at depth 3."""
    for rule in rules:
        for V, k, L, delay, T, seeds in [(2, 2, 3, 1, 4, (0, 1)), (2, 2, 3, 2, 4, (4, 5)), (3, 3, 2, 1, 3, (8, 9))]:
            assert _error(rule, scheme, V=V, k=k, L=L, delay=delay, T=T, seeds=seeds) < 1e-12, (rule, V, k, L, delay)
        assert _error(rule, scheme, V=2, L=3, delay=1, T=4, seeds=(0, 1), static=True) < 1e-12, rule


DDTE_CASES = [(2, 2, 1), (2, 3, 1), (3, 2, 1), (3, 3, 1), (2, 2, 2), (3, 2, 2)]  # V, K, L2 (L1 = 1)


def ddte_table(prompt_of=lambda V: [0, 1]):
    """Rows ``(V, K, L1, L2, delay, LP, traversal, kseq, rrs, optimal, gbv, layer)``: exact tokens per target call of
    the
    decoder's first step on toy LMs (seeds 0 / 1), delay 1 against delay 0 (the same K and total depth L)."""
    rows = []
    for V, K, L2 in DDTE_CASES:
        t, d = ToyLM(V, seed=0), ToyLM(V, seed=1)
        L = 1 + L2
        for delay in (1, 0):
            values = [tree_optimum(t, d, prompt_of(V), K, L, delay=delay).value]
            values += [rule_tokens_per_call(t, d, prompt_of(V), K, L, r, delay=delay)
                       for r in ("traversal", "kseq", "rrs", "optimal", "gbv", "layer")]
            rows.append((V, K, 1, L2, delay, *values))
    return rows


@pytest.mark.research
def test_ddte_claim_table():
    """DDTE's claim "traversal beats every OT-based verifier under matched settings", on toy one-step cases
    (the table in the delayed-trees doc): it beats rrs (SpecInfer) on all 12 rows, but kseq (SpecTr) beats it on
    9 of 12 (all 6 root trees, the 3 delayed V = 2 trees) and optimal level by level on 11 of 12 (all but
    V = 3, K = 2, L2 = 2 delayed); every rule stays at or below the LP."""
    rows = ddte_table()
    for row in rows:
        assert max(row[6:]) <= row[5] + 1e-9  # no rule above the LP
    trav, kseq, rrs, opt = (lambda r: r[6]), (lambda r: r[7]), (lambda r: r[8]), (lambda r: r[9])
    assert all(trav(r) > rrs(r) for r in rows)
    assert sum(kseq(r) > trav(r) + 1e-6 for r in rows) == 9
    assert sum(opt(r) > trav(r) + 1e-6 for r in rows) == 11


# -- real transformers models: caches, CLI -------------------------------------------------------


def _tiny_llama(seed: int, V: int = 6):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.5,
                      attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def test_delayed_trees_run_on_transformers_caches():
    """A DynamicCache (batch 1 for the shared path, repeat-interleaved at the branch, one row kept after), the
    refeed rollback and the static slot cache give the same tokens for the same seed (the same laws and draws)."""
    target, draft = _tiny_llama(20), _tiny_llama(21)

    def run(delay, **options):
        return speculative_decode(target, draft, [2, 3, 4], k=3, length=4, delay=delay, verifier="traversal",
                                  max_new_tokens=12, seed=5, **options).tokens

    for delay in (1, 3):
        eager = run(delay)
        assert len(eager) == 12 and run(delay, static=True) == eager
        if delay == 1:
            assert run(delay, target_rollback="refeed") == eager


def test_cli_decode_and_bench_take_a_delay(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from otm.cli import main

    vocab = {"[UNK]": 0, "<eos>": 1, "a": 2, "b": 3, "c": 4, "d": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    paths = []
    for name, seed in (("target", 20), ("draft", 21)):
        _tiny_llama(seed).save_pretrained(tmp_path / name)
        paths.append(str(tmp_path / name))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>").save_pretrained(paths[0])
    opts = ["--target", paths[0], "--draft", paths[1], "--no-progress", "--max-new-tokens", "6"]
    assert main(["decode", "--prompt", "a b c", "-k", "3", "--length", "3", "--delay", "1", "--verifier", "optimal",
                 *opts]) == 0
    assert "optimal iid k=3 L=3 delay=1" in capsys.readouterr().err
    assert main(["decode", "--prompt", "a b", "-k", "2", "--length", "2", "--delay", "2", *opts]) == 2
    assert "0 <= delay < length" in capsys.readouterr().err
    assert main(["bench-decode", "--k", "2", "--length", "1,3", "--delay", "1", "--verifiers", "traversal",
                 "--prompts", "1", "--no-hf", *opts]) == 0
    out = capsys.readouterr().out
    assert "traversal k=2 L=3 delay=1" in out and "traversal k=2 L=1" not in out


@pytest.mark.research
def test_delayed_trees_with_a_feature_draft_are_exact():
    """The feature-draft path (EAGLE-style: the shared path's features guessed at batch 1, expanded at the branch)."""
    from strategies import float64_feature_pair

    target, draft = float64_feature_pair()
    for rule, delay in (("kseq", 1), ("traversal", 2)):
        law = exact_decode_law(target, draft, [1, 2], max_new_tokens=4, k=2, length=3, delay=delay, verifier=rule)
        assert law_error(law, target_law(model_law(target, [1, 2]), 4)) < 1e-12, rule


def test_bench_cost_model_counts_the_delayed_tree():
    """A delayed step: a target call on 1 + L1 + k L2 positions, 1 + L1 draft calls at batch 1, L2 - 1 at batch k."""
    from otm.decode.bench import Costs, contenders

    c = Costs({1: 10.0, 6: 16.0, 9: 19.0, 13: 23.0}, {1: 1.0, 4: 2.0}, 100)
    assert c.step_ms(4, 3) == 23.0 + 1.0 + 2 * 2.0  # 1 + 4 * 3 = 13 positions
    assert c.step_ms(4, 3, delay=1) == 20.0 + 2 * 1.0 + 1 * 2.0  # 1 + 1 + 4 * 2 = 10 positions: 20 (interpolated)
    assert c.step_ms(4, 2, delay=1) == 16.0 + 2 * 1.0  # 1 + 1 + 4 = 6 positions, no batch-k call
    names = [r.name for r in contenders([1, 2], [1, 3], ["kseq"], hf=False, delay=1)]
    assert "kseq k=2 L=3 delay=1" in names and not any(n.startswith("kseq k=2 L=1") for n in names)
