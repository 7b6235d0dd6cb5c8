r"""Recursive rejection sampling with replacement (SpecInfer's multi-step speculative
sampling, Miao et al., ASPLOS 2024; also MCSD's ``_MCSSwReplacement``).

For k i.i.d. drafts :math:`x_1..x_k \sim q` (``draft``) and target :math:`p`
(``target``), visited in order:

.. math::

    p_1 = p; \quad \text{accept } x_i \text{ w.p. } \min\!\left(1, \frac{p_i(x_i)}{q(x_i)}\right);
    \quad p_{i+1} = \mathrm{norm}\big((p_i - q)_+\big); \quad
    \text{if all rejected emit } y \sim p_{k+1}.

SpecInfer picks the next draft uniformly among those left; for i.i.d. drafts a
fixed order gives the same output law. A rejected token has :math:`p_i < q` there,
so every later residual is zero on it: membership acceptance equals loop
acceptance, :math:`1 - \prod_i (1 - \sum_x \min(p_i(x), q(x)))`.

>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)
0.76

Pieces: its scheme ``otm.schemes.IID``; torch twin ``otm.torch.rrs``; alpha* in ``otm.optimum`` (iid).
"""

from __future__ import annotations

import numpy as np

from ..laws import check_k, check_law
from .base import Outcome, accept, binder, check_inputs, positive_part, residual_law, residual_sample  # noqa: F401


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the drafts (in the order visited)."""
    target, draft, d = check_inputs(target, draft, drafts)
    out = np.zeros_like(target)
    current = target  # p_i
    stay = 1.0
    for x in d:
        a = min(1.0, current[x] / draft[x])
        out[x] += stay * a
        stay *= 1.0 - a
        if stay == 0.0:
            return out
        current = residual_law(positive_part(current - draft), current)
    return out + stay * current


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    target, draft, d = check_inputs(target, draft, drafts)
    current = target
    for i, x in enumerate(d):
        if accept(rng, current[x], draft[x]):
            return Outcome(int(x), i)
        nxt = positive_part(current - draft)
        current = nxt / nxt.sum() if nxt.sum() > 0 else current
    return Outcome(residual_sample(rng, current, current), None)


def acceptance(target, draft, k: int) -> float:
    r""":math:`1 - \prod_{i=1}^k (1 - \sum_x \min(p_i(x), q(x)))` (Thomas et al., Alg. 9)."""
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    reject = 1.0
    current = target
    for _ in range(check_k(k)):
        reject *= 1.0 - float(np.minimum(current, draft).sum())
        current = residual_law(positive_part(current - draft), current)
    return 1.0 - reject


bind = binder(law, sample)
