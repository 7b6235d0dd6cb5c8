"""Tests of the distillation losses of analysis/train_draft.py (no model is loaded).

The top-k loss coarsens both laws to the target's top-k tokens plus one tail cell: with k = V it
must be the exact full-vocabulary KL and acceptance, and with k < V the coarsened KL can only be
smaller (data processing) and the coarsened acceptance sum min(target, draft) only larger
(min(a + b, c + d) >= min(a, c) + min(b, d)). The acceptance term used by ``--tv-weight`` must
carry a gradient that raises the acceptance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
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
