"""Tests of otm.decode.draft_vocab (FR-Spec drafts over the S most frequent tokens) and of the dtype choice
(otm.decode.models.cpu_bf16_flags / resolve_dtype).

A restricted draft is just a draft whose law is zero outside the subset: the tests check that the
processed law really is zero there and sums to 1, that the decoder with such a draft keeps the
target's law exactly (exact mode, toy models), that the committed ranking is a permutation of the
embedded vocabulary, and that bad input is refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from otm.decode import Sampling, next_token_laws
from otm.decode.draft_vocab import (
    DEFAULT_DRAFT_VOCAB, RANKING_FILE, SubsetHead, check_draft_vocab, draft_vocab_of, restrict_draft, token_ranking,
)
from otm.decode.exact_mode import exact_decode_law, law_error, target_law
from otm.decode.feature_draft import build_feature_draft
from otm.decode.models import cpu_bf16_flags, resolve_dtype
from otm.decode.toy import ToyLM, model_law
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 12
SUBSET = torch.tensor([7, 2, 9, 0, 11])  # a "ranking" prefix: the draft may propose these only


def tiny_llama(seed: int, V: int = V) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def ranking_with_prefix(prefix: torch.Tensor, V: int = V) -> torch.Tensor:
    rest = [t for t in range(V) if t not in set(prefix.tolist())]
    return torch.cat([prefix, torch.tensor(rest)])


def test_subset_head_equals_the_full_head_on_the_subset_and_is_minus_inf_elsewhere():
    g = torch.Generator().manual_seed(0)
    weight, hidden = torch.randn(V, 8, generator=g), torch.randn(3, 2, 8, generator=g)
    out = SubsetHead(weight, SUBSET)(hidden)  # [3, 2, V]
    full = hidden @ weight.T
    inside = torch.zeros(V, dtype=torch.bool)
    inside[SUBSET] = True
    assert out.shape == full.shape
    torch.testing.assert_close(out[..., inside], full[..., inside], rtol=1e-6, atol=1e-6)
    assert torch.isneginf(out[..., ~inside]).all()


@pytest.mark.parametrize("kind", ["plain", "feature"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=3), Sampling(top_p=0.8),
                                      Sampling(temperature=0)])
def test_restricted_draft_law_is_zero_outside_the_subset_and_sums_to_one(kind, sampling):
    """The processed law (float64 and float32) of a restricted plain draft and feature draft: exactly 0 outside
    the S = 5 tokens, sum 1, and on the subset proportional to the unrestricted law (same logits)."""
    target = tiny_llama(1)
    draft = tiny_llama(2) if kind == "plain" else build_feature_draft(target, seed=3).eval()
    ids = torch.tensor([[3, 5, 1, 8]])

    def logits(model):
        if kind == "plain":
            return model(input_ids=ids).logits[0]
        from otm.decode.feature_draft import draft_logits

        return draft_logits(model, target, ids)[0]

    with torch.inference_mode():
        full = logits(draft)  # [4, V]
        restrict_draft(draft, 5, ranking_with_prefix(SUBSET))
        sub = logits(draft)
    assert draft_vocab_of(draft) == 5
    outside = torch.ones(V, dtype=torch.bool)
    outside[SUBSET] = False
    for dtype in (torch.float64, torch.float32):
        law = next_token_laws(sub, sampling, dtype=dtype)  # [4, V]
        assert law.dtype == dtype
        assert (law[:, outside] == 0).all()
        torch.testing.assert_close(law.sum(-1), torch.ones(4, dtype=dtype), rtol=0, atol=1e-6)
    if sampling == Sampling():  # no truncation: the restricted law is the full law renormalised on the subset
        q = next_token_laws(full, sampling, dtype=torch.float64)[:, SUBSET]
        torch.testing.assert_close(next_token_laws(sub, sampling, dtype=torch.float64)[:, SUBSET],
                                   q / q.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("verifier,scheme,k,length", [("speculative", "iid", 1, 2), ("kseq", "iid", 2, 1),
                                                      ("rrs", "iid", 2, 1),
                                                      ("rrs_without_replacement", "without_replacement", 2, 2)])
def test_decoder_with_a_draft_that_never_proposes_a_token_keeps_the_target_law(verifier, scheme, k, length):
    """Exact mode: a toy draft whose logit of token 2 is -inf (as outside a SubsetHead), a target of full
    support; the law of the first 3 tokens equals the target's to 1e-12, and token 2 (never drafted) is
    still emitted (as a correction or bonus token) with the target's probability. Negative control: the same
    decoder handed a floored draft law (0.02 on the never-proposed token) is off by more than 1e-3."""
    target, draft, prompt = ToyLM(3, seed=31), ToyLM(3, seed=32), [0, 1]
    with torch.no_grad():
        draft.table[..., 2] = -torch.inf
    sampling = Sampling(temperature=1.0)
    reference = target_law(model_law(target, prompt, sampling), 3)
    law = exact_decode_law(target, draft, prompt, max_new_tokens=3, k=k, length=length, verifier=verifier,
                           scheme=scheme, sampling=sampling)
    assert law_error(law, reference) < 1e-12
    assert sum(p for seq, p in law.items() if 2 in seq) > 0.1
    # negative control, a realistic slip: the verifier is handed the draft law with a floor on the tokens the
    # draft cannot propose (to "avoid q = 0"), not the law the drafts were drawn from: TV 0.013-0.019 here
    from unittest import mock

    from otm.decode import decoder as dec

    true_law = dec._Decoder.node_draft_law

    def floored(self, tree, node, drafts):
        q = true_law(self, tree, node, drafts)
        q = q + 0.02 * (q == 0)
        return q / q.sum(-1, keepdim=True)

    with mock.patch.object(dec._Decoder, "node_draft_law", floored):
        broken = exact_decode_law(target, draft, prompt, max_new_tokens=3, k=k, length=length, verifier=verifier,
                                  scheme=scheme, sampling=sampling)
    assert law_error(broken, reference) > 1e-3


def test_token_ranking_refusals(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.arange(V)[::-1].astype(np.int32))
    assert token_ranking(V, good).tolist() == list(range(V))[::-1]
    cases = {"ranks 12 tokens": (V + 1, good)}
    np.save(tmp_path / "dup.npy", np.zeros(V, dtype=np.int32))
    cases["not a permutation"] = (V, tmp_path / "dup.npy")
    np.save(tmp_path / "float.npy", np.zeros(V))
    cases["1-D array of token ids"] = (V, tmp_path / "float.npy")
    cases["does not load"] = (V, tmp_path / "missing.npy")
    for phrase, (size, path) in cases.items():
        with pytest.raises(OtmError) as exc:
            token_ranking(size, path)
        assert phrase in str(exc.value) and "\n" not in str(exc.value), phrase


@pytest.mark.parametrize("bad", [0, -3, V + 1, 2.5, True, "8"])
def test_bad_draft_vocab_is_refused_in_one_line(bad):
    with pytest.raises(OtmError) as exc:
        check_draft_vocab(bad, V)
    assert f"1..{V}" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(OtmError):
        restrict_draft(tiny_llama(2), bad, ranking_with_prefix(SUBSET))


def test_full_draft_vocab_leaves_the_draft_alone():
    draft = tiny_llama(2)
    head = draft.get_output_embeddings()
    assert restrict_draft(draft, V, ranking_with_prefix(SUBSET)) is draft
    assert draft.get_output_embeddings() is head and draft_vocab_of(draft) is None


def test_committed_ranking_is_a_small_permutation_of_the_embedded_vocabulary():
    ids = np.load(RANKING_FILE)
    assert ids.dtype == np.int32 and RANKING_FILE.stat().st_size < 300_000
    assert np.array_equal(np.sort(ids), np.arange(49152))
    assert 1 <= DEFAULT_DRAFT_VOCAB < 49152
    assert token_ranking(49152).tolist()[:10] == ids[:10].tolist()


# -- dtype -----------------------------------------------------------------------------------------


def test_cpu_bf16_flags_read_from_cpuinfo():
    x86 = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu avx512f\n"
    assert cpu_bf16_flags(x86) == ["avx512_bf16"]
    assert cpu_bf16_flags("flags\t: fpu amx_bf16 amx_tile\n") == ["amx_bf16"]
    assert cpu_bf16_flags("Features\t: fp asimd bf16 i8mm\n") == ["bf16"]
    assert cpu_bf16_flags("flags\t: fpu sse2 avx512f avx512bw\n") == []  # AVX512 without BF16: emulated, not native


def test_resolve_dtype(monkeypatch):
    import otm.decode.models as models

    monkeypatch.setattr(models, "cpu_bf16_flags", lambda cpuinfo=None: ["avx512_bf16"])
    assert resolve_dtype("auto") == torch.bfloat16 and resolve_dtype("bfloat16") == torch.bfloat16
    monkeypatch.setattr(models, "cpu_bf16_flags", lambda cpuinfo=None: [])
    assert resolve_dtype("auto") == torch.float32 and resolve_dtype("float32") == torch.float32
    with pytest.raises(OtmError) as exc:
        resolve_dtype("bfloat16")
    assert "no native bfloat16" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(OtmError):
        resolve_dtype("float8")
    with pytest.raises(OtmError) as exc:
        resolve_dtype("auto", "nonsense")
    assert "unknown torch device" in str(exc.value)


def test_cli_refuses_bad_draft_vocab_and_bf16_without_support(tmp_path, capsys, monkeypatch):
    """One line on stderr and exit 2: --draft-vocab 0, 'x', more than V; --dtype bfloat16 on a CPU without it."""
    import otm.decode.models as models
    from otm.cli import main

    from test_decode import _save_pair

    target, draft = _save_pair(tmp_path)
    models_args = ["--target", target, "--draft", draft, "--no-progress", "--max-new-tokens", "2"]
    capsys.readouterr()  # saving the pair wrote progress bars
    cases = [
        ["decode", "--prompt", "a", "--draft-vocab", "0", *models_args],
        ["decode", "--prompt", "a", "--draft-vocab", "x", *models_args],
        ["bench-decode", "--k", "2", "--length", "1", "--prompts", "1", "--draft-vocab", "7", *models_args],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("otm: error:") and ("draft-vocab" in err[0] or "1..6" in err[0]), err
    monkeypatch.setattr(models, "cpu_bf16_flags", lambda cpuinfo=None: [])
    assert main(["decode", "--prompt", "a", "--dtype", "bfloat16", *models_args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no native bfloat16" in err[0]
    # S < V on a target of another vocabulary than the committed ranking's
    assert main(["decode", "--prompt", "a", "--draft-vocab", "4", "--dtype", "float32", *models_args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ranks 49152 tokens" in err[0]


def test_bench_runs_and_names_a_restricted_draft():
    from otm.decode.bench import run_bench

    from test_decode import _save_pair  # noqa: F401  (the tiny tokenizer lives there)

    target, draft = tiny_llama(1), tiny_llama(2)
    restrict_draft(draft, 5, ranking_with_prefix(SUBSET))

    class Tok:  # no chat template: prompts are encoded by __call__
        eos_token_id = None

        def __call__(self, text):
            return {"input_ids": [len(w) % V for w in text.split()]}

    lines = []
    rows = run_bench(target, draft, Tok(), ks=[1, 2], lengths=[2], verifiers=["kseq"], sampling=Sampling(),
                     max_new_tokens=4, n_prompts=1, seed=0, hf=False, progress=False, out=lines.append)
    text = "\n".join(lines)
    assert "the 5 most frequent tokens (FR-Spec)" in text and "predicted tokens/s" in text
    assert [r.contender.name for r in rows] == ["autoregressive", "speculative k=1 L=2", "kseq k=2 L=2"]
    assert all(r.new_tokens == 4 for r in rows)


def test_feature_draft_loads_and_runs_in_its_targets_bfloat16(tmp_path):
    """A bfloat16 target gets a bfloat16 feature draft (fc, layers, head): its hidden states and logits are
    bfloat16, and the processed law from them is float64, zero outside a restricted vocabulary, summing to 1."""
    from otm.decode.feature_draft import draft_logits, load_feature_draft, save_feature_draft

    target = tiny_llama(1)
    save_feature_draft(build_feature_draft(target, seed=3), tmp_path / "fd")
    target = target.to(torch.bfloat16)
    draft = load_feature_draft(tmp_path / "fd", target)
    assert draft.fc.weight.dtype == torch.bfloat16
    assert {p.dtype for p in draft.model.parameters()} == {torch.bfloat16}
    restrict_draft(draft, 5, ranking_with_prefix(SUBSET))
    with torch.inference_mode():
        logits = draft_logits(draft, target, torch.tensor([[3, 5, 1]]))[0]  # [3, V]
    assert logits.dtype == torch.bfloat16
    law = next_token_laws(logits, Sampling(), dtype=torch.float64)
    outside = torch.ones(V, dtype=torch.bool)
    outside[SUBSET] = False
    assert (law[:, outside] == 0).all() and torch.allclose(law.sum(-1), torch.ones(3, dtype=torch.float64))
