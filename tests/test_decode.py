"""Tests of otm.decode: tree mask, exact sequence law end to end, transformers' sampler, bad input.

Statistical tests draw N decoder runs of T = 3 new tokens from a fixed prompt and compare the
counts of the T-token continuations with the target's exact law (enumerated) by
``otm.testing.chi2_gof`` at alpha = 1e-3. Their power is computed exactly, against the exact law
of a broken decoder (``otm.decode.exact.decoder_law`` with the broken rule), and asserted; the
broken decoder itself is run through the same test as a negative control and must be rejected.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import otm.torch as ot
from otm.decode import DraftTree, Sampling, autoregressive_decode, next_token_laws, speculative_decode, tree_inputs
from otm.decode.exact import as_vectors, decoder_law, target_law
from otm.laws import OtmError
from otm.testing import chi2_gof, chi2_power
from otm.verifiers import kseq, rrs, rrs_without_replacement, speculative

ALPHA = 1e-3
MIN_POWER = 0.99


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and leaves the other core to the other xdist worker."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# -- models -------------------------------------------------------------------------------


class ToyLM(torch.nn.Module):
    """A toy causal LM with the transformers interface the decoder uses (cache, 4D mask, positions).

    The logits of a query are ``table[token, previous, position % 2]``: ``previous`` is the
    token the query attends to at the largest position before its own (``V`` for none), so the
    model depends on the prefix through the attention mask and the positions exactly as a
    transformer does: a mask that lets a node see a cousin, or a wrong position, changes its law.
    The cache stores (token, position) pairs in a ``DynamicCache`` (crop, batch_repeat_interleave,
    batch_select_indices work as for a real model).
    """

    def __init__(self, V: int, seed: int, scale: float = 1.5):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(V, V + 1, 2, V, generator=g) * scale, requires_grad=False)
        self.config = SimpleNamespace(vocab_size=V)
        self.V = V

    def forward(self, input_ids, position_ids=None, attention_mask=None, past_key_values=None, use_cache=True):
        b, q = input_ids.shape
        cache = DynamicCache() if past_key_values is None else past_key_values
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = (past + torch.arange(q))[None].expand(b, q)
        new = torch.stack([input_ids, position_ids], -1).to(torch.float32)[:, None]  # [b, 1, q, 2]
        keys, _ = cache.update(new, new, 0)  # [b, 1, S, 2]
        tok, pos = keys[:, 0, :, 0].long(), keys[:, 0, :, 1].long()  # [b, S]
        S = tok.shape[1]
        if attention_mask is None:
            allowed = torch.arange(S)[None, None, :] <= (past + torch.arange(q))[None, :, None]  # [1, q, S]
        else:
            allowed = attention_mask[:, 0] == 0  # [b or 1, q, S]
        before = allowed & (pos[:, None, :] < position_ids[:, :, None])  # [b, q, S]
        score = torch.where(before, pos[:, None, :], torch.full_like(before, -1, dtype=torch.long))  # [b, q, S]
        best = score.argmax(-1)  # [b, q]
        prev = torch.where(score.amax(-1) >= 0, tok.gather(1, best), torch.full_like(best, self.V))  # [b, q]
        logits = self.table[input_ids, prev, position_ids % 2]  # [b, q, V]
        return SimpleNamespace(logits=logits, past_key_values=cache)


def tiny_llama(seed: int, V: int = 6, scale: float = 0.02, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=scale, attn_implementation=attn,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # no EOS: generate() runs max_new_tokens
    )
    return LlamaForCausalLM(cfg).eval()


def model_law(model, prompt, sampling: Sampling):
    """prefix -> the model's processed next-token law after prompt + prefix (plain forward, float64)."""
    memo = {}

    def law(prefix: tuple) -> np.ndarray:
        if prefix not in memo:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([list(prompt) + list(prefix)])).logits[:, -1]
            memo[prefix] = next_token_laws(logits, sampling, dtype=torch.float64)[0].numpy()
        return memo[prefix]

    return law


def run_counts(target, draft, prompt, n, *, T=3, seed=0, **kw) -> Counter:
    gen = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(n):
        if draft is None:
            out = autoregressive_decode(target, prompt, max_new_tokens=T, generator=gen, **kw)
        else:
            out = speculative_decode(target, draft, prompt, max_new_tokens=T, generator=gen, **kw)
        counts[tuple(out.tokens)] += 1
    return counts


def gof(counts: Counter, law: dict):
    cells = sorted(set(law) | set(counts))
    return chi2_gof([counts.get(c, 0) for c in cells], [law.get(c, 0.0) for c in cells], alpha=ALPHA)


# -- broken rules (negative controls) ------------------------------------------------------


def naive_law(p, q, drafts):
    """Exact law of the broken rule: single-draft tests on each draft in turn, then norm((p - q)_+).

    Invalid for k >= 2 (``reference/theory.md`` §2.1: "Running single-draft acceptance independently
    on each of the k drafts is NOT valid").
    """
    out, left = np.zeros_like(p), 1.0
    for x in drafts:
        a = min(1.0, p[x] / q[x])
        out[x] += left * a
        left *= 1 - a
    r = np.maximum(p - q, 0)
    out += left * (r / r.sum() if r.sum() > 0 else p)
    return out


def naive_torch(target, draft, drafts, *, generator=None, validate=True, uniforms=None):
    """The same broken rule with the torch verifier signature (batch 1)."""
    p, q = target[0].double(), draft[0].double()
    u = torch.rand(drafts.shape[1] + 1, dtype=torch.float64, generator=generator)
    for i, x in enumerate(drafts[0].tolist()):
        if u[i] * q[x] < p[x]:
            return ot.Verified(torch.tensor([x]), torch.tensor([i]))
    r = (p - q).clamp_min(0)
    r = r if r.sum() > 0 else p
    y = int(torch.searchsorted(r.cumsum(0) / r.sum(), u[-1:], right=True).clamp_max(p.numel() - 1))
    return ot.Verified(torch.tensor([y]), torch.tensor([ot.NOT_ACCEPTED]))


# -- (a) tree mask ---------------------------------------------------------------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_equals_plain_forward_of_each_branch(attn):
    """One tree forward (4D additive mask, position_ids, a cache) gives every node the logits of
    a plain forward of its own branch, to 1e-5 (transformers 5 takes a 4D mask as is)."""
    model = tiny_llama(0, V=7, scale=0.5, attn=attn)
    prompt = [1, 5, 0, 6, 2]
    trees = [
        DraftTree.from_rows([[3, 1, 2], [3, 2, 2], [4, 1, 5], [3, 1, 0]], root_token=2),  # shared prefixes
        DraftTree.from_rows([[3, 3], [3, 3]], root_token=2),  # duplicate rows
        DraftTree.from_rows([[6, 0, 1, 2]], root_token=2),  # a chain
        DraftTree.root_only(2),
    ]
    for past in (0, 2):
        pending = prompt[past:]
        assert pending[-1] == 2
        for tree in trees:
            with torch.inference_mode():
                cache = model(input_ids=torch.tensor([prompt[:past]]), use_cache=True).past_key_values if past else None
                ids, pos, mask = tree_inputs(tree, pending, past, dtype=torch.float32, device="cpu")
                assert mask.shape == (1, 1, ids.shape[1], past + ids.shape[1])
                out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True)
                tree_logits = out.logits[0, len(pending) - 1 :]  # [N, V]
                for node in range(tree.size):
                    branch, m = [], node
                    while m > 0:
                        branch.append(int(tree.tokens[m]))
                        m = int(tree.parent[m])
                    plain = model(input_ids=torch.tensor([prompt + branch[::-1]])).logits[0, -1]
                    torch.testing.assert_close(tree_logits[node], plain, atol=1e-5, rtol=0)


def test_toy_model_reads_the_tree_like_a_transformer():
    """The toy model used below obeys the same contract (else the law tests would prove less)."""
    model = ToyLM(5, seed=3)
    prompt = [1, 4, 2]
    tree = DraftTree.from_rows([[3, 1], [3, 2], [4, 1]], root_token=2)
    with torch.inference_mode():
        cache = model(input_ids=torch.tensor([prompt[:1]])).past_key_values
        ids, pos, mask = tree_inputs(tree, prompt[1:], 1, dtype=torch.float32, device="cpu")
        logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache).logits[0, 1:]
        for node in range(1, tree.size):
            branch = [int(tree.tokens[node])] + ([int(tree.tokens[tree.parent[node]])] if tree.depth[node] == 2 else [])
            plain = model(input_ids=torch.tensor([prompt + branch[::-1]])).logits[0, -1]
            assert torch.equal(logits[node], plain)


# -- (b) exact law ------------------------------------------------------------------------------

V, T, K, L = 4, 3, 3, 2
PROMPT = [0, 2]
SAMPLING = Sampling(temperature=0.9, top_k=3)  # zero-probability tokens in both laws
TARGET, DRAFT = ToyLM(V, seed=11), ToyLM(V, seed=12)
N = 1500  # runs per sequence-law test
N_CONTROL = 1000  # runs per negative control


def exact_laws(sampling=SAMPLING, eos=None):
    t, d = model_law(TARGET, PROMPT, sampling), model_law(DRAFT, PROMPT, sampling)
    return t, d, target_law(t, T, eos=eos)


def test_exact_decoder_law_equals_target_law_for_every_valid_rule():
    """Theorem 2 by enumeration: the decoder's steps with each valid rule give the target's T-token
    law to 1e-12 (otm.decode.exact follows the decoder's walk); the broken rules do not."""
    t, d, law = exact_laws()
    cases = [
        (kseq.law, "iid", K), (rrs.law, "iid", K), (speculative.law, "iid", 1),
        (rrs_without_replacement.law, "without_replacement", K), (rrs_without_replacement.law, "without_replacement", V),
    ]
    for rule, scheme, k in cases:
        for length in (1, 2, 3):
            _, a, b = as_vectors(law, decoder_law(t, d, T=T, k=k, length=length, rule=rule, scheme=scheme))
            assert np.abs(a - b).max() < 1e-12, (rule.__module__, scheme, k, length)
    for rule, scheme in ((naive_law, "iid"), (rrs.law, "without_replacement")):
        _, a, b = as_vectors(law, decoder_law(t, d, T=T, k=K, length=L, rule=rule, scheme=scheme))
        assert np.abs(a - b).max() > 1e-2


def _power(rule, scheme, n=N):
    t, d, law = exact_laws()
    _, p0, p1 = as_vectors(law, decoder_law(t, d, T=T, k=K, length=L, rule=rule, scheme=scheme))
    return chi2_power(n, p0, p1, alpha=ALPHA)


@pytest.mark.slow
@pytest.mark.parametrize(
    "verifier,scheme,k",
    [
        ("kseq", "iid", K), ("rrs", "iid", K), ("speculative", "iid", 1), ("rrs_without_replacement", "without_replacement", K),
        ("rrs_without_replacement", "without_replacement", V),  # k = 4 > the 3 tokens top-k leaves: k cut to 3
    ],
)
def test_sequence_law_of_decoder_is_target_law(verifier, scheme, k):
    """N = 1500 runs of T = 3 tokens (V = 4, k = 3, L = 2, temperature 0.9, top-k 3) against the
    exact target law (27 cells), chi-square at alpha = 1e-3. Power against the naive rule (iid
    schemes; total variation 0.35 from the target) or against RRS with replacement on drafts drawn
    without replacement (TV 0.17): asserted >= 0.99, computed exactly from the broken decoders'
    exact laws (1 - 1e-12 or closer for both at this N)."""
    broken = naive_law if scheme == "iid" else rrs.law
    assert _power(broken, scheme) >= MIN_POWER
    _, _, law = exact_laws()
    counts = run_counts(TARGET, DRAFT, PROMPT, N, k=k, length=L, verifier=verifier, scheme=scheme, sampling=SAMPLING, seed=1)
    result = gof(counts, law)
    assert not result.reject, str(result)


@pytest.mark.slow
@pytest.mark.parametrize("rule,scheme", [(naive_torch, "iid"), (ot.rrs, "without_replacement")])
def test_negative_control_broken_rule_is_rejected(rule, scheme):
    """The same test (N = 1000, alpha = 1e-3; exact power >= 0.99, asserted) rejects the naive rule
    on iid drafts and RRS with replacement on drafts drawn without replacement."""
    assert _power(naive_law if scheme == "iid" else rrs.law, scheme, N_CONTROL) >= MIN_POWER
    _, _, law = exact_laws()
    counts = run_counts(TARGET, DRAFT, PROMPT, N_CONTROL, k=K, length=L, verifier=rule, scheme=scheme, sampling=SAMPLING, seed=2)
    result = gof(counts, law)
    assert result.reject, str(result)


@pytest.mark.slow
def test_autoregressive_baseline_and_eos_law():
    """Autoregressive baseline and a K-SEQ run that stops at EOS (token 3), top-p 0.8: sequences of
    length <= 3 against the exact law with EOS absorbing; N = 1000 each, alpha = 1e-3; power of the
    EOS test against the naive rule >= 0.99 (exact, asserted)."""
    sampling = Sampling(temperature=1.0, top_p=0.8)
    t, d, law = exact_laws(sampling, eos=3)
    _, p0, p1 = as_vectors(law, decoder_law(t, d, T=T, k=K, length=L, rule=naive_law, eos=3))
    assert chi2_power(1000, p0, p1, alpha=ALPHA) >= MIN_POWER
    counts = run_counts(TARGET, DRAFT, PROMPT, 1000, k=K, length=L, verifier="kseq", sampling=sampling, eos_token_id=3, seed=3)
    assert any(len(c) < T for c in counts)
    result = gof(counts, law)
    assert not result.reject, str(result)
    _, _, law = exact_laws()
    result = gof(run_counts(TARGET, None, PROMPT, 1000, sampling=SAMPLING, seed=4), law)
    assert not result.reject, str(result)


# -- rollback and baselines --------------------------------------------------------------------


@pytest.mark.parametrize("rollback", ["gather", "refeed"])
def test_draft_equal_to_target_accepts_everything(rollback):
    """With the draft = the target, every draft is accepted (p = q) iff both caches are rolled back
    right: block efficiency L + 1 on every step but the cut last one."""
    model = tiny_llama(1, V=6, scale=0.5)
    for verifier, scheme in (("kseq", "iid"), ("rrs", "iid"), ("rrs_without_replacement", "without_replacement")):
        out = speculative_decode(model, model, [1, 2, 3], k=3, length=3, verifier=verifier, scheme=scheme,
                                 max_new_tokens=41, seed=0, target_rollback=rollback)
        s = out.stats
        assert s.new_tokens == 41 and s.target_calls == 11 and s.draft_calls == 30, s.summary()
        assert s.acceptance_by_depth == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("rollback", ["gather", "refeed"])
def test_greedy_decode_matches_transformers_greedy(rollback):
    """Temperature 0: the output is the target's greedy continuation whatever the draft (40 tokens,
    many rejections), equal to transformers' greedy generate, with either target rollback."""
    target, draft = tiny_llama(2, V=6, scale=0.6), tiny_llama(3, V=6, scale=0.6)
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        ref = target.generate(prompt, do_sample=False, max_new_tokens=40, pad_token_id=0)[0, 4:].tolist()
    for k, length in ((1, 4), (3, 2), (4, 5)):
        out = speculative_decode(target, draft, prompt, k=k, length=length, sampling=Sampling(temperature=0),
                                 max_new_tokens=40, seed=0, target_rollback=rollback)
        assert out.tokens == ref
        assert out.stats.block_efficiency > 1
    assert autoregressive_decode(target, prompt, sampling=Sampling(temperature=0), max_new_tokens=40).tokens == ref


# -- (c) transformers' sampler ------------------------------------------------------------------------


def _two_sample(c1: Counter, c2: Counter):
    cells = sorted(set(c1) | set(c2))
    table = np.array([[c1.get(c, 0) for c in cells], [c2.get(c, 0) for c in cells]], dtype=float)
    big = table.sum(0) >= 10  # pool sparse cells
    pooled = np.column_stack([table[:, big], table[:, ~big].sum(1, keepdims=True)]) if (~big).any() else table
    pooled = pooled[:, pooled.sum(0) > 0]
    return stats.chi2_contingency(pooled, correction=False)


@pytest.mark.slow
def test_same_law_as_transformers_generate():
    """Two-sample chi-square (alpha = 1e-3) of the first T = 2 tokens: K-SEQ (k = 3, L = 2) on a tiny
    Llama pair against transformers' ``generate(do_sample=True)`` from the same target, 1000 runs
    each (top-k 4 of V = 6, temperature 0.8). Both are also tested against the exact law."""
    target, draft = tiny_llama(4, V=6, scale=0.4), tiny_llama(5, V=6, scale=0.4)
    prompt, sampling, n, t_len = [1, 2, 3], Sampling(temperature=0.8, top_k=4), 1000, 2
    torch.manual_seed(7)
    with torch.inference_mode():
        hf = target.generate(torch.tensor([prompt]), do_sample=True, temperature=0.8, top_k=4, top_p=1.0,
                             max_new_tokens=t_len, num_return_sequences=n, pad_token_id=0)
    ours = run_counts(target, draft, prompt, n, T=t_len, k=3, length=2, verifier="kseq", sampling=sampling, seed=8)
    theirs = Counter(tuple(r) for r in hf[:, len(prompt):].tolist())
    assert _two_sample(ours, theirs).pvalue > ALPHA
    law = target_law(model_law(target, prompt, sampling), t_len)
    for counts in (ours, theirs):
        result = gof(counts, law)
        assert not result.reject, str(result)


# -- (d) bad input -------------------------------------------------------------------------------------


def test_bad_input_one_line_errors():
    target, draft = ToyLM(4, seed=1), ToyLM(4, seed=2)
    other = ToyLM(5, seed=3)
    cases = [
        dict(k=0), dict(length=0), dict(k=2.5), dict(max_new_tokens=0), dict(verifier="spechub"),
        dict(verifier="rrs_without_replacement"), dict(scheme="greedy"), dict(verifier="speculative", k=2),
        dict(scheme="without_replacement", verifier="kseq"), dict(target_rollback="rewind"),
    ]
    for kw in cases:
        with pytest.raises(OtmError) as err:
            speculative_decode(target, draft, [1, 2], **kw)
        assert "\n" not in str(err.value)
    for prompt in ([], torch.tensor([[1, 2], [2, 3]]), [7]):
        with pytest.raises(OtmError):
            speculative_decode(target, draft, prompt)
    with pytest.raises(OtmError, match="vocabulary"):
        speculative_decode(target, other, [1, 2])
    for bad in (dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(OtmError):
            Sampling(**bad)
    with pytest.raises(OtmError):
        autoregressive_decode(target, [])


def test_processed_laws_match_transformers_warpers():
    """temperature -> top-k -> top-p as transformers' warpers; removed tokens get exactly 0."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=g) * 3
    for t, k, p in ((1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.8), (0.5, 20, 0.9)):
        x = TemperatureLogitsWarper(t)(None, logits.clone())
        if k:
            x = TopKLogitsWarper(k)(None, x)
        if p < 1:
            x = TopPLogitsWarper(p)(None, x)
        ref = torch.softmax(x, -1)
        ours = next_token_laws(logits, Sampling(temperature=t, top_k=k, top_p=p))
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
        assert torch.equal(ours == 0, ref == 0)


# -- CLI -------------------------------------------------------------------------------------------


def _save_pair(root, *, draft_vocab: int = 6):
    """A tiny target/draft pair with a word-level tokenizer, saved as Hugging Face directories."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1, "a": 2, "b": 3, "c": 4, "d": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    paths = []
    for name, seed, v in (("target", 20, 6), ("draft", 21, draft_vocab)):
        model = tiny_llama(seed, V=v, scale=0.5)
        path = root / name
        model.save_pretrained(path)
        if name == "target":
            tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths


def test_cli_decode_and_bench_on_tiny_models(tmp_path, capsys):
    from otm.cli import main

    target, draft = _save_pair(tmp_path)
    models = ["--target", target, "--draft", draft, "--no-progress", "--max-new-tokens", "6"]
    assert main(["decode", "--prompt", "a b c", "-k", "3", "--length", "2", "--verifier", "kseq", *models]) == 0
    out = capsys.readouterr().out
    assert "kseq iid k=3 L=2" in out and "block efficiency" in out
    assert main(["decode", "--prompt", "a b", "--verifier", "rrs_without_replacement", "-k", "2", *models]) == 0
    assert "rrs_without_replacement without_replacement" in capsys.readouterr().out
    assert main(["decode", "--prompt", "a b", "--autoregressive", *models]) == 0
    assert "autoregressive" in capsys.readouterr().out
    assert main(["bench-decode", "--k", "1,2", "--length", "2", "--verifiers", "kseq,rrs_without_replacement",
                 "--prompts", "2", *models]) == 0
    out = capsys.readouterr().out
    for row in ("autoregressive", "hf assisted", "speculative k=1 L=2", "kseq k=2 L=2", "rrs_without_replacement k=2 L=2",
                "machine:", "load average"):
        assert row in out, row


def test_cli_bad_input_one_line(tmp_path, capsys):
    from otm.cli import main

    target, draft = _save_pair(tmp_path / "ok")
    _, other = _save_pair(tmp_path / "mismatch", draft_vocab=7)
    cases = [
        ["decode", "--prompt", "a", "--target", str(tmp_path / "nowhere"), "--draft", draft],
        ["decode", "--prompt", "a", "--target", target, "--draft", other],
        ["decode", "--prompt", "a", "-k", "0", "--target", target, "--draft", draft],
        ["decode", "--prompt", "a", "--length", "0", "--target", target, "--draft", draft],
        ["decode", "--prompt", "  ", "--target", target, "--draft", draft],
        ["decode", "--prompt", "a", "--verifier", "speculative", "-k", "2", "--target", target, "--draft", draft],
        ["bench-decode", "--k", "0,2", "--target", target, "--draft", draft],
        ["bench-decode", "--length", "x", "--target", target, "--draft", draft],
        ["bench-decode", "--verifiers", "nope", "--target", target, "--draft", draft],
    ]
    capsys.readouterr()
    for argv in cases:
        assert main(argv) == 2, argv
        lines = [line for line in capsys.readouterr().err.splitlines() if "otm: error:" in line]
        assert len(lines) == 1 and lines[0].startswith("otm: error:"), (argv, lines)


# -- the embedded models (`make test-models`) ---------------------------------------------------------


@pytest.mark.model
def test_real_target_tree_mask_and_rollback():
    """SmolLM2-135M-Instruct (fp32): tree logits equal plain forwards of each branch (1e-4), and with
    the target as its own draft every draft is accepted (both caches rolled back right)."""
    from otm.models import default_target_path, load_pair

    target, _, tokenizer = load_pair(None, default_target_path())
    prompt = tokenizer("The sky is blue because")["input_ids"]
    tree = DraftTree.from_rows([[578, 4191, 281], [578, 4191, 47], [1001, 12, 12]], root_token=prompt[-1])
    with torch.inference_mode():
        cache = target(input_ids=torch.tensor([prompt[:-2]]), use_cache=True).past_key_values
        ids, pos, mask = tree_inputs(tree, prompt[-2:], len(prompt) - 2, dtype=torch.float32, device="cpu")
        logits = target(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache).logits[0, 1:]
        for node in range(tree.size):
            branch, m = [], node
            while m > 0:
                branch.append(int(tree.tokens[m]))
                m = int(tree.parent[m])
            plain = target(input_ids=torch.tensor([prompt + branch[::-1]])).logits[0, -1]
            torch.testing.assert_close(logits[node], plain, atol=1e-4, rtol=0)
    out = speculative_decode(target, target, prompt, k=2, length=3, max_new_tokens=25, seed=0)
    assert out.stats.target_calls == 7 and min(out.stats.acceptance_by_depth) == 1.0, out.stats.summary()
