"""otm.testing: the exact (token, is-a-draft) cell law the sampler tests use; the Wilson interval."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from otm.schemes import IID
from otm.testing import membership_cells, wilson_interval


def test_membership_cells_of_a_draft_blind_rule():
    """A rule that ignores the drafts and outputs the target: cell (y, member) has mass
    p(y) P(y among the k iid drafts) = p(y) (1 - (1 - q(y))^k)."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.6, 0.0, 0.3])
    k = 3
    cells = membership_cells(lambda drafts: p, IID(q, k), 4)
    member = 1 - (1 - q) ** k
    np.testing.assert_allclose(cells[4:], p * member, atol=1e-15)
    np.testing.assert_allclose(cells[:4], p * (1 - member), atol=1e-15)
    assert abs(cells.sum() - 1) < 1e-15


def test_membership_cells_of_always_first_draft():
    """Returning the first draft puts all mass on member cells, with the draft law."""
    q = np.array([0.25, 0.25, 0.5])

    def first(drafts):
        out = np.zeros(3)
        out[drafts[0]] = 1.0
        return out

    cells = membership_cells(first, IID(q, 2), 3)
    np.testing.assert_allclose(cells[:3], 0.0, atol=0)
    np.testing.assert_allclose(cells[3:], q, atol=1e-15)


def _wilson_by_formula(successes: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson score interval written out (the form otm.certify used before scipy's)."""
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def test_wilson_interval_is_the_wilson_formula():
    """scipy's ``binomtest(...).proportion_ci(method="wilson")`` behind ``wilson_interval`` equals the
    formula to 1e-12 on a grid of counts, sizes and levels, the edges 0 and n included; a planted
    slip, the plain Wald interval p +- z sqrt(p(1-p)/n), is off by more than 1e-3 on the same grid."""
    worst, wald_worst = 0.0, 0.0
    for n in (1, 2, 7, 30, 100, 1000, 20_000):
        for successes in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            for confidence in (0.5, 0.9, 0.95, 0.99, 1 - 2e-3):
                z = stats.norm.ppf(0.5 + confidence / 2)
                ours = wilson_interval(successes, n, confidence)
                ref = _wilson_by_formula(successes, n, z)
                worst = max(worst, abs(ours[0] - ref[0]), abs(ours[1] - ref[1]))
                p = successes / n
                wald = (p - z * math.sqrt(p * (1 - p) / n), p + z * math.sqrt(p * (1 - p) / n))
                wald_worst = max(wald_worst, abs(wald[0] - ref[0]))
    assert worst < 1e-12, worst
    assert wald_worst > 1e-3
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)
