"""How many draws a statistical certification needs, and the tolerances it judges by: shared by the
one-node certification (:mod:`otm.certify.rules`) and the decoder's (:mod:`otm.certify.decoder`)."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from ..laws import OtmError
from ..testing import MIN_EXPECTED, pool_cells

LAW_TOLERANCE = 1e-9
"""Largest accepted ``max |out - target|`` (and sum error of one conditional law) for exact certification."""

POWER = 0.99
"""Power against every alternative at the requested total variation."""


def noncentrality_for_power(df: int, alpha: float, power: float = POWER) -> float:
    """The noncentrality at which the chi-square test with ``df`` degrees of freedom at level ``alpha`` has ``power``."""
    crit = stats.chi2.ppf(1.0 - alpha, df)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 1e-9, 1e7))


def draws_for(target: np.ndarray, tv: float, alpha: float, power: float = POWER) -> int:
    """Draws n such that the chi-square test at level ``alpha`` detects every output law at total
    variation >= ``tv`` from ``target`` (on the merged cells) with probability >= ``power``.

    Least favourable alternative: noncentrality ``4 n tv^2`` (module docstring). Cells with
    expected count below 5 are pooled, which depends on n: iterate until the pooling is stable.
    A target with one cell (a point mass) is tested by its impossible cells alone:
    ``1 - (1 - tv)^n >= power``.

    >>> draws_for(np.array([0.5, 0.3, 0.2]), 0.01, 1e-3)
    88119
    """
    if not 0 < tv < 1:
        raise OtmError(f"--tv must lie in (0, 1) (total variation to detect), got {tv!r}")
    support = target[target > 0]
    n_point = math.ceil(math.log(1 - power) / math.log(1 - tv))
    if support.size <= 1:
        return n_point
    n = 10_000
    for _ in range(20):
        groups = pool_cells(n * support, MIN_EXPECTED)
        df = int(groups.max())  # pooled cells - 1
        if df < 1:
            return n_point
        new = max(n_point, math.ceil(noncentrality_for_power(df, alpha, power) / (4 * tv * tv)))
        if new == n:
            break
        n = new
    return n


__all__ = ["LAW_TOLERANCE", "POWER", "noncentrality_for_power", "draws_for"]
