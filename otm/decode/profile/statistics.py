r"""The intervals of ``otm profile`` (step 3 of :mod:`otm.decode.profile`) and its block-efficiency formula (step 4).

A mean over all positions with a 95% percentile bootstrap over prompts (each prompt resampled with
all its positions) when there are at least :data:`MIN_BOOTSTRAP_PROMPTS` prompts, else the normal
interval over positions; :func:`predicted_block_efficiency` is ``1 + sum_{d=1..L} prod_{j<=d} a_j``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap

BOOTSTRAP_RESAMPLES = 2000
MIN_BOOTSTRAP_PROMPTS = 4
"""With fewer prompts the interval is the normal one over positions (a bootstrap over 2-3 prompts says little)."""


@dataclass
class Stat:
    """A mean with its 95% interval ``[lo, hi]`` (NaN where it cannot be formed, e.g. one position)."""

    mean: float
    lo: float
    hi: float


def interval_method(n_prompts: int) -> str:
    if n_prompts >= MIN_BOOTSTRAP_PROMPTS:
        return (f"95% percentile bootstrap over the {n_prompts} prompts ({BOOTSTRAP_RESAMPLES} resamples, "
                "each prompt with all its positions)")
    return (f"95% normal interval over positions, mean +- 1.96 sd/sqrt(n) (fewer than {MIN_BOOTSTRAP_PROMPTS} "
            "prompts for a bootstrap; it treats positions of one continuation as independent, which they are not)")


def interval(values, *, denominator=None, seed: int = 0) -> Stat:
    """Mean over all positions of ``values`` (a list per prompt of per-position numbers), or the ratio of
    means ``sum(values) / sum(denominator)``, with its 95% interval (:func:`interval_method`)."""
    groups = [np.asarray(v, dtype=np.float64) for v in values]
    dens = None if denominator is None else [np.asarray(v, dtype=np.float64) for v in denominator]
    num_all = np.concatenate(groups)
    den_all = np.ones_like(num_all) if dens is None else np.concatenate(dens)
    mean = float(num_all.sum() / den_all.sum())
    n_prompts = len(groups)
    if n_prompts >= MIN_BOOTSTRAP_PROMPTS:
        sums = np.array([g.sum() for g in groups])
        weights = np.array([len(g) for g in groups], dtype=np.float64) if dens is None else np.array([d.sum() for d in dens])
        # prompts resampled as units: (sum, weight) pairs, the statistic their ratio of totals
        ci = bootstrap((sums, weights), lambda s, w, axis=-1: s.sum(axis) / w.sum(axis), paired=True, vectorized=True,
                       n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=0.95, method="percentile",
                       random_state=np.random.default_rng([seed, 19])).confidence_interval
        return Stat(mean, float(ci.low), float(ci.high))
    n = num_all.size
    if n < 2:
        return Stat(mean, float("nan"), float("nan"))
    if dens is None:
        half = 1.96 * num_all.std(ddof=1) / math.sqrt(n)
    else:  # delta method for a ratio of means
        a, o = num_all, den_all
        r = mean
        cov = np.cov(a, o, ddof=1)
        var = (cov[0, 0] - 2 * r * cov[0, 1] + r * r * cov[1, 1]) / (o.mean() ** 2 * n)
        half = 1.96 * math.sqrt(max(var, 0.0))
    return Stat(mean, mean - half, mean + half)


def predicted_block_efficiency(acceptance, length: int) -> float:
    """``1 + sum_{d=1..L} prod_{j<=d} a_j``: a number ``a`` is used at every depth (``1 + a + ... + a^L``),
    a sequence gives ``a_1 .. a_L`` (depths never reached, NaN, end the sum: nothing got there)."""
    rates = [float(acceptance)] * length if np.isscalar(acceptance) else [float(a) for a in acceptance][:length]
    total, prod = 1.0, 1.0
    for a in rates:
        if a != a:  # NaN: a depth no verification reached
            break
        prod *= a
        total += prod
    return total

