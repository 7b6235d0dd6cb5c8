r"""Adversarial search for the worst (target, draft) pairs of a verifier.

For a rule with acceptance :math:`\alpha_R(p, q, k)` and its scheme's optimum
:math:`\alpha^*(p, q, k)` this minimises the ratio

.. math::

    \min_{z \in \mathbb{R}^{2V}} \frac{\alpha_R(\mathrm{softmax}(z_{1..V}),\, \mathrm{softmax}(z_{V+1..2V}), k)}
                                      {\alpha^*(\mathrm{softmax}(z_{1..V}),\, \mathrm{softmax}(z_{V+1..2V}), k)}

from several seeded random starts: L-BFGS-B on the logits (finite-difference
gradients, logits boxed to [-``LOGIT_BOX``, ``LOGIT_BOX``]) then a Nelder-Mead
polish from the best point. SpecTr's guarantee says the K-SEQ ratio never goes
below :math:`1 - (1 - 1/k)^k`; the search is how ``tests/test_gap.py`` tries to
break it, with negative controls (rules known to fall below the bound, kept in the tests)
that the same search must catch.

Rules (``RULES``):

* ``kseq``: K-SEQ / :math:`\alpha^*_{iid}`;
* ``rrs``: RRS with replacement / :math:`\alpha^*_{iid}`;
* ``rrsw``: RRS without replacement (exact path sum, small V^k) / :math:`\alpha^*_{wo}`;
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import softmax
from scipy.optimize import minimize

from ..laws import OtmError
from ..verifiers.kseq import guarantee as bound  # noqa: F401  (otm.analysis.worst_case.bound, as the scripts read it)

LOGIT_BOX = 20.0
MIN_OPTIMUM = 1e-6
"""Points where the optimum is below this score 2 (rejected): there both acceptances are
near 0 and ``1 - prod(1 - r_i)`` (RRS) has lost its relative precision, so the ratio is
rounding noise, not a worst case. Every rule here is at least the first-draft rule, whose
ratio is >= 1/k, so nothing real is lost."""
START_SCALES = (0.5, 2.0, 5.0)


def _ratio(acc, opt):
    return acc / opt if opt >= MIN_OPTIMUM else 2.0


def _kseq(p, q, k):
    from ..optimum import optimal_acceptance
    from ..verifiers import kseq

    return _ratio(kseq.acceptance(p, q, k), optimal_acceptance(p, q, k, "iid"))


def _rrs(p, q, k):
    from ..optimum import optimal_acceptance
    from ..verifiers import rrs

    return _ratio(rrs.acceptance(p, q, k), optimal_acceptance(p, q, k, "iid"))


def _rrsw(p, q, k):
    from ..optimum import optimal_acceptance
    from ..verifiers import rrs_without_replacement

    return _ratio(rrs_without_replacement.acceptance_exact(p, q, k), optimal_acceptance(p, q, k, "without_replacement"))


RULES: dict[str, Callable[[np.ndarray, np.ndarray, int], float]] = {
    "kseq": _kseq,
    "rrs": _rrs,
    "rrsw": _rrsw,
}


@dataclass(frozen=True)
class WorstCase:
    """The smallest ratio found and where: ``target``, ``draft`` (laws), the start that found it."""

    rule: str
    k: int
    V: int
    ratio: float
    target: np.ndarray
    draft: np.ndarray
    start: int
    starts: int
    evaluations: int

    @property
    def bound(self) -> float:
        return bound(self.k)

    def as_dict(self) -> dict:
        return {
            "rule": self.rule, "k": self.k, "V": self.V, "ratio": self.ratio, "bound": self.bound,
            "ratio_minus_bound": self.ratio - self.bound, "start": self.start, "starts": self.starts,
            "evaluations": self.evaluations, "target": self.target.tolist(), "draft": self.draft.tolist(),
        }  # fmt: skip


def search(
    rule: str | Callable,
    k: int,
    V: int,
    *,
    starts: int = 4,
    seed: int = 0,
    maxiter: int = 200,
    polish: int = 2000,
) -> WorstCase:
    """Minimise ``rule``'s ratio over softmax-parametrised (target, draft) on ``V`` tokens.

    Parameters
    ----------
    rule : str or callable
        A key of :data:`RULES`, or ``f(target, draft, k) -> ratio``.
    k, V : int
        Drafts and vocabulary size (``V >= 2``; ``rrsw`` needs ``k <= V``).
    starts : int
        Random starts; start ``s`` draws logits ``N(0, scale^2)`` with ``scale`` cycling
        through :data:`START_SCALES`, from ``default_rng([seed, k, V, s])``.
    maxiter : int
        L-BFGS-B iterations per start.
    polish : int
        Nelder-Mead function evaluations from the best point (0: none).
    """
    name = rule if isinstance(rule, str) else getattr(rule, "__name__", "custom")
    f = RULES.get(rule) if isinstance(rule, str) else rule
    if f is None:
        raise OtmError(f"unknown rule {rule!r}: choose one of {', '.join(RULES)}")
    if V < 2 or k < 1 or starts < 1:
        raise OtmError(f"search needs V >= 2, k >= 1 and starts >= 1, got V={V}, k={k}, starts={starts}")
    count = [0]

    def objective(z):
        count[0] += 1
        try:
            r = f(softmax(z[:V]), softmax(z[V:]), k)
        except (OtmError, FloatingPointError, ZeroDivisionError):
            return 2.0
        return r if math.isfinite(r) else 2.0

    best = (math.inf, None, -1)
    box = [(-LOGIT_BOX, LOGIT_BOX)] * (2 * V)
    for s in range(starts):
        rng = np.random.default_rng([seed, k, V, s])
        z0 = START_SCALES[s % len(START_SCALES)] * rng.standard_normal(2 * V)
        res = minimize(objective, z0, method="L-BFGS-B", bounds=box, options={"maxiter": maxiter, "eps": 1e-6})
        val = objective(res.x)
        if val < best[0]:
            best = (val, res.x, s)
    if polish:
        res = minimize(
            objective, best[1], method="Nelder-Mead",
            options={"maxfev": polish, "xatol": 1e-9, "fatol": 1e-12, "adaptive": True},
        )  # fmt: skip
        if res.fun < best[0]:
            best = (float(res.fun), np.clip(res.x, -LOGIT_BOX, LOGIT_BOX), best[2])
    z = best[1]
    target, draft = softmax(z[:V]), softmax(z[V:])
    ratio = f(target, draft, k)  # re-evaluate at the returned laws
    return WorstCase(name, k, V, float(ratio), target, draft, best[2], starts, count[0])
