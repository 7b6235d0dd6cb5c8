"""Tests of the feature draft (otm.decode.feature_draft) and of the decoder running it.

The decoder stays exact whatever law its draft has, so two kinds of test are needed: that the
laws the decoder draws from are the feature draft's laws as defined (true target features for
committed tokens, the draft's own guesses inside a drafted chain; checked against a plain,
cache-free computation), and that the output law is the target's (exact enumeration of the
decoder with these laws, and a calibrated chi-square test of real runs with its power against a
broken rule, and that broken rule as a negative control).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from otm.decode import Sampling, next_token_laws, speculative_decode
from otm.decode import decoder as dec
from otm.decode.exact_mode import as_vectors, exact_decode_law, law_error, target_law
from otm.decode.toy import model_law
from otm.decode.feature_draft import (
    FeatureDraft, build_feature_draft, is_feature_draft, load_feature_draft, save_feature_draft, shifted_features,
    target_features,
)
from otm.laws import OtmError
from otm.testing import chi2_gof, chi2_power

from test_decode import naive_torch

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ALPHA = 1e-3


def tiny_target(seed: int, V: int = 6, scale: float = 0.5) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=scale,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_pair(seed: int, V: int = 6, scale: float = 0.5):
    target = tiny_target(seed, V, scale)
    draft = build_feature_draft(target, seed=seed + 1)
    with torch.no_grad():  # larger random weights than the default init: laws far from uniform
        for p in draft.parameters():
            if p.requires_grad and p.ndim == 2:
                p.normal_(0, 0.4)
    return target, draft.eval()


def reference_law(target, draft, committed: list[int], drafted: list[int], sampling: Sampling) -> np.ndarray:
    """The feature draft's law after ``committed + drafted``, without any cache: committed tokens
    read the target's true features (a plain target forward), each drafted token reads the draft's
    own guess of the feature before it (the hidden state of the previous element)."""
    with torch.inference_mode():
        _, feats = target_features(target, torch.tensor([committed]))
        ids, inp = list(committed), shifted_features(feats)  # [1, n, H]
        h = draft(torch.tensor([ids]), inp).hidden[:, -1]  # [1, H]
        for x in drafted:
            ids.append(x)
            inp = torch.cat([inp, h[:, None]], dim=1)
            h = draft(torch.tensor([ids]), inp).hidden[:, -1]
        return next_token_laws(draft.logits(h), sampling, dtype=torch.float64)[0].numpy()


def test_target_features_are_the_heads_input():
    target = tiny_target(0)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        logits, feats = target_features(target, ids)
        torch.testing.assert_close(feats, target.model(input_ids=ids).last_hidden_state)
        torch.testing.assert_close(logits, feats @ target.lm_head.weight.T)


@pytest.mark.parametrize("rollback", ["gather", "refeed"])
@pytest.mark.parametrize("verifier,scheme,k,length", [
    ("kseq", "iid", 3, 3), ("speculative", "iid", 1, 4), ("rrs_without_replacement", "without_replacement", 3, 2),
])
def test_decoder_draws_from_the_feature_drafts_laws(monkeypatch, rollback, verifier, scheme, k, length):
    """Every law the decoder drafts from (root and every row at every depth) equals the
    cache-free reference law of its prefix to 1e-5, over a 30-token run with many rejections:
    the features, their shift by one, the guesses inside a chain and the re-feeding of accepted
    tokens with true features are all as defined."""
    target, draft = tiny_pair(3)
    prompt, sampling = [1, 2, 3, 4], Sampling(temperature=1.0)
    emitted: list[int] = []
    checked = []
    original = dec._Decoder.draft_rows

    def recording(self, L, *rest):
        out = original(self, L, *rest)
        rows, row_laws = out.rows, out.laws
        committed = prompt + emitted
        for t, laws in enumerate(row_laws):
            for j in range(laws.shape[0]):
                drafted = rows[j, :t].tolist()
                ref = reference_law(target, draft, committed, drafted, sampling)
                assert np.abs(laws[j].numpy() - ref).max() < 1e-5, (committed, drafted)
                checked.append(1)
        return out

    monkeypatch.setattr(dec._Decoder, "draft_rows", recording)
    out = speculative_decode(target, draft, prompt, k=k, length=length, verifier=verifier, scheme=scheme,
                             sampling=sampling, max_new_tokens=30, seed=5, target_rollback=rollback,
                             on_tokens=emitted.extend)
    assert len(out.tokens) == 30 and len(checked) > 20
    assert 0 < out.stats.accepted_by_depth[0] < out.stats.verified_by_depth[0]  # rejections happened
    assert out.stats.target_calls == out.stats.steps


def test_first_step_drafts_nothing_and_later_steps_draft():
    target, draft = tiny_pair(4)
    sizes = []
    out = speculative_decode(target, draft, [1, 2], k=2, length=2, max_new_tokens=40, seed=0,
                             on_tokens=lambda new: sizes.append(len(new)))
    s = out.stats
    assert sizes[0] == 1 and s.draft_calls > 0  # the first step: one target draw, no drafts
    # every other step verifies at the root, but a last step with one token left (nothing to draft)
    assert s.verified_by_depth[0] in (s.steps - 1, s.steps - 2) and max(sizes) > 1


# -- exact law, by the decoder's own code ----------------------------------------------------------

V, T, K, L = 3, 3, 2, 2
PROMPT = [0, 2, 1]
SAMPLING = Sampling(temperature=0.9, top_k=2)  # zero-probability tokens in both laws
N, N_CONTROL = 1500, 1000
TARGET, DRAFT = (m.to(torch.float64) for m in tiny_pair(8, V=V, scale=0.3))  # float64: tree and plain forwards agree to 1e-15


def reference():
    return target_law(model_law(TARGET, PROMPT, SAMPLING), T)


def exact(verifier, scheme="iid", k=K, length=L):
    with torch.inference_mode():
        return exact_decode_law(TARGET, DRAFT, PROMPT, max_new_tokens=T, k=k, length=length, verifier=verifier,
                                scheme=scheme, sampling=SAMPLING)


def test_exact_decoder_law_with_feature_draft_is_target_law():
    """The real decoder with the feature draft (first step without drafts, guessed features inside a
    chain, true features re-fed after verification), every run enumerated by its exact mode: every
    valid rule gives the target's T-token law to 1e-12; the naive rule does not."""
    law = reference()
    for verifier, scheme, k in (("kseq", "iid", K), ("rrs", "iid", K), ("speculative", "iid", 1),
                                ("rrs_without_replacement", "without_replacement", K)):
        for length in (1, 2):
            assert law_error(exact(verifier, scheme, k, length), law) < 1e-12, (verifier, length)
    assert law_error(exact(naive_torch), law) > 1e-2


def _runs(n, verifier, seed):
    gen = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(n):
        out = speculative_decode(TARGET, DRAFT, PROMPT, k=K, length=L, verifier=verifier, sampling=SAMPLING,
                                 max_new_tokens=T, generator=gen)
        counts[tuple(out.tokens)] += 1
    return counts


def _gof(counts, law):
    cells = sorted(set(law) | set(counts))
    return chi2_gof([counts.get(c, 0) for c in cells], [law.get(c, 0.0) for c in cells], alpha=ALPHA)


@pytest.mark.slow
def test_sequence_law_with_feature_draft_and_negative_control():
    """K-SEQ (k = 2, L = 2) with the feature draft: N = 1500 runs of T = 3 tokens against the target's
    exact law (V = 3, top-k 2: 8 cells), chi-square at alpha = 1e-3. The power against the naive rule,
    computed exactly from that broken decoder's law (exact mode), is asserted >= 0.99 at N = 1000, and
    the naive rule run through the same test (N = 1000) is rejected."""
    law = reference()
    _, p0, p1 = as_vectors(law, exact(naive_torch))
    assert chi2_power(N_CONTROL, p0, p1, alpha=ALPHA) >= 0.99
    result = _gof(_runs(N, "kseq", seed=1), law)
    assert not result.reject, str(result)
    control = _gof(_runs(N_CONTROL, naive_torch, seed=2), law)
    assert control.reject, str(control)


# -- save, load, refusals --------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path):
    from otm.decode.models import load_draft

    target, draft = tiny_pair(9)
    save_feature_draft(draft, tmp_path / "fd")
    assert is_feature_draft(tmp_path / "fd") and not is_feature_draft(tmp_path)
    loaded = load_draft(tmp_path / "fd", target)  # the generic loader dispatches on the config key
    assert isinstance(loaded, FeatureDraft)
    assert loaded.embedding is target.get_input_embeddings().weight and loaded.head is target.lm_head.weight
    half = build_feature_draft(target)  # the saved weights are fp16: compare with a rounded copy
    half.load_state_dict({k: v.half().float() for k, v in draft.state_dict().items()})
    ids, feats = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 16)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids, feats).hidden, half.eval()(ids, feats).hidden, atol=1e-6, rtol=0)
    # the same draft is the same tensors at every load, its unused 1 x H embedding placeholder included (zeros, not
    # a random draw: a kept plan's key reads every tensor, otm.decode.auto.plan_key)
    torch.manual_seed(1)
    again = load_draft(tmp_path / "fd", target)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), again.state_dict().values()))
    assert not loaded.model.embed_tokens.weight.any()


def test_refusals_one_line(tmp_path):
    target, draft = tiny_pair(10)
    save_feature_draft(draft, tmp_path / "fd")
    other = tiny_target(11, V=7)
    with pytest.raises(OtmError) as err:
        load_feature_draft(tmp_path / "fd", other)
    assert "\n" not in str(err.value)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "fd" / "model.safetensors"))
    state.pop("fc.weight")
    save_file(state, str(tmp_path / "fd" / "model.safetensors"))
    with pytest.raises(OtmError, match="missing"):
        load_feature_draft(tmp_path / "fd", target)
    narrow = LlamaForCausalLM(LlamaConfig(  # same vocabulary, hidden 8: not the target the draft reads
        vocab_size=6, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    with pytest.raises(OtmError, match="feature") as err:
        speculative_decode(narrow, draft, [1, 2], k=2, length=2, max_new_tokens=4, seed=0)
    assert "\n" not in str(err.value)


def test_cli_decode_and_bench_with_a_feature_draft(tmp_path, capsys):
    """`otm decode` and `otm bench-decode` run a saved feature draft by path; the hf assisted row
    runs the plain peer draft (named in its row), and without a usable peer the bench refuses in
    one line (exit 2)."""
    from transformers import AutoModelForCausalLM

    from otm.cli import main
    from test_decode import _save_pair

    target_dir, plain_dir = _save_pair(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    save_feature_draft(build_feature_draft(target, seed=1), tmp_path / "fd")
    common = ["--target", target_dir, "--draft", str(tmp_path / "fd"), "--no-progress", "--max-new-tokens", "6"]
    assert main(["decode", "--prompt", "a b c", "-k", "3", "--length", "2", *common]) == 0
    assert "kseq iid k=3 L=2" in capsys.readouterr().err  # not a terminal: the measurements go to stderr
    assert main(["bench-decode", "--k", "2", "--length", "2", "--verifiers", "kseq", "--prompts", "1",
                 "--peer-draft", plain_dir, *common]) == 0
    out = capsys.readouterr().out
    assert "hf assisted (peer draft, defaults)" in out and "reads the target's features" in out
    assert "kseq k=2 L=2" in out
    # the eager step on oneDNN's linear layers (otm.decode.onednn), every row of the bench on the swapped models
    assert main(["decode", "--prompt", "a b c", "-k", "2", "--length", "2", "--compile", "onednn", *common]) == 0
    assert "kseq iid k=2 L=2" in capsys.readouterr().err
    assert main(["bench-decode", "--k", "2", "--length", "2", "--verifiers", "kseq", "--prompts", "1",
                 "--peer-draft", plain_dir, "--compile", "onednn", *common]) == 0
    out = capsys.readouterr().out
    assert "linear layer on oneDNN's prepacked GEMM" in out and "kseq k=2 L=2" in out
    # the default peer is the embedded token-only draft, whose vocabulary is not this target's
    assert main(["bench-decode", "--k", "2", "--length", "2", "--verifiers", "kseq", "--prompts", "1", *common]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "otm: error:" in line]
    assert len(err) == 1 and "vocabulary" in err[0]


def test_draft_logits_for_either_kind_of_draft():
    """``draft_logits`` gives a feature draft the target's features (its law at every position
    equals the cache-free reference) and a plain draft its own forward."""
    from otm.decode.feature_draft import draft_logits

    target, draft = tiny_pair(15)
    ids = [1, 2, 3, 4, 5]
    with torch.inference_mode():
        got = torch.softmax(draft_logits(draft, target, torch.tensor([ids]))[0].double(), -1)
        for j in range(1, len(ids) + 1):
            ref = reference_law(target, draft, ids[:j], [], Sampling())
            assert np.abs(got[j - 1].numpy() - ref).max() < 1e-5
        plain = tiny_target(16)
        torch.testing.assert_close(draft_logits(plain, target, torch.tensor([ids])), plain(torch.tensor([ids])).logits)


def test_compiling_the_feature_draft_traces_no_memoised_lookup():
    """The draft's forward, traced by torch.compile (the static step), asks nothing of the memoised cache-keyword
    lookup (dynamo warned "Dynamo detected a call to a functools.lru_cache-wrapped function" on every compile)."""
    import warnings

    from otm.decode.feature_draft import draft_config

    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2)
    emb = torch.randn(16, 32)
    draft = FeatureDraft(draft_config(cfg), emb, emb.clone()).eval()
    compiled = torch.compile(lambda ids, feats: draft(ids, feats).hidden, backend="eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = compiled(torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 32))
    assert out.shape == (1, 3, 32)
    assert not [w for w in seen if "lru_cache" in str(w.message)]
