r"""Calibrated statistical tests of samplers against exact laws.

A sampler is tested by drawing ``n`` outcomes and comparing the counts with the
exact cell probabilities by Pearson's chi-square goodness-of-fit test at level
``alpha`` (the false-alarm rate). Cells with small expected counts are pooled
first so the chi-square approximation holds. An outcome in a cell of exact
probability 0 rejects outright.

The power against a specific wrong law ``p1`` (e.g. a planted bug) is computed
from the noncentral chi-square distribution with noncentrality
:math:`\lambda = n \sum_c (p_1(c) - p_0(c))^2 / p_0(c)` over the same pooled cells;
tests assert that power before they trust a pass, and run the planted bug
through the same test as a negative control.

>>> import numpy as np
>>> p0 = np.array([0.5, 0.3, 0.2])
>>> round(chi2_power(10_000, p0, np.array([0.52, 0.28, 0.2]), alpha=1e-3), 3)
0.847
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class GofResult:
    statistic: float
    df: int
    pvalue: float
    alpha: float
    impossible: int  # draws that fell in cells of exact probability 0

    @property
    def reject(self) -> bool:
        return self.impossible > 0 or self.pvalue < self.alpha

    def __str__(self) -> str:
        return (
            f"chi2={self.statistic:.2f} df={self.df} p={self.pvalue:.3g} alpha={self.alpha:g} "
            f"impossible={self.impossible} -> {'REJECT' if self.reject else 'accept'}"
        )


def wilson_interval(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Wilson score interval for a binomial proportion at ``confidence`` (scipy's
    ``binomtest(...).proportion_ci(method="wilson")``); ``(0, 1)`` when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def pool_cells(expected: np.ndarray, min_expected: float) -> np.ndarray:
    """Cell -> pooled-cell index, pooling the cells with expected count below ``min_expected``."""
    groups = np.arange(expected.size)
    small = np.flatnonzero(expected < min_expected)
    if small.size == 0:
        return groups
    big = np.flatnonzero(expected >= min_expected)
    if big.size == 0:
        return np.zeros(expected.size, dtype=int)
    pool_id = big.size
    groups = np.empty(expected.size, dtype=int)
    groups[big] = np.arange(big.size)
    groups[small] = pool_id
    if expected[small].sum() < min_expected:  # fold the pool into the smallest big cell
        smallest = big[np.argmin(expected[big])]
        groups[small] = groups[smallest]
        _, groups = np.unique(groups, return_inverse=True)
    return groups


def _pooled(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    return np.bincount(groups, weights=values, minlength=groups.max() + 1)


def chi2_gof(counts, probs, alpha: float = 1e-3, min_expected: float = MIN_EXPECTED) -> GofResult:
    """Pearson chi-square test of ``counts`` against exact cell probabilities ``probs``."""
    counts = np.asarray(counts, dtype=float)
    probs = np.asarray(probs, dtype=float)
    n = counts.sum()
    support = probs > 0
    impossible = int(counts[~support].sum())
    e = n * probs[support]
    groups = pool_cells(e, min_expected)
    e_pool = _pooled(e, groups)
    o_pool = _pooled(counts[support], groups)
    df = e_pool.size - 1
    if df < 1:
        return GofResult(0.0, 0, 1.0, alpha, impossible)
    stat = float(((o_pool - e_pool) ** 2 / e_pool).sum())
    return GofResult(stat, df, float(stats.chi2.sf(stat, df)), alpha, impossible)


def chi2_power(n: int, probs0, probs1, alpha: float = 1e-3, min_expected: float = MIN_EXPECTED) -> float:
    """Power of :func:`chi2_gof` with ``n`` draws when the sampler's true law is ``probs1``."""
    p0 = np.asarray(probs0, dtype=float)
    p1 = np.asarray(probs1, dtype=float)
    support = p0 > 0
    off = float(p1[~support].sum())  # mass on impossible cells: caught outright
    groups = pool_cells(n * p0[support], min_expected)
    q0 = _pooled(p0[support], groups)
    q1 = _pooled(p1[support], groups)
    df = q0.size - 1
    power_impossible = 1.0 - (1.0 - off) ** n
    if df < 1:
        return power_impossible
    lam = n * float(((q1 - q0) ** 2 / q0).sum())
    crit = stats.chi2.ppf(1.0 - alpha, df)
    return max(float(stats.ncx2.sf(crit, df, lam)), power_impossible)


def membership_cells(law_of, scheme, V: int) -> np.ndarray:
    """Exact law of the 2V cells (y, y is one of the drafts) of a verifier's output.

    ``law_of(drafts)`` is the verifier's exact output law [V] given one draft tuple and
    ``scheme.enumerate()`` the tuples with their probabilities. Cell ``y`` holds
    P(output = y, y not among the drafts), cell ``V + y`` P(output = y, y among the drafts): the
    statistical tests compare a sampler's counts over these cells, which catches a rule that
    returns the right token law through the wrong mix of acceptances and residual draws.
    """
    out = np.zeros(2 * V)
    tuples, probs = scheme.enumerate()
    for tup, pr in zip(tuples, probs):
        law = np.asarray(law_of(tup), dtype=np.float64)
        member = np.isin(np.arange(V), tup)
        out[:V] += pr * np.where(member, 0.0, law)
        out[V:] += pr * np.where(member, law, 0.0)
    return out
