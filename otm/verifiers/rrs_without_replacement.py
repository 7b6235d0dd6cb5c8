r"""Recursive rejection sampling without replacement (RRSw): Multi-Candidate
Speculative Decoding (Yang et al., 2024), Recursive Speculative Decoding (Jeon et
al., 2024), Sequoia's verifier.

For drafts :math:`x_1..x_k` drawn from :math:`q` (``draft``) without replacement
(successive sampling, the law of the Gumbel-top-k order) and target :math:`p`:

.. math::

    p_1 = p,\ q_1 = q; \quad \text{accept } x_i \text{ w.p. }
    \min\!\left(1, \frac{p_i(x_i)}{q_i(x_i)}\right); \quad
    p_{i+1} = \mathrm{norm}\big((p_i - q_i)_+\big),\
    q_{i+1} = \mathrm{norm}\big(q_i \cdot 1[\cdot \ne x_i]\big);

if all k are rejected emit :math:`y \sim p_{k+1}`. ``q_{i+1}`` is the law the
next draft was really drawn from, which is what makes the rule exact.

>>> import numpy as np
>>> law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [2, 0]).round(4)
array([0.6667, 0.    , 0.3333])
"""

from __future__ import annotations

import numpy as np

from ..laws import OtmError
from .base import Bound, Outcome, accept, check_inputs, positive_part, residual_law, residual_sample


def _distinct(d: np.ndarray) -> None:
    if np.unique(d).size != d.size:
        raise OtmError("rrs_without_replacement needs distinct drafts (drawn without replacement)")


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the ordered drafts."""
    target, draft, d = check_inputs(target, draft, drafts)
    _distinct(d)
    out = np.zeros_like(target)
    current, proposal = target, draft  # p_i, q_i
    stay = 1.0
    for i, x in enumerate(d):
        a = min(1.0, current[x] / proposal[x])
        out[x] += stay * a
        stay *= 1.0 - a
        if stay == 0.0:
            return out
        current = residual_law(positive_part(current - proposal), current)
        if i == d.size - 1:
            break  # no further draft: the proposal is not needed (and may have no mass left)
        proposal = proposal.copy()
        proposal[x] = 0.0
        proposal = proposal / proposal.sum()
    return out + stay * current


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    target, draft, d = check_inputs(target, draft, drafts)
    _distinct(d)
    current, proposal = target, draft
    for i, x in enumerate(d):
        if accept(rng, current[x], proposal[x]):
            return Outcome(int(x), i)
        nxt = positive_part(current - proposal)
        current = nxt / nxt.sum() if nxt.sum() > 0 else current
        if i == d.size - 1:
            break
        proposal = np.where(np.arange(proposal.size) == x, 0.0, proposal)
        proposal = proposal / proposal.sum()
    return Outcome(residual_sample(rng, current, current), None)


def bind(target, scheme) -> Bound:
    return Bound(lambda d: law(target, scheme.draft, d), lambda d, rng: sample(target, scheme.draft, d, rng))
