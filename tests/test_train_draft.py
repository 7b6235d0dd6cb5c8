"""Tests of the draft lab (analysis/lab/): the distillation losses, what it saves, its refusals (tiny models only).

The top-k loss coarsens both laws to the target's top-k tokens plus one tail cell: with k = V it
must be the exact full-vocabulary KL and acceptance, and with k < V the coarsened KL can only be
smaller (data processing) and the coarsened acceptance sum min(target, draft) only larger
(min(a + b, c + d) >= min(a, c) + min(b, d)). The acceptance term used by ``--tv-weight`` must
carry a gradient that raises the acceptance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis" / "lab"))  # the lab is not a package
from train_draft import kl_and_acceptance, topk_kl_and_acceptance  # noqa: E402


def _laws(n=6, v=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    target_logits = 2.0 * torch.randn(n, v, generator=g, dtype=torch.float64)
    draft_logits = 2.0 * torch.randn(n, v, generator=g, dtype=torch.float64)
    return target_logits, draft_logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topk_loss_with_every_token_is_the_exact_loss(seed):
    t_logits, d_logits = _laws(seed=seed)
    p = torch.softmax(t_logits, -1)
    top_p, top_i = p.topk(p.shape[1], dim=-1)
    kl_k, acc_k = topk_kl_and_acceptance(d_logits, top_p, top_i)
    kl, acc = kl_and_acceptance(d_logits, t_logits)
    assert abs(kl_k.item() - kl.item()) < 1e-6
    assert abs(acc_k.item() - acc.item()) < 1e-9


@pytest.mark.parametrize("k", [1, 5, 20])
def test_topk_loss_bounds_the_exact_loss(k):
    t_logits, d_logits = _laws(seed=k)
    p = torch.softmax(t_logits, -1)
    top_p, top_i = p.topk(k, dim=-1)
    kl_k, acc_k = topk_kl_and_acceptance(d_logits, top_p, top_i)
    kl, acc = kl_and_acceptance(d_logits, t_logits)
    assert kl_k.item() <= kl.item() + 1e-9
    assert acc_k.item() >= acc.item() - 1e-12
    assert acc_k.item() < 1.0


def test_acceptance_term_has_an_ascent_gradient():
    """One small step along the gradient of the acceptance raises the exact acceptance."""
    t_logits, d_logits = _laws(seed=7)
    d_logits = d_logits.clone().requires_grad_(True)
    p = torch.softmax(t_logits, -1)
    top_p, top_i = p.topk(10, dim=-1)
    _, acc = topk_kl_and_acceptance(d_logits, top_p, top_i)
    assert acc.requires_grad
    acc.backward()
    assert d_logits.grad.abs().sum() > 0
    with torch.no_grad():
        before = kl_and_acceptance(d_logits, t_logits)[1].item()
        after = kl_and_acceptance(d_logits + 0.5 * d_logits.grad, t_logits)[1].item()
    assert after > before


# --- what the lab writes, the package loads (tiny models) --------------------------------------


def _tiny_llama(vocab=48, layers=2, seed=0):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def test_saved_token_draft_loads_in_the_package_and_gives_the_same_logits(tmp_path):
    """train_draft.save (fp16, tied head stored once) -> otm.decode.models.load_draft: same logits
    up to fp16 rounding of the weights, and the head tied to the loaded embedding."""
    from safetensors.torch import load_file, save_file
    from train_draft import save

    from otm.decode.models import load_draft

    draft, target = _tiny_llama(seed=1), _tiny_llama(seed=2)
    save(draft, tmp_path / "d", save_file)
    assert "lm_head.weight" not in load_file(str(tmp_path / "d" / "model.safetensors"))
    loaded = load_draft(tmp_path / "d", target)
    ids = torch.randint(0, 48, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = draft.half().float()(input_ids=ids).logits
        got = loaded(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert loaded.lm_head.weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()


def test_training_needs_an_output_directory(capsys):
    """The lab never writes into the package by itself: training without --out is refused."""
    from train_draft import main

    with pytest.raises(SystemExit) as exc:
        main(["--phase", "train"])
    assert exc.value.code == 2
    assert "--out DIR is required" in capsys.readouterr().err


def test_data_directory_meta_refuses_other_settings_and_accepts_older_files(tmp_path):
    from train_draft import check_meta

    path = tmp_path / "meta.json"
    meta = dict(seed=0, prompt_set="self", self=dict(query_tokens=96, min_chars=12, oversample=1.5))
    check_meta(path, meta)  # no file yet: fine
    path.write_text(json.dumps(dict(seed=0, prompt_set="self")))  # written before "self" existed
    check_meta(path, meta)
    path.write_text(json.dumps(meta))
    check_meta(path, meta)
    changed = dict(meta, self=dict(query_tokens=64, min_chars=12, oversample=1.5))
    with pytest.raises(SystemExit) as exc:
        check_meta(path, changed)
    msg = str(exc.value)
    assert "\n" not in msg and "query_tokens" in msg and "other settings" in msg


def _ttt_against_decoder(depth: int, seed: int = 0, mask=None) -> float:
    """Largest difference between the training-time test's depth-d hidden states (all positions in
    one pass per depth) and the decoder's own incremental drafting of every chain (its
    ``FeatureRunner``: the context read with true features, then drafted elements with the
    draft's guesses, through its KV cache) on a tiny float64 feature draft."""
    import draftlab
    from test_feature_draft import tiny_pair

    from otm.decode import decoder as dec
    from otm.decode.feature_draft import shifted_features

    target, draft = tiny_pair(seed, V=11)
    target, draft = target.double(), draft.double()
    g = torch.Generator().manual_seed(seed)
    B, S, H = 2, 9, draft.config.hidden_size
    ids = torch.randint(0, 11, (B, S), generator=g)
    feats = torch.randn(B, S, H, generator=g, dtype=torch.float64)
    old = draftlab.ttt_mask
    if mask is not None:
        draftlab.ttt_mask = mask
    try:
        with torch.no_grad():
            hs = draftlab.feature_draft_hidden(draft, ids, feats, 0.0, depth=depth)
    finally:
        draftlab.ttt_mask = old
    assert len(hs) == depth
    worst = 0.0
    inputs = shifted_features(feats)
    with torch.no_grad():
        for b in range(B):
            for t in range(S - depth + 1):  # a chain whose first drafted element is at position t
                runner = dec.FeatureRunner(draft, "draft")
                h = runner.feed(ids[b, : t + 1].tolist(), inputs[b, : t + 1])  # depth 1: true features
                worst = max(worst, (h[0] - hs[0][b, t]).abs().max().item())
                for d in range(2, depth + 1):  # depth d reads the guess of depth d - 1
                    pos = torch.tensor([[t + d - 1]])
                    h = runner.forward(ids[b : b + 1, t + d - 1 : t + d], pos, h[:, None])[:, -1]
                    worst = max(worst, (h[0] - hs[d - 1][b, t + d - 1]).abs().max().item())
    return worst


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_training_time_test_computes_the_decoders_chains(depth):
    """EAGLE-3's training-time test (train_draft --ttt-depth): pass d at every position equals the
    decoder's drafting of depth d of the chain there, to float64 rounding."""
    assert _ttt_against_decoder(depth) < 1e-10


def test_training_time_test_with_a_plain_causal_mask_is_caught():
    """Negative control: deeper passes that attend causally to their own pass only (every context
    element read with guessed features, the cheap approximation) are not what the decoder drafts."""

    def causal_own_pass(S, depth):
        j, i = torch.arange(S)[:, None], torch.arange(S)[None, :]
        return torch.cat([torch.zeros(S, (depth - 1) * S, dtype=torch.bool), i <= j], dim=1)

    assert _ttt_against_decoder(3, mask=causal_own_pass) > 1e-3


def test_chain_length_proxy():
    from train_draft import chain_length

    assert chain_length([]) == 1.0
    assert abs(chain_length([0.5]) - 1.5) < 1e-15
    assert abs(chain_length([0.5, 0.5, 0.5]) - 1.875) < 1e-15


def test_ttt_depth_below_one_is_refused(capsys, tmp_path):
    from train_draft import main

    with pytest.raises(SystemExit) as exc:
        main(["--phase", "train", "--arch", "features", "--ttt-depth", "0", "--out", str(tmp_path / "d")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--ttt-depth must be at least 1, got 0" in err


def test_held_out_acceptance_by_depth_needs_a_feature_draft():
    """eval_draft --depths: a token-only draft reads the same prefix at every depth, so depth > 1 is
    refused for it (one line), as is depth 0."""
    from draftlab import held_out_acceptance

    from otm.laws import OtmError

    token_draft = _tiny_llama(seed=1)
    for depth in (0, 2):
        with pytest.raises(OtmError, match="needs depth >= 1 and, beyond 1, a feature draft") as exc:
            held_out_acceptance(token_draft, token_draft, None, ["hi"], depth=depth)
        assert "\n" not in str(exc.value)


def test_training_time_test_with_an_off_by_one_chain_start_is_caught():
    """Negative control, off-by-one depth: pass d's context one position too long (pass 1's keys up
    to t + 1 instead of t, so the query also sees the true-feature element its own chain replaced)."""
    import draftlab

    right = draftlab.ttt_mask

    def one_too_many(S, depth):
        m = right(S, depth).clone()
        j, i = torch.arange(S)[:, None], torch.arange(S)[None, :]
        if depth > 1:
            m[:, :S] = i <= j - depth + 2
        return m

    assert _ttt_against_decoder(2) < 1e-10
    assert _ttt_against_decoder(2, mask=one_too_many) > 1e-3


def test_eval_bootstrap_interval_is_over_prompts():
    """eval_draft's interval: scipy's percentile bootstrap with prompts as units, seeded; it holds the
    position-weighted mean and is the hand-written resampling it replaced to 1e-12 (same indices; scipy's
    level (1 - 0.95) / 2 differs from 0.025 by 2e-17)."""
    from eval_draft import bootstrap_ci

    rng = np.random.default_rng(0)
    per_prompt = [level + 0.02 * rng.standard_normal(n)
                  for level, n in zip([0.2, 0.35, 0.5, 0.55, 0.7], [5, 9, 12, 7, 20])]
    lo, hi = bootstrap_ci(per_prompt, seed=1234)
    mean = np.concatenate(per_prompt).mean()
    assert lo < mean < hi and hi - lo > 0.1
    sums = np.array([a.sum() for a in per_prompt])
    counts = np.array([len(a) for a in per_prompt])
    idx = np.random.default_rng(1234).integers(0, 5, size=(2000, 5))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    assert (lo, hi) == pytest.approx((np.quantile(means, 0.025), np.quantile(means, 0.975)), rel=0, abs=1e-12)
