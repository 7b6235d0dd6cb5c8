r"""The LP-optimal verifier: draw the output from an optimal OTM plan.

Given the scheme's law :math:`P` over draft tuples and the target :math:`p`, the
OTM linear program (:func:`otm.lp.solve_lp`) returns a coupling :math:`\pi` of
:math:`P` and :math:`p` that maximises :math:`P(Y \in \mathrm{set}(X))`. The
verifier emits :math:`y \sim \pi(\mathrm{set}(\bar x), \cdot) / P(\mathrm{set}(\bar x))`.
It reaches the optimum :math:`\alpha^*` of any scheme (SpecTr section 3; Hu et
al., ICLR 2025), but needs the LP, so it is for small vocabularies.

The plan is folded onto draft *sets* (the membership cost only sees the set),
repaired to exact feasibility after the solve, and completed by coupling the
unmatched draft mass independently with the unmatched target mass, so its
output law is the target up to rounding whatever the solver's tolerances.

Pieces: the plan comes from ``otm.lp.solve_lp`` for any ``otm.schemes`` scheme; no torch twin (the LP fits small V only).
"""

from __future__ import annotations

import numpy as np

from ..laws import categorical
from ..schemes import check_target
from .base import BoundVerifier, Outcome


def bind(target, scheme, *, backend: str = "highs") -> BoundVerifier:
    """Solve the scheme's LP once and return its conditional law and sampler."""
    from ..lp import solve_lp  # the LP stack is imported only when this verifier is used

    target = check_target(scheme, target)
    plan = solve_lp(scheme, target, fold=True, backend=backend).plan

    def law(drafts) -> np.ndarray:
        return plan.conditional(np.asarray(drafts))

    def sample(drafts, rng: np.random.Generator) -> Outcome:
        d = np.asarray(drafts)
        y = categorical(rng, plan.conditional(d))
        hit = np.flatnonzero(d == y)
        return Outcome(y, int(hit[0]) if hit.size else None)

    return BoundVerifier(law, sample)
