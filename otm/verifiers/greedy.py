r"""Greedy drafts and their verification (Hu et al., "Towards Optimal Multi-draft
Speculative Decoding", ICLR 2025).

Drafts: the top k-1 tokens ``D`` of :math:`q` (``draft``) are fixed; the last
draft is :math:`x \sim q' = q \cdot 1[\cdot \notin D] / q(\Sigma \setminus D)`.
Verification with target :math:`p`:

.. math::

    \text{accept } x \text{ w.p. } \min\!\left(1, \frac{p(x)}{q'(x)}\right),
    \quad \text{else emit } y \sim r \propto p \cdot 1[D] + (p - q')_+ \cdot 1[\cdot\notin D].

Since :math:`q'` is zero on ``D``, the residual is simply :math:`(p - q')_+`:
greedy verification is single-draft speculative sampling of the last draft
against the law it was drawn from, and a token of ``D`` emitted from the
residual counts as accepted (it is a draft).
The acceptance :math:`p(D) + \sum_{x \notin D} \min(p(x), q'(x))` is the optimum
of the OTM LP for this draft law, which the tests check. For k = 1 this is
ordinary speculative sampling.

>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)
1.0

Pieces: its scheme ``otm.schemes.Greedy``; torch twin ``otm.torch.greedy`` and sampler ``otm.torch.sample_greedy``; alpha* in closed form in ``otm.optimum`` (greedy).
"""

from __future__ import annotations

import numpy as np

from ..laws import OtmError, check_law
from ..schemes import Greedy
from .base import Outcome, accept, binder, check_inputs, positive_part, residual_law, residual_sample


def _parts(target, draft, k):
    scheme = Greedy(draft, k)
    in_d = ~scheme.rest_mask
    residual = np.where(in_d, target, positive_part(target - scheme.last))
    return scheme, residual


def _check_fixed(scheme: Greedy, d: np.ndarray) -> None:
    if not np.array_equal(np.sort(d[:-1]), scheme.fixed):
        raise OtmError(
            f"greedy drafts must start with the top {scheme.k - 1} draft tokens {scheme.fixed.tolist()}, "
            f"got {d[:-1].tolist()}: draw them with otm.schemes.Greedy"
        )
    if not scheme.last[d[-1]] > 0:  # a last draft the scheme never draws: never test it (p / 0)
        raise OtmError(
            f"greedy's last draft {int(d[-1])} has probability 0 under the scheme (a top token or a zero draft "
            "mass): draw the drafts with otm.schemes.Greedy"
        )


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the drafts ``(D..., x)``."""
    target, draft, d = check_inputs(target, draft, drafts)
    scheme, residual = _parts(target, draft, d.size)
    _check_fixed(scheme, d)
    x = d[-1]
    a = min(1.0, target[x] / scheme.last[x])
    out = (1.0 - a) * residual_law(residual, target)
    out[x] += a
    return out


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    target, draft, d = check_inputs(target, draft, drafts)
    scheme, residual = _parts(target, draft, d.size)
    _check_fixed(scheme, d)
    x = int(d[-1])
    if accept(rng, target[x], scheme.last[x]):
        return Outcome(x, d.size - 1)
    y = residual_sample(rng, residual, target)
    hit = np.flatnonzero(d[:-1] == y)
    return Outcome(y, int(hit[0]) if hit.size else None)


def acceptance(target, draft, k: int) -> float:
    r""":math:`p(D) + \sum_{x \notin D} \min(p(x), q(x) / q(\Sigma \setminus D))`."""
    target = check_law(target, "target")
    scheme = Greedy(check_law(draft, "draft", size=target.size), k)
    return float(target[scheme.fixed].sum() + np.minimum(target, scheme.last)[scheme.rest_mask].sum())


bind = binder(law, sample)
