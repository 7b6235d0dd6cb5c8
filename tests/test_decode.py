"""Tests of otm.decode: tree mask, exact sequence law end to end, transformers' sampler, bad input.

Exact tests run the REAL decoder in its exact mode (``otm.decode.exact_mode.exact_decode``: every
random choice through the decoder's one door, enumerated) and compare the law of the first T
tokens with the target's own law (plain enumeration of its processed laws) to 1e-12.

Statistical tests draw N decoder runs of T = 3 new tokens from a fixed prompt and compare the
counts of the T-token continuations with the target's exact law by ``otm.testing.chi2_gof`` at
alpha = 1e-3. Their power is computed exactly against a realistic planted decoder bug (the law of
row 0 given to the verifier at every node, TV 0.03-0.15 here; ``otm.certify.decoder_mutants``),
whose exact law comes from the exact mode of the broken decoder, and asserted; the broken decoder
itself runs through the same test as a negative control and must be rejected.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM

import otm.torch as ot
from otm.decode import DraftTree, Sampling, autoregressive_decode, speculative_decode, tree_inputs
from otm.certify.decoder_mutants import DECODER_MUTANTS
from otm.decode.exact_mode import as_vectors, exact_decode_law, law_error, target_law
from otm.decode.toy import ToyLM, model_law
from otm.laws import OtmError
from otm.testing import chi2_gof, chi2_power
from otm.verifiers import rrs

ALPHA = 1e-3
MIN_POWER = 0.99


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# -- models -------------------------------------------------------------------------------


def tiny_llama(seed: int, V: int = 6, scale: float = 0.02, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=scale, attn_implementation=attn,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # no EOS: generate() runs max_new_tokens
    )
    return LlamaForCausalLM(cfg).eval()


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

    Invalid for k >= 2: running single-draft acceptance independently on each of the k drafts does
    not give the target law (SpecTr, Sun et al. 2023, section 3; docs/theory.md section 3).
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


naive_torch.law = naive_law  # its exact law, for the decoder's exact mode


def rrs_torch_on_distinct(target, draft, drafts, *, generator=None, validate=True, uniforms=None):
    """RRS with replacement run on drafts drawn without replacement (invalid there), with its exact law."""
    return ot.rrs(target, draft, drafts, generator=generator, validate=validate, uniforms=uniforms)


rrs_torch_on_distinct.law = rrs.law


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


# -- (b) exact law, by the decoder's own code ----------------------------------------------------------

EXACT_SAMPLING = Sampling(temperature=0.9, top_k=2)  # V = 3: every law has a zero
EX_TARGET, EX_DRAFT, EX_PROMPT, EX_T = ToyLM(3, seed=11), ToyLM(3, seed=12), [0, 2], 3
VALID = [("kseq", "iid", 2), ("kseq", "iid", 3), ("rrs", "iid", 2), ("rrs", "iid", 3), ("speculative", "iid", 1),
         ("rrs_without_replacement", "without_replacement", 2),
         ("rrs_without_replacement", "without_replacement", 3)]  # k = 3 > the 2 tokens top-k leaves: k cut to 2


def ex_reference(sampling=EXACT_SAMPLING, eos=None, target=EX_TARGET, prompt=EX_PROMPT):
    return target_law(model_law(target, prompt, sampling), EX_T, eos=eos)


@pytest.mark.parametrize("verifier,scheme,k", VALID)
@pytest.mark.parametrize("rollback", ["gather", "refeed"])
def test_exact_mode_of_the_real_decoder_gives_the_target_law(verifier, scheme, k, rollback):
    """Theorem 2 by the decoder's own code: every run of speculative_decode enumerated (draft tokens,
    verification outcomes from the verifier's exact law, bonus tokens); the law of the first T = 3
    tokens equals the target's to 1e-12 for L = 1, 2, 3 (L cut to T - 1 near the end)."""
    reference = ex_reference()
    for length in (1, 2, 3):
        law = exact_decode_law(EX_TARGET, EX_DRAFT, EX_PROMPT, max_new_tokens=EX_T, k=k, length=length,
                               verifier=verifier, scheme=scheme, sampling=EXACT_SAMPLING, target_rollback=rollback)
        assert law_error(law, reference) < 1e-12, (verifier, scheme, k, length, rollback)
        assert abs(sum(law.values()) - 1) < 1e-12


def test_exact_mode_eos_top_p_and_autoregressive():
    """EOS (token 1) ends a sequence early; top-p 0.8; the autoregressive baseline through the same door."""
    sampling = Sampling(temperature=1.0, top_p=0.8)
    reference = ex_reference(sampling, eos=1)
    assert any(len(c) < EX_T for c in reference)
    law = exact_decode_law(EX_TARGET, EX_DRAFT, EX_PROMPT, max_new_tokens=EX_T, k=2, length=2, verifier="kseq",
                           sampling=sampling, eos_token_id=1)
    assert law_error(law, reference) < 1e-12
    law = exact_decode_law(EX_TARGET, None, EX_PROMPT, max_new_tokens=EX_T, sampling=EXACT_SAMPLING)
    assert law_error(law, ex_reference()) < 1e-12


def test_exact_mode_catches_broken_rules_and_every_planted_decoder_bug():
    """The naive rule, RRS with replacement on distinct drafts, and each decoder mutant of the catalogue
    (wrong row law, raw draft law, stale target cache, refeed without truncation, bonus from the parent,
    positions off by one) change the exact law; the one mutant that only lowers acceptance does not."""
    from otm.certify.decoder_mutants import NOT_EXACTNESS_BUGS, exact_tv

    reference = ex_reference()
    law = exact_decode_law(EX_TARGET, EX_DRAFT, EX_PROMPT, max_new_tokens=EX_T, k=2, length=2, verifier=naive_torch,
                           sampling=EXACT_SAMPLING)
    assert law_error(law, reference) > 1e-3
    full = Sampling(temperature=0.9)  # three tokens of positive mass: two distinct drafts are not all of them
    law = exact_decode_law(EX_TARGET, EX_DRAFT, EX_PROMPT, max_new_tokens=2, k=2, length=1,
                           verifier=rrs_torch_on_distinct, scheme="without_replacement", sampling=full)
    assert law_error(law, target_law(model_law(EX_TARGET, EX_PROMPT, full), 2)) > 1e-3
    for mutant in DECODER_MUTANTS.values():
        assert exact_tv(mutant) > 1e-3, mutant.name
    for mutant in NOT_EXACTNESS_BUGS.values():
        assert exact_tv(mutant) < 1e-12, mutant.name


def test_exact_mode_refuses_what_it_cannot_enumerate():
    from otm.decode.exact_mode import exact_decode

    def opaque(target, draft, drafts, *, generator=None, validate=True):
        return ot.kseq(target, draft, drafts, generator=generator, validate=validate)

    for kwargs, words in ((dict(verifier=opaque), "exact law"), (dict(seed=0), "do not pass"),
                          (dict(law_dtype=torch.float32), "float64"), (dict(max_runs=10), "max_runs")):
        with pytest.raises(OtmError) as err:
            exact_decode(EX_TARGET, EX_DRAFT, EX_PROMPT, max_new_tokens=EX_T, k=2, length=2,
                         sampling=EXACT_SAMPLING, **kwargs)
        assert words in str(err.value) and "\n" not in str(err.value)


# -- (b') statistical, with power against a realistic bug --------------------------------------------

FS_SAMPLING = Sampling(temperature=0.9)  # V = 2, full support: the wrong row's law never has a zero
FS_TARGET, FS_DRAFT, FS_PROMPT, T = ToyLM(2, seed=11), ToyLM(2, seed=12), [0, 0], 3
STAT = {  # verifier, scheme, k, runs: power >= 0.99 against the wrong-row bug at these N (asserted)
    "kseq": ("iid", 3, 2000), "rrs": ("iid", 3, 3000), "rrs_without_replacement": ("without_replacement", 2, 1000),
}
L = 2


def wrong_row_law(verifier, scheme, k):
    """Exact law of the decoder with the verifier at every node given row 0's draft law."""
    with DECODER_MUTANTS["wrong_row_law"].plant():
        return exact_decode_law(FS_TARGET, FS_DRAFT, FS_PROMPT, max_new_tokens=T, k=k, length=L, verifier=verifier,
                                scheme=scheme, sampling=FS_SAMPLING)


@pytest.mark.slow
@pytest.mark.parametrize("verifier", sorted(STAT))
def test_sequence_law_of_decoder_is_target_law(verifier):
    """N runs of T = 3 tokens (V = 2, temperature 0.9, L = 2) against the target's exact law (8 cells),
    chi-square at alpha = 1e-3. Power against the wrong-row bug (TV 0.07 for K-SEQ k = 3, 0.15 for RRS
    without replacement), computed exactly from the broken decoder's exact law, asserted >= 0.99; the
    broken decoder run through the same test must be rejected (negative control)."""
    scheme, k, n = STAT[verifier]
    reference = target_law(model_law(FS_TARGET, FS_PROMPT, FS_SAMPLING), T)
    broken = wrong_row_law(verifier, scheme, k)
    _, p0, p1 = as_vectors(reference, broken)
    assert 0.01 < 0.5 * np.abs(p0 - p1).sum() < 0.2  # a realistic, small bug
    assert chi2_power(n, p0, p1, alpha=ALPHA) >= MIN_POWER
    counts = run_counts(FS_TARGET, FS_DRAFT, FS_PROMPT, n, k=k, length=L, verifier=verifier, scheme=scheme,
                        sampling=FS_SAMPLING, seed=1)
    result = gof(counts, reference)
    assert not result.reject, str(result)
    with DECODER_MUTANTS["wrong_row_law"].plant():
        control = gof(run_counts(FS_TARGET, FS_DRAFT, FS_PROMPT, n, k=k, length=L, verifier=verifier, scheme=scheme,
                                 sampling=FS_SAMPLING, seed=2), reference)
    assert control.reject, str(control)


@pytest.mark.slow
def test_autoregressive_baseline_and_eos_law():
    """Autoregressive baseline and a K-SEQ run that stops at EOS (token 1), top-p 0.8 (V = 3): sequences
    of length <= 3 against the exact law with EOS absorbing; N = 1000 each, alpha = 1e-3; power of the
    EOS test against the naive rule (its exact law from the exact mode) >= 0.99, asserted."""
    sampling = Sampling(temperature=1.0, top_p=0.8)
    reference = ex_reference(sampling, eos=1)
    naive = exact_decode_law(EX_TARGET, EX_DRAFT, EX_PROMPT, max_new_tokens=EX_T, k=3, length=2, verifier=naive_torch,
                             sampling=sampling, eos_token_id=1)
    _, p0, p1 = as_vectors(reference, naive)
    assert chi2_power(1000, p0, p1, alpha=ALPHA) >= MIN_POWER
    counts = run_counts(EX_TARGET, EX_DRAFT, EX_PROMPT, 1000, T=EX_T, k=3, length=2, verifier="kseq",
                        sampling=sampling, eos_token_id=1, seed=3)
    assert any(len(c) < EX_T for c in counts)
    result = gof(counts, reference)
    assert not result.reject, str(result)
    result = gof(run_counts(EX_TARGET, None, EX_PROMPT, 1000, T=EX_T, sampling=EXACT_SAMPLING, seed=4), ex_reference())
    assert not result.reject, str(result)
    control = gof(run_counts(EX_TARGET, EX_DRAFT, EX_PROMPT, 1000, T=EX_T, k=3, length=2, verifier=naive_torch,
                             sampling=sampling, eos_token_id=1, seed=5), reference)
    assert control.reject, str(control)


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
    """Two-sample chi-square (alpha = 1e-3) of the first T = 3 tokens: K-SEQ (k = 2, L = 2) on a tiny
    float64 Llama pair against transformers' ``generate(do_sample=True)`` from the same target, 1000 runs
    each (top-k 2 of V = 3, temperature 0.8; refeed rollback); both also tested against the exact law.
    Power of that one-sample test against a realistic decoder bug, the refeed rollback that leaves the
    rejected tree in the target cache (a stale cache: TV 0.027 here), computed exactly from the broken
    decoder's exact mode: asserted >= 0.99; the broken decoder run through the same test is rejected.
    (The prompt holds no token 0: generate() would mask it as padding.)"""
    target = tiny_llama(4, V=3, scale=0.6).to(torch.float64)
    draft = tiny_llama(5, V=3, scale=0.6).to(torch.float64)
    prompt, sampling, n, t_len = [1, 2, 2], Sampling(temperature=0.8, top_k=2), 1000, 3
    options = dict(k=2, length=2, verifier="kseq", sampling=sampling, target_rollback="refeed")
    law = target_law(model_law(target, prompt, sampling), t_len)
    mutant = DECODER_MUTANTS["refeed_without_truncate"]
    with mutant.plant():
        broken = exact_decode_law(target, draft, prompt, max_new_tokens=t_len, **options)
    _, p0, p1 = as_vectors(law, broken)
    assert 0 < 0.5 * np.abs(p0 - p1).sum() < 0.05 and chi2_power(n, p0, p1, alpha=ALPHA) >= MIN_POWER
    torch.manual_seed(7)
    with torch.inference_mode():
        hf = target.generate(torch.tensor([prompt]), do_sample=True, temperature=0.8, top_k=2, top_p=1.0,
                             max_new_tokens=t_len, num_return_sequences=n, pad_token_id=0)
    ours = run_counts(target, draft, prompt, n, T=t_len, seed=8, **options)
    theirs = Counter(tuple(r) for r in hf[:, len(prompt):].tolist())
    assert _two_sample(ours, theirs).pvalue > ALPHA
    for counts in (ours, theirs):
        result = gof(counts, law)
        assert not result.reject, str(result)
    with mutant.plant():
        control = gof(run_counts(target, draft, prompt, n, T=t_len, seed=9, **options), law)
    assert control.reject, str(control)


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
    captured = capsys.readouterr()  # not a terminal: the text on stdout, the measurements on stderr
    assert "kseq iid k=3 L=2" in captured.err and "block efficiency" in captured.err
    assert len(captured.out.split()) == 6 and "block efficiency" not in captured.out
    assert main(["decode", "--prompt", "a b", "--verifier", "rrs_without_replacement", "-k", "2", *models]) == 0
    assert "rrs_without_replacement without_replacement" in capsys.readouterr().err
    assert main(["decode", "--prompt", "a b", "--autoregressive", *models, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["method"] == "autoregressive" and len(out["tokens"]) == 6
    assert main(["bench-decode", "--k", "1,2", "--length", "2", "--verifiers", "kseq,rrs_without_replacement",
                 "--prompts", "2", *models]) == 0
    out = capsys.readouterr().out
    for row in ("autoregressive", "hf assisted", "speculative k=1 L=2", "kseq k=2 L=2", "rrs_without_replacement k=2 L=2",
                "machine:", "torch kernels", "BLAS torch", "load average", "host reads per step",
                "  kseq k=2 L=2: ", "malloc: "):
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
    from otm.decode.models import load_pair
    from otm.decode.embedded import default_target_path

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


def test_models_that_misbehave_are_named_in_one_line():
    """NaN / +inf / all -inf logits name the model at fault (with or without validation, at temperature 0
    too, where an argmax would silently pick token 0); a draft whose vocabulary is smaller than the
    target's is refused before any forward, even without config.vocab_size."""

    class Broken(ToyLM):
        def __init__(self, V, seed, value):
            super().__init__(V, seed)
            self.value = value

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = torch.full_like(out.logits, self.value)
            return out

    good = ToyLM(4, seed=1)
    for value, words in ((float("nan"), "NaN or +inf"), (float("inf"), "NaN or +inf"), (-float("inf"), "every logit is -inf")):
        for role, target, draft in (("target", Broken(4, 2, value), good), ("draft", good, Broken(4, 2, value))):
            for sampling, validate in ((Sampling(), True), (Sampling(temperature=0), False)):
                with pytest.raises(OtmError) as err:
                    speculative_decode(target, draft, [1, 2], k=2, length=2, seed=0, sampling=sampling,
                                       validate=validate, max_new_tokens=4)
                assert f"the {role} model returned" in str(err.value) and words in str(err.value)
    small = ToyLM(3, seed=3)
    small.config = type("NoVocab", (), {})()  # a config without vocab_size: the embedding tells
    small.get_input_embeddings = lambda: torch.nn.Embedding(3, 2)
    with pytest.raises(OtmError, match="vocabulary"):
        speculative_decode(good, small, [1, 2], k=2, length=2, seed=0)


def test_models_whose_attention_cannot_take_the_tree_mask_are_refused():
    for role in ("target", "draft"):
        target, draft = tiny_llama(0), tiny_llama(1)
        (target if role == "target" else draft).config._attn_implementation = "flash_attention_2"
        with pytest.raises(OtmError) as err:
            speculative_decode(target, draft, [1, 2], k=2, length=2, seed=0, max_new_tokens=3)
        assert f"the {role} model uses flash_attention_2" in str(err.value) and "\n" not in str(err.value)


def test_a_target_spread_over_cpu_and_disk_gives_the_same_tokens(tmp_path, capsys):
    """``device_map="auto"`` with a ``max_memory`` too small for the target: accelerate puts some of its layers
    on disk (meta on the model, loaded at each forward); the decoder gives the very tokens of the unsplit
    target for the same seed. The CLI takes the same through --device-map / --max-memory / --offload-folder."""
    from otm.cli import main
    from otm.decode.models import load_pair, parse_max_memory

    target, draft = _save_pair(tmp_path)
    whole, d, tok = load_pair(target, draft, dtype="float32")
    split, d2, _ = load_pair(target, draft, dtype="float32", device_map="auto", max_memory={"cpu": "12KB"},
                             offload_folder=tmp_path / "offload")
    offloaded = [n for n, p in split.named_parameters() if p.device.type == "meta"]
    assert offloaded and len(offloaded) < len(list(split.parameters()))  # spread: some on disk, some on the CPU
    from otm.decode.onednn import use_onednn

    assert use_onednn(split).count == 0  # --compile onednn leaves a target accelerate spreads alone
    for kw in (dict(k=3, length=2, verifier="kseq"), dict(k=2, length=2, verifier="traversal")):
        a = speculative_decode(whole, d, [2, 3, 4], max_new_tokens=12, seed=3, **kw).tokens
        b = speculative_decode(split, d2, [2, 3, 4], max_new_tokens=12, seed=3, **kw).tokens
        assert a == b
    models = ["--target", target, "--draft", draft, "--no-progress", "--max-new-tokens", "4", "--json", "--seed", "3"]
    assert main(["decode", "--prompt", "a b c", *models]) == 0
    plain = json.loads(capsys.readouterr().out)["tokens"]
    assert main(["decode", "--prompt", "a b c", *models, "--device-map", "auto", "--max-memory", "cpu=12KB",
                 "--offload-folder", str(tmp_path / "off2")]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == plain
    assert parse_max_memory("0=20GiB,cpu=60GiB") == {0: "20GiB", "cpu": "60GiB"}
    for bad in (["--max-memory", "cpu=1GiB"], ["--device-map", "auto", "--max-memory", "cpu"]):
        assert main(["decode", "--prompt", "a", *models, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "max-memory" in err


def test_auto_plan_chooses_from_costs_and_acceptance_and_says_when_nothing_wins(tmp_path, capsys, monkeypatch):
    """otm.decode.auto: B(L) from the warm-up's acceptance by depth; with free trees (T(n) = T(1)) the deepest,
    widest tree wins; with trees costing n T(1) and draft calls of T(1) nothing beats autoregressive sampling,
    and the line says so with the numbers. The CLI's -k auto --length auto runs and prints its line."""
    from otm.cli import main
    from otm.decode.auto import block_efficiency, levels_verified, plan
    from otm.decode.bench import Costs

    assert block_efficiency([0.5, 0.5, 0.5], 2) == 1.75 and block_efficiency([1.0, float("nan")], 2) == 2.0
    assert levels_verified([0.5, 0.5, 0.5], 3) == 1.75 and levels_verified([0.5, 0.5], 1) == 1.0
    target, draft = tiny_llama(30, V=6, scale=0.5), tiny_llama(31, V=6, scale=0.5)
    sizes = [1 + k * L for k in (1, 2, 4) for L in (1, 2, 3, 4)]
    free = Costs({n: 10.0 for n in [1] + sizes}, {1: 0.1, 2: 0.1, 4: 0.1}, 8)
    p = plan(target, draft, [2, 3, 4], ks=(1, 2, 4), lengths=(1, 2, 3, 4), costs=free, warmup_tokens=24)
    assert len(p.candidates) == 12 and p.best is not None
    assert p.best.speedup == max(c.speedup for c in p.candidates) > 1.0
    for c in p.candidates:  # each prediction is B(L) of its warm-up's acceptance over its measured step
        acc = p.acceptance[(c.verifier, c.k)]
        assert c.block_efficiency == block_efficiency(acc, c.length)
        assert c.speedup == pytest.approx(c.block_efficiency * (10.0 + p.ar_between_ms)
                                          / (free.step_ms(c.k, c.length) + c.between_ms))
        assert 0.0 < p.ar_between_ms < 1000.0
        deepest = next(d for d in p.candidates if (d.verifier, d.k, d.length) == (c.verifier, c.k, 4))
        # the time between the calls, measured at the deepest L, scaled by the levels a step verifies
        assert c.between_ms == pytest.approx(deepest.between_ms * levels_verified(acc, c.length) / levels_verified(acc, 4))
        assert 0.0 < c.between_ms < 1000.0
    assert p.line().startswith("auto: kseq k=")
    dear = Costs({n: 10.0 * n for n in [1] + sizes}, {1: 10.0, 2: 10.0, 4: 10.0}, 8)
    q = plan(target, draft, [2, 3, 4], ks=(1, 2, 4), lengths=(1, 2, 3, 4), costs=dear, warmup_tokens=24)
    assert q.best is None and "no configuration tried is predicted to beat autoregressive" in q.line()
    t_dir, d_dir = _save_pair(tmp_path)
    monkeypatch.setenv("OTM_CACHE", str(tmp_path / "cache"))  # the plan is kept there (otm.decode.auto.kept_plan)
    models = ["--target", t_dir, "--draft", d_dir, "--no-progress", "--max-new-tokens", "6", "--json"]
    assert main(["decode", "--prompt", "a b c", "-k", "auto", "--length", "auto", *models]) == 0
    captured = capsys.readouterr()
    assert [line for line in captured.err.splitlines() if line.startswith("auto: ")]
    assert len(json.loads(captured.out)["tokens"]) == 6
    assert main(["decode", "--prompt", "a", "-k", "many", *models]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "-k: must be a whole number or auto" in err


def test_auto_plan_compares_steps_by_predicted_tokens_per_second():
    """``compiles``: every (step, k, L) ranked by predicted tokens/s. A step with a faster T(1) but dearer trees
    (the GGUF's 4-bit blocks on the embedded target) wins when its best tree is faster in tokens/s though its
    ratio to its own autoregressive row is lower; where autoregressive sampling on it beats every tree, the plan
    says so and names that step to run."""
    from otm.decode.auto import plan
    from otm.decode.bench import Costs

    target, draft = tiny_llama(30, V=6, scale=0.5), tiny_llama(31, V=6, scale=0.5)
    flat = Costs({1: 20.0, 2: 20.0, 3: 20.0}, {1: 0.5}, 8)  # trees free, T(1) 20 ms
    steep = Costs({1: 10.0, 2: 10.6, 3: 11.2}, {1: 0.3}, 8)  # T(1) 10 ms, each position 0.6 ms more
    p = plan(target, draft, [2, 3, 4], ks=(1,), lengths=(1, 2), costs={"onednn": flat, "int4": steep},
             compiles=["onednn", "int4"], warmup_tokens=16)
    assert len(p.candidates) == 4 and {c.compile for c in p.candidates} == {"onednn", "int4"}
    assert [c.tokens_per_second for c in p.candidates] == sorted((c.tokens_per_second for c in p.candidates), reverse=True)
    for c in p.candidates:
        costs = flat if c.compile == "onednn" else steep
        assert c.tokens_per_second == pytest.approx(1000.0 * c.block_efficiency / (costs.step_ms(1, c.length) + c.between_ms))
        assert c.speedup == pytest.approx(c.tokens_per_second / p.ar_tokens_per_second[c.compile])
    assert p.best is not None and p.best.compile == "int4" == p.compile
    best_flat = max(c.speedup for c in p.candidates if c.compile == "onednn")
    assert p.best.speedup < best_flat  # the fastest decode is not the largest ratio
    assert "on the GGUF's 4-bit blocks" in p.line() and "autoregressive" in p.line()
    dear = Costs({1: 10.0, 2: 40.0, 3: 60.0}, {1: 5.0}, 8)  # autoregressive on this step beats every tree anywhere
    q = plan(target, draft, [2, 3, 4], ks=(1,), lengths=(1, 2), costs={"onednn": flat, "int4": dear},
             compiles=["onednn", "int4"], warmup_tokens=16)
    assert q.best is None and q.compile == "int4"
    assert "no configuration tried is predicted to beat" in q.line() and q.line().endswith("(on the GGUF's 4-bit blocks)")


def test_auto_plan_weighs_the_compiled_blocks_for_the_winning_tree_only():
    """``refine``: where the winner runs on the eager 4-bit blocks, the same tree on their compiled step is weighed
    with that step's costs (and the same acceptance and time between the calls), autoregressive sampling on it too;
    it wins when faster; no other tree is tried compiled, and nothing is added when the winner runs elsewhere."""
    from otm.decode.auto import plan
    from otm.decode.bench import Costs

    target, draft = tiny_llama(30, V=6, scale=0.5), tiny_llama(31, V=6, scale=0.5)
    flat = Costs({1: 20.0, 2: 20.0, 3: 20.0}, {1: 0.5}, 8)
    steep = Costs({1: 10.0, 2: 10.6, 3: 11.2}, {1: 0.3}, 8)
    compiled = Costs({1: 9.0, 2: 9.2, 3: 9.4}, {1: 0.3}, 8)
    common = dict(ks=(1,), lengths=(1, 2), compiles=["onednn", "int4"], warmup_tokens=16)
    p = plan(target, draft, [2, 3, 4], costs={"onednn": flat, "int4": steep, "int4-compiled": compiled},
             refine=["int4-compiled"], **common)
    extra = [c for c in p.candidates if c.compile == "int4-compiled"]
    assert len(extra) == 1 and len(p.candidates) == 5
    eager_twin = next(c for c in p.candidates if c.compile == "int4" and (c.k, c.length) == (extra[0].k, extra[0].length))
    assert eager_twin.tokens_per_second == max(c.tokens_per_second for c in p.candidates if c.compile != "int4-compiled")
    assert extra[0].block_efficiency == eager_twin.block_efficiency and extra[0].between_ms == eager_twin.between_ms
    assert extra[0].step_ms == pytest.approx(compiled.step_ms(extra[0].k, extra[0].length) + extra[0].between_ms)
    assert p.compile == "int4-compiled" == p.best.compile and "int4-compiled" in p.ar_tokens_per_second
    assert "the GGUF's 4-bit blocks compiled" in p.line()
    slow = Costs({1: 30.0, 2: 31.0, 3: 32.0}, {1: 0.3}, 8)  # compiled but slower: the eager blocks stay
    q = plan(target, draft, [2, 3, 4], costs={"onednn": flat, "int4": steep, "int4-compiled": slow},
             refine=["int4-compiled"], **common)
    assert q.compile == "int4"
    dear = Costs({1: 10.0, 2: 40.0, 3: 60.0}, {1: 5.0}, 8)  # the winner is not on the blocks: nothing compiled
    r = plan(target, draft, [2, 3, 4], costs={"onednn": flat, "int4": dear, "int4-compiled": compiled},
             refine=["int4-compiled"], ks=(1,), lengths=(1, 2), compiles=["onednn"], warmup_tokens=16)
    assert not any(c.compile == "int4-compiled" for c in r.candidates)


def test_the_steps_a_plan_weighs(monkeypatch):
    """``steps_to_weigh`` (shared by ``otm demo`` and ``otm decode -k auto``): a decided eager step, or the 4-bit blocks
    compiled ahead of time, let the plan weigh every eager step this machine has and refine the winner on the
    compiled blocks; an explicit choice, or a decided dense compiled step, is run as given, nothing refined."""
    from otm.decode import int4
    from otm.decode.auto import steps_to_weigh, weighs_eager

    target = tiny_llama(32, V=6, scale=0.5)
    monkeypatch.setattr(int4, "available", lambda model: model is target)
    for choice in ("none", "onednn", "int4", "int4-compiled"):
        steps, refine = steps_to_weigh(target, choice, True)
        assert steps[0] == "none" and steps[-1] == "int4" and refine == ["int4-compiled"] and weighs_eager(choice)
        assert steps_to_weigh(target, choice, False) == ([choice], [])
    assert steps_to_weigh(target, "default", True) == (["default"], []) and not weighs_eager("default")
    monkeypatch.setattr(int4, "available", lambda model: False)  # no 4-bit blocks: nothing to refine on
    steps, refine = steps_to_weigh(target, "none", True)
    assert "int4" not in steps and refine == []


def test_auto_plan_counts_the_verifiers_own_time():
    """A verifier that takes 20 ms a call (planted: the same rule, slowed) gets those milliseconds in its
    steps' time between the calls, and a lower predicted speed-up than the same rule at full speed."""
    import time as _time

    from otm.decode.auto import levels_verified, plan
    from otm.decode.bench import Costs
    from otm.torch import VERIFIERS as TORCH_VERIFIERS

    def slow_kseq(*args, **kwargs):
        _time.sleep(0.02)
        return TORCH_VERIFIERS["kseq"](*args, **kwargs)

    target, draft = tiny_llama(30, V=6, scale=0.5), tiny_llama(31, V=6, scale=0.5)
    costs = Costs({n: 10.0 for n in (1, 3, 5)}, {1: 0.1, 2: 0.1}, 8)
    fast = plan(target, draft, [2, 3, 4], ks=(2,), lengths=(1, 2), costs=costs, warmup_tokens=16)
    slow = plan(target, draft, [2, 3, 4], ks=(2,), lengths=(1, 2), costs=costs, warmup_tokens=16,
                verifiers=(slow_kseq,))
    for c in slow.candidates:
        assert c.between_ms >= 18.0 * levels_verified(slow.acceptance[(slow_kseq, 2)], c.length)
    by = lambda p, L: next(c for c in p.candidates if c.length == L)
    for L in (1, 2):
        assert by(fast, L).between_ms < 10.0 < by(slow, L).between_ms and by(slow, L).speedup < by(fast, L).speedup


def test_auto_plan_runs_speculative_sampling_for_one_draft():
    """At k = 1 the plan warms up, times and proposes ``speculative`` for K-SEQ and RRS (their one-draft rule, without
    K-SEQ's rho search), once for both; k >= 2 keeps the rule asked for; a callable verifier is left as it is."""
    from otm.decode.auto import one_draft, plan
    from otm.decode.bench import Costs

    assert one_draft("kseq", 1) == "speculative" == one_draft("rrs_without_replacement", 1)
    assert one_draft("kseq", 2) == "kseq" and one_draft("optimal", 1) == "optimal"
    target, draft = tiny_llama(30, V=6, scale=0.5), tiny_llama(31, V=6, scale=0.5)
    costs = Costs({1: 10.0, 2: 10.0, 3: 10.0}, {1: 0.1, 2: 0.1}, 8)
    p = plan(target, draft, [2, 3, 4], ks=(1, 2), lengths=(1,), verifiers=("kseq", "rrs"), costs=costs,
             warmup_tokens=12)
    assert set(p.acceptance) == {("speculative", 1), ("kseq", 2), ("rrs", 2)}
    assert sorted((c.verifier, c.k) for c in p.candidates) == [("kseq", 2), ("rrs", 2), ("speculative", 1)]
    mine = lambda *a, **kw: None  # noqa: E731
    assert one_draft(mine, 1) is mine


def test_keep_path_moves_the_path_down_and_leaves_a_path_in_place_as_it_is():
    """Runner.keep_path: a path already right after the kept length (a chain's accepted prefix, every k = 1 step)
    is kept without a copy; one further on is copied down; either way the cache holds the context and then the
    path's keys and values, in order."""
    from otm.decode.runner import Runner

    model = tiny_llama(5, V=8)
    with torch.inference_mode():
        for path in ([4, 5], [5, 7], [4, 6, 7], []):
            r = Runner(model, "target")
            r.feed([1, 2, 3, 4, 5, 6, 7, 0])  # 8 positions
            keys = [layer.keys.clone() for layer in r.cache.layers]
            values = [layer.values.clone() for layer in r.cache.layers]
            r.keep_path(4, path)
            assert r.length() == 4 + len(path)
            want = list(range(4)) + path
            for layer, k0, v0 in zip(r.cache.layers, keys, values):
                assert torch.equal(layer.keys, k0[..., want, :]) and torch.equal(layer.values, v0[..., want, :])


def test_a_plan_is_measured_once_and_kept(tmp_path, monkeypatch):
    """``kept_plan``: measured once per machine, models, prompt and settings, read back later with the line saying
    when and where; another setting, a retrained draft (same shapes, other weights) or a damaged file measure again;
    a folder that cannot be written is said in the line."""
    from otm.decode.auto import PLAN_FILE, kept_plan

    monkeypatch.setenv("OTM_CACHE", str(tmp_path / "cache"))
    target, draft = tiny_llama(30, V=6, scale=0.5), tiny_llama(31, V=6, scale=0.5)
    said: list[str] = []
    settings = dict(ks=(1, 2), lengths=(1, 2), warmup_tokens=8, say=said.append)
    first = kept_plan(target, draft, [2, 3, 4], **settings)
    assert len(said) == 1 and said[0].startswith("measuring the costs") and first.kept == ""
    path = tmp_path / "cache" / PLAN_FILE
    assert len(json.loads(path.read_text())) == 1
    again = kept_plan(target, draft, [2, 3, 4], **settings)
    assert len(said) == 1  # read back: nothing measured, nothing said
    assert again.candidates == first.candidates and again.t1_by_step == first.t1_by_step
    assert again.acceptance == first.acceptance and again.ar_tokens_per_second == first.ar_tokens_per_second
    assert again.best == first.best and again.kept.startswith("measured ") and str(path) in again.line()
    # what the plan depends on: another setting, prompt or draft is measured again (and kept beside)
    kept_plan(target, draft, [2, 3, 4], **{**settings, "warmup_tokens": 6})
    kept_plan(target, draft, [2, 3], **settings)
    other = tiny_llama(32, V=6, scale=0.5)  # a retrained draft: the same shapes, other weights
    kept_plan(target, other, [2, 3, 4], **settings)
    assert len(said) == 4 and len(json.loads(path.read_text())) == 4
    path.write_text("{ damaged")
    kept_plan(target, draft, [2, 3, 4], **settings)
    assert len(said) == 5 and len(json.loads(path.read_text())) == 1
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("OTM_CACHE", str(blocked))  # the cache folder is a file: nothing can be kept there
    unkept = kept_plan(target, draft, [2, 3, 4], **settings)
    assert len(said) == 6 and unkept.kept.startswith("not kept (") and "not kept (" in unkept.line()
