r"""K-SEQ, the draft-selection rule of SpecTr (Sun et al., NeurIPS 2023).

For k i.i.d. drafts :math:`x_1..x_k \sim q` (``draft``) and target :math:`p`
(``target``), with a division factor :math:`\rho \in [1, k]`:

.. math::

    \beta(\rho) = \sum_x \min\!\left(q(x), \frac{p(x)}{\rho}\right), \qquad
    g(\rho) = 1 - (1 - \beta(\rho))^k - \rho\, \beta(\rho).

For i = 1..k accept :math:`x_i` w.p. :math:`\min(1, p(x_i) / (\rho q(x_i)))`; if
all are rejected emit :math:`y \sim \mathrm{norm}\big((p - \min(p/\rho, q)\,
p_{acc}/\beta)_+\big)` with :math:`p_{acc} = 1 - (1-\beta)^k`. The output law is
exactly :math:`p` for every :math:`\rho` with :math:`g(\rho) \le 0`; the smallest
such, :math:`\rho^*`, maximises acceptance, which is then
:math:`\sum_x \min(p(x), \rho^* q(x)) \ge (1 - (1 - 1/k)^k)\, \alpha^*_{iid}`.

SpecTr writes the draft as p and the target as q; theory.md section 2.2 maps
the letters. :math:`\rho^*` is computed exactly (:func:`rho_star`): on each
interval between consecutive breakpoints :math:`p(x)/q(x)` one has
:math:`\beta(\rho) = A + B/\rho`, so :math:`g` is known in closed form there and
is non-increasing (its derivative is :math:`-k(1-\beta)^{k-1}B/\rho^2 - A \le 0`);
the bracketing interval is found from sorted prefix sums and the root in it by
Brent's method to machine precision.

>>> import numpy as np
>>> round(rho_star([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)
1.463325
>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)
0.78533

Pieces: its scheme ``otm.schemes.IID``; torch twin ``otm.torch.kseq`` with the batched rho* in ``otm/torch/_rho.py``; alpha* in ``otm.optimum`` (iid).
"""

from __future__ import annotations

import numpy as np

from ..laws import check_k, check_law
from .base import BoundVerifier, Outcome, accept, check_inputs, residual_law, residual_sample

SAFETY = 1e-14
"""rho* is rounded up by this relative amount so that g(rho) <= 0 holds in floating point."""


def guarantee(k):
    """SpecTr's guarantee for K-SEQ, :math:`1 - (1 - 1/k)^k` of the optimum (1 at k = 1, decreasing to
    1 - 1/e); a float for a number, an array for an array."""
    kk = np.asarray(k, dtype=float)
    out = 1.0 - (1.0 - 1.0 / kk) ** kk
    return float(out) if out.ndim == 0 else out


def beta(target: np.ndarray, draft: np.ndarray, rho: float) -> float:
    r""":math:`\beta(\rho) = \sum_x \min(q(x), p(x)/\rho)`."""
    return float(np.minimum(draft, target / rho).sum())


def _p_acc(b: float, k: int) -> float:
    """1 - (1 - b)^k without cancellation for small b."""
    if b >= 1.0:
        return 1.0
    return float(-np.expm1(k * np.log1p(-b)))


def g(target: np.ndarray, draft: np.ndarray, k: int, rho: float) -> float:
    r"""The validity function: the rule is valid iff g(rho) <= 0.

    Evaluated as :math:`g(\rho) = \sum_x (p - \rho q)_+ - \big(\sum_x (q - p/\rho)_+\big)^k`,
    which equals :math:`1 - (1-\beta)^k - \rho\beta` (use :math:`1 - \rho\beta = \sum (p - \rho q)_+`
    and :math:`1 - \beta = \sum (q - p/\rho)_+`) but keeps its accuracy where both
    :math:`1 - (1-\beta)^k` and :math:`\rho\beta` are close to 1 (near-identical laws).
    """
    over = float(np.maximum(target - rho * draft, 0.0).sum())
    under = float(np.maximum(draft - target / rho, 0.0).sum())
    return over - under**k


def rho_star(target, draft, k: int) -> float:
    """The smallest valid division factor, exactly (sorted breakpoints + Brent in the bracket)."""
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    k = check_k(k)
    if k == 1 or g(target, draft, k, 1.0) <= 0.0:
        return 1.0
    pos = draft > 0
    r = target[pos] / draft[pos]  # breakpoints p/q
    order = np.argsort(r, kind="stable")
    rs, ps, qs = r[order], target[pos][order], draft[pos][order]
    cum_p = np.concatenate([[0.0], np.cumsum(ps)])  # B(rho) = sum of p over r < rho
    cum_q = np.concatenate([[0.0], np.cumsum(qs)])  # sum of q over r < rho
    suf_q = np.concatenate([np.cumsum(qs[::-1])[::-1], [0.0]])  # A(rho) = sum of q over r >= rho
    # sum of p over r >= rho, including the tokens the draft never proposes (r = inf)
    suf_p = np.concatenate([np.cumsum(ps[::-1])[::-1], [0.0]]) + float(target[~pos].sum())

    def segment_g(rho: float, i: int) -> float:
        # on a segment: sum (p - rho q)_+ = suf_p - rho A and sum (q - p/rho)_+ = cum_q - B/rho
        over = max(suf_p[i] - rho * suf_q[i], 0.0)
        under = max(cum_q[i] - cum_p[i] / rho, 0.0)
        return over - under**k

    inner = rs[(rs > 1.0) & (rs < k)]
    points = np.concatenate([[1.0], inner, [float(k)]])
    idx = np.searchsorted(rs, points, side="left")  # number of breakpoints < rho
    gs = np.array([segment_g(pt, i) for pt, i in zip(points, idx)])
    first = int(np.argmax(gs <= 0.0)) if (gs <= 0.0).any() else len(points) - 1
    if first == 0:
        # g(1) > 0 above but <= 0 in the segment form: near-identical laws, where suf_p - suf_q cancels to
        # within rounding of a g(1) of ~1e-16. Bracket and solve with the direct form instead.
        from scipy.optimize import brentq

        direct = np.array([g(target, draft, k, pt) for pt in points[1:]])
        if not (direct <= 0.0).any():  # g(k) > 0 by rounding only: k is valid (as below)
            return float(k)
        first = 1 + int(np.argmax(direct <= 0.0))
        lo, hi = points[first - 1], points[first]
        root = brentq(lambda x: g(target, draft, k, x), lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
        return min(float(k), root * (1.0 + SAFETY))
    lo, hi = points[first - 1], points[first]
    seg = int(np.searchsorted(rs, lo, side="right"))  # A, B constant on (lo, hi)
    if segment_g(lo, seg) <= 0.0:  # g ~ 0 at a breakpoint: the two one-sided forms differ by rounding
        root = lo
    elif segment_g(hi, seg) >= 0.0:
        root = hi
    else:
        from scipy.optimize import brentq  # here, not at import: otm.torch reads SAFETY without scipy

        root = brentq(lambda x: segment_g(x, seg), lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    rho = min(float(k), root * (1.0 + SAFETY))
    return rho


def rho_star_bisect(target, draft, k: int, tol: float = 1e-12) -> float:
    """SpecTr's bisection for rho* (upper end of the final bracket), for cross-checks."""
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    lo, hi = 1.0, float(k)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if g(target, draft, k, mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


def _residual(target, draft, k, rho):
    r"""Unnormalised residual :math:`(p - \min(p/\rho, q)\, c)_+` with :math:`c = p_{acc}/\beta`.

    Evaluated as :math:`\max(p - c q,\ p\,\epsilon,\ 0)` with
    :math:`\epsilon = 1 - c/\rho = -g(\rho)/(\rho\beta) \ge 0` from the stable form of
    :func:`g` (the torch twin does the same): on the tokens with :math:`p < \rho q` the
    naive :math:`p - (p/\rho) c` is pure cancellation, ~1e-14 p at
    :math:`\rho^*(1 + \mathrm{SAFETY})`, while here it is exactly what g says.
    """
    b = beta(target, draft, rho)
    if b <= 0.0:
        return target.copy()
    c = _p_acc(b, k) / b
    eps = max(-g(target, draft, k, rho), 0.0) / (rho * b)
    return np.maximum(np.maximum(target - c * draft, target * eps), 0.0)


def law(target, draft, drafts, rho: float | None = None) -> np.ndarray:
    """Exact output law given the k drafts; ``rho`` defaults to :func:`rho_star`."""
    target, draft, d = check_inputs(target, draft, drafts)
    k = d.size
    rho = rho_star(target, draft, k) if rho is None else float(rho)
    out = np.zeros_like(target)
    stay = 1.0  # probability that every draft so far was rejected
    for x in d:
        a = min(1.0, target[x] / (rho * draft[x]))
        out[x] += stay * a
        stay *= 1.0 - a
    out += stay * residual_law(_residual(target, draft, k, rho), target)
    return out


def sample(target, draft, drafts, rng: np.random.Generator, rho: float | None = None) -> Outcome:
    """The K-SEQ loop: one uniform per draft, then one for the residual."""
    target, draft, d = check_inputs(target, draft, drafts)
    k = d.size
    rho = rho_star(target, draft, k) if rho is None else float(rho)
    for i, x in enumerate(d):
        if accept(rng, target[x], rho * draft[x]):
            return Outcome(int(x), i)
    return Outcome(residual_sample(rng, _residual(target, draft, k, rho), target), None)


def acceptance(target, draft, k: int) -> float:
    r"""Closed-form acceptance at :math:`\rho^*`: :math:`\sum_x \min(p(x), \rho^* q(x))`."""
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    rho = rho_star(target, draft, k)
    b = beta(target, draft, rho)
    return _p_acc(b, k)


def bind(target, scheme) -> BoundVerifier:
    rho = rho_star(target, scheme.draft, scheme.k)

    def _rho(d):
        return rho if len(d) == scheme.k else None

    return BoundVerifier(
        lambda d: law(target, scheme.draft, d, _rho(d)),
        lambda d, rng: sample(target, scheme.draft, d, rng, _rho(d)),
    )
