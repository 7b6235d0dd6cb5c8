r"""SpecHub (Sun, Zhou, Chen & Sun, EMNLP 2024): two drafts around a hub token.

Drafts (``otm.schemes.SpecHub``): hub :math:`a = \arg\max q`; :math:`x_1 \sim q`;
:math:`x_2 = a` if :math:`x_1 \ne a`, else :math:`x_2 \sim q` restricted to
tokens :math:`\ne a`. So pair :math:`(i, a)` has mass :math:`q(i)` and pair
:math:`(a, i)` mass :math:`m_2(i) = q(a)q(i)/(1-q(a))`.

Verification with target :math:`p`, for :math:`i \ne a`: serve :math:`i` first
from the pairs :math:`(i,a)`, then from :math:`(a,i)`; serve :math:`a` from what
the pairs :math:`(a, \cdot)` have left, then from what the pairs
:math:`(\cdot, a)` have left; otherwise draw the residual:

.. math::

    (i,a):\ \text{accept } i \text{ w.p. } \min(1, p(i)/q(i)),
    \text{ else } a \text{ w.p. } \min(1, p'(a)/L_1),\\
    (a,i):\ \text{accept } i \text{ w.p. } \min(1, p'(i)/m_2(i)),
    \text{ else } a \text{ w.p. } \min(1, p(a)/L_2),\\
    p'(i) = (p(i)-q(i))_+,\ L_2 = \textstyle\sum_i (m_2(i) - p'(i))_+,\
    p'(a) = (p(a) - L_2)_+,\ L_1 = \sum_i (q(i)-p(i))_+,\\
    \text{residual } r(i) \propto (p(i) - q(i) - m_2(i))_+,\ r(a) = 0.

The hub is always fully served (:math:`p(a) \le L_1 + L_2`), and the acceptance
:math:`p(a) + \sum_{i\ne a} \min(p(i), q(i)/(1-q(a)))` equals the OTM optimum for
this draft law (and Hu et al.'s greedy optimum at k = 2). The authors' code
accepts the hub outright when :math:`p(a) > 1 - 10^{-3}`; this module does not.

>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6]), 6)
1.0

Pieces: its scheme ``otm.schemes.SpecHub``; torch twin ``otm.torch.spechub`` and sampler ``otm.torch.sample_spechub``; alpha* in closed form in ``otm.optimum`` (spechub).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..laws import OtmError, check_law
from ..schemes import SpecHub
from .base import Outcome, accept, binder, check_inputs, positive_part, residual_law, residual_sample


@dataclass(frozen=True)
class _Parts:
    hub: int
    q: np.ndarray  # mass of pair (i, a)
    m2: np.ndarray  # mass of pair (a, i)
    p_excess: np.ndarray  # p'(i) = (p(i) - q(i))_+, zero at the hub
    left1: float  # L_1: what the (i, a) pairs have left after serving i
    left2: float  # L_2: what the (a, i) pairs have left after serving i
    hub_rest: float  # p'(a) = (p(a) - L_2)_+
    residual: np.ndarray


def _parts(target, draft) -> _Parts:
    scheme = SpecHub(draft)
    a = scheme.hub
    not_hub = np.arange(target.size) != a
    q = np.where(not_hub, draft, 0.0)
    m2 = draft[a] * scheme.others
    p_excess = np.where(not_hub, positive_part(target - q), 0.0)
    left1 = float(np.where(not_hub, positive_part(q - target), 0.0).sum())
    left2 = float(positive_part(m2 - p_excess).sum())
    hub_rest = max(target[a] - left2, 0.0)
    residual = np.where(not_hub, positive_part(target - q - m2), 0.0)
    return _Parts(a, q, m2, p_excess, left1, left2, hub_rest, residual)


def _pair(parts: _Parts, d: np.ndarray) -> tuple[bool, int]:
    """(hub_first, i) for the drafts (x1, x2)."""
    x1, x2 = int(d[0]), int(d[1])
    if x2 == parts.hub and x1 != parts.hub:
        return False, x1
    if x1 == parts.hub and x2 != parts.hub:
        return True, x2
    raise OtmError(f"spechub drafts must be (i, hub) or (hub, i) with hub={parts.hub}, got ({x1}, {x2})")


def _probabilities(target, parts: _Parts, hub_first: bool, i: int) -> tuple[float, float]:
    """(P(accept i), P(accept hub | i rejected)) for this pair."""
    if hub_first:
        s_i = min(1.0, parts.p_excess[i] / parts.m2[i])
        s_a = min(1.0, target[parts.hub] / parts.left2) if parts.left2 > 0 else 0.0
    else:
        s_i = min(1.0, target[i] / parts.q[i])
        s_a = min(1.0, parts.hub_rest / parts.left1) if parts.left1 > 0 else 0.0
    return s_i, s_a


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the ordered pair of drafts."""
    target, draft, d = check_inputs(target, draft, drafts, k=2)
    parts = _parts(target, draft)
    hub_first, i = _pair(parts, d)
    s_i, s_a = _probabilities(target, parts, hub_first, i)
    out = (1.0 - s_i) * (1.0 - s_a) * residual_law(parts.residual, target)
    out[i] += s_i
    out[parts.hub] += (1.0 - s_i) * s_a
    return out


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    target, draft, d = check_inputs(target, draft, drafts, k=2)
    parts = _parts(target, draft)
    hub_first, i = _pair(parts, d)
    i_index, hub_index = (1, 0) if hub_first else (0, 1)
    if hub_first:
        if accept(rng, parts.p_excess[i], parts.m2[i]):
            return Outcome(i, i_index)
        if accept(rng, target[parts.hub], parts.left2):
            return Outcome(parts.hub, hub_index)
    else:
        if accept(rng, target[i], parts.q[i]):
            return Outcome(i, i_index)
        if accept(rng, parts.hub_rest, parts.left1):
            return Outcome(parts.hub, hub_index)
    return Outcome(residual_sample(rng, parts.residual, target), None)


def acceptance(target, draft) -> float:
    r""":math:`p(a) + \sum_{i \ne a} \min(p(i), q(i)/(1 - q(a)))`."""
    target = check_law(target, "target")
    scheme = SpecHub(check_law(draft, "draft", size=target.size))
    a = scheme.hub
    return float(target[a] + np.delete(np.minimum(target, scheme.others), a).sum())


bind = binder(law, sample)
