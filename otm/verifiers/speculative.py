r"""Single-draft speculative sampling (k = 1): the maximal coupling.

Leviathan, Kalman & Matias (ICML 2023), Chen et al. (2023). With one draft
:math:`x \sim q` (``draft``) and target :math:`p` (``target``):

.. math::

    \text{accept } x \text{ w.p. } \min\left(1, \frac{p(x)}{q(x)}\right),
    \quad \text{else emit } y \sim \frac{(p - q)_+}{\sum (p - q)_+}.

The output law is exactly :math:`p`; the acceptance is
:math:`\sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`, the optimum for k = 1.

>>> import numpy as np
>>> law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [2]).round(4)
array([0.5   , 0.1667, 0.3333])

Pieces: its scheme ``otm.schemes.IID`` (k = 1); torch twin ``otm.torch.speculative``; alpha* in ``otm.optimum`` (iid).
"""

from __future__ import annotations

import numpy as np

from ..laws import check_law
from .base import Outcome, accept, binder, check_inputs, positive_part, residual_law, residual_sample


def law(target, draft, drafts) -> np.ndarray:
    """Exact law of the output given the single draft ``drafts[0]``."""
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = d[0]
    a = min(1.0, target[x] / draft[x])
    out = (1.0 - a) * residual_law(positive_part(target - draft), target)
    out[x] += a
    return out


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    """The rule with one uniform for the accept test and one for the residual."""
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = int(d[0])
    if accept(rng, target[x], draft[x]):
        return Outcome(x, 0)
    return Outcome(residual_sample(rng, positive_part(target - draft), target), None)


def acceptance(target, draft) -> float:
    """:math:`\\sum_x \\min(p(x), q(x))`."""
    target = check_law(target, "target")
    return float(np.minimum(target, check_law(draft, "draft", size=target.size)).sum())


bind = binder(law, sample)
