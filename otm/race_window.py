r"""Fast :math:`\alpha^*` for drafts without replacement, k >= 3: certified pruning plus a race scan on a window.

The reference (:func:`otm.optimum._race_inside`) computes :math:`Q(H_j)` for all
:math:`V + 1` prefixes of the ratio order by a token-by-token scan of the exponential
race (module :mod:`otm.optimum`), :math:`O(V k G)` work in :math:`V` Python steps.
Only the prefixes near the minimiser matter. This module computes :math:`Q(H_j)`
exactly (same quadrature, same grid) only where the minimum can be, and proves the
other prefixes cannot hold it.

**1. Bounds without quadrature.** With :math:`c_j = q(\Sigma \setminus H_j)` and
:math:`S_i` the sum of the :math:`i` largest draft masses, successive sampling
draws its (i+1)-th token inside :math:`H` with conditional probability
:math:`(q(H) - q(D_i))/(1 - q(D_i))`, :math:`D_i` the first i drafts; this lies in
:math:`[1 - c/(1 - S_i),\; 1 - c]`, so

.. math::

    \prod_{i<k} \big(1 - c_j/(1 - S_i)\big)_+ \;\le\; Q(H_j) \;\le\; (1 - c_j)^k ,

giving :math:`L_j \le \alpha^*(j) = P_j + 1 - Q(H_j) \le U_j`. A prefix with
:math:`L_j > \min_i U_i` cannot be the minimiser.

**1b. Heavy-token bounds** (:mod:`otm.race_heavy`). The upper bound :math:`(1 - c)^k` ignores
that a drafted heavy token leaves less mass to draw from: with one draft token of mass ~1 and
the rest ~1e-14 it is ~1 at every prefix while Q is ~(q(H - a)/(1 - q_a))^{k-1}, so no prefix
was excluded and 30-40 were evaluated directly on a grid of ~300 nodes. Following the (at most 3)
heavy tokens one by one -- a walk over (heavy tokens drafted, number of light drafts), the light
drafted mass only known to lie in [0, W_u] -- gives certified bounds on both sides, computed at
:data:`HEAVY_SAMPLES` prefixes spread over the candidates (when more than :data:`HEAVY_FROM`
survive step 1). Their lower bounds on Q lower the best value; their upper bounds are chord end
points (step 2), so one round usually leaves a few hundred candidates around the minimiser.
With more than 3 heavy tokens (four of 0.25 among masses of 1e-14: 42 ms), a second walk that
counts the heavy drafts instead of naming them (:func:`~otm.race_heavy.heavy_count_bounds`, exact for equal heavy
masses) is evaluated too, and the tighter of the two bounds kept.

**2. Chords.** :math:`Q(H_j)` is non-decreasing in j (the sets are nested) and, by the
exchange inequality (E) of :mod:`otm.optimum`, *convex in the draft mass*
:math:`m_j = q(H_j)`: the slope :math:`(Q(H_j) - Q(H_{j-1}))/q_{x_j}` never decreases
along the order. So between two prefixes :math:`a < j < b` where Q is known,
:math:`Q(H_j) \le Q(H_a) + \frac{m_j - m_a}{m_b - m_a}(Q(H_b) - Q(H_a))` and
:math:`\alpha^*(j) \ge P_j + 1 -` that chord (with :math:`Q = 0` below k tokens and
:math:`Q = 1` on the whole support as the first end points). The masses
:math:`m_j - m_a` are summed within the gap (never as a difference of two prefix sums,
which loses a mass of 1e-12 next to 1), and their rounding bound is taken off.
A prefix is dropped when its bound exceeds the least upper bound on :math:`\alpha^*` by
more than :data:`MARGIN` (the quadrature errors are ~1e-13), or when it is at least the least
*computed* value minus :data:`TIE` = 1e-13 (such a prefix cannot improve the minimum by more
than TIE: without this, a run of thousands of prefixes tied with the minimum -- p and Q both
~0 on tiny tokens -- would all be computed). Exact values at a few prefixes
(step 3) tighten both; runs of survivors are split (at most :data:`SPLIT` new
prefixes per run and round) until each run fits a :data:`WINDOW`.

**3. Q at a few prefixes at once** (:func:`states_at`). For a prefix H and a race node
t, the law of the number :math:`N_H(t)` of rung clocks (truncated at k) splits by the
size of :math:`x = q_x t`:

* tokens with :math:`x \le \tau` (``TAU`` = 1/2): their generating function is
  :math:`\prod (e^{-x} + (1 - e^{-x}) z) = e^{-\sum x} \exp\big(\sum_{r \ge 1}
  (-1)^{r+1} p_r z^r / r\big)` with :math:`p_r = \sum (e^x - 1)^r`, and
  :math:`(e^x - 1)^r = r! \sum_{n \ge r} S(n, r)\, x^n / n!` (Stirling numbers of the
  second kind), so :math:`p_r` is a fixed combination of the power sums
  :math:`\sum x^n = t^n \sum q_x^n`: one pass over the tokens serves every node.
  The series is cut at :math:`n = N` with relative tail at most ``SERIES_TAIL``
  (the tail/sum ratio of a series with non-negative coefficients grows with x, so
  it is bounded at :math:`x = \tau`); :math:`e^x - 1 \le 0.65` keeps the
  coefficient recursion well conditioned;
* tokens with :math:`x > \tau`, in decreasing mass: the exact product, the same
  update as the reference scan. When more than ``R`` of them exist at a node,
  the product over the ``R`` largest already gives :math:`P(N < k) \le`
  ``RUNG_TOLERANCE`` there (checked at every such node; else R doubles), so
  :math:`F_H(t) = 1` within that bound.

**4. Scan of the survivors.** From an exactly known state the reference update
(:math:`F \leftarrow F + b\,\mathrm{pmf}_{k-1}`,
:math:`\mathrm{pmf}_m \leftarrow e\,\mathrm{pmf}_m + b\,\mathrm{pmf}_{m-1}`) runs
token by token over each run of survivors, on to the next directly evaluated prefix
when that is within ``2 WINDOW`` tokens, where the two computations are compared
(``Window.check``; without such a window the minimiser is evaluated directly). The
caller (:func:`otm.optimum.optimal_acceptance_of`) refuses a check above
``CHECK_TOLERANCE`` = 1e-10 and then runs the reference scan, saying so in
``Optimum.note``; it does the same when the grid would need :math:`t > e^{700}`.

Every value is a trapezoid sum on the reference's grid (:func:`otm.race_quadrature.race_grid`,
cut at :math:`45 / c` for the smallest complement mass c among the candidate prefixes,
not among all prefixes, so G is ~100-130 instead of the reference's 250-2000 nodes),
with the same error estimate :math:`|T_h - T_{2h}|` and the same step refinement. Its lower
cut rises where :math:`c\, e_k(q_H)` is small (:func:`ek_bound`; the part cut off stays below
1e-17): a dominant token among tiny masses starts the grid at t ~ 1e7 instead of 0.06 (G ~110-150
instead of ~300).

What is proved and what is measured: the bounds of steps 1-2 and the truncations of
step 3 are rigorous (up to float rounding, bounded in place); the quadrature error is
estimated, as in the reference. Measured against the reference scan: 7e-14 at
V = 49152 (docs/closed_form.md), 1e-12 asserted at V = 3000 and against brute force
at V <= 8 (tests/test_optimum.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

import numpy as np

# Heavy and heavy_tokens are re-exported (the heavy-token bounds lived here)
from .race_heavy import Heavy, heavy_bounds, heavy_count_bounds, heavy_sets, heavy_tokens  # noqa: F401
from .race_quadrature import race_grid, trapezoid, weights

TAU = 0.5
"""Largest ``q_x t`` handled by the moment series (``e^x - 1 <= 0.65``)."""

SERIES_TAIL = 1e-18
"""Relative truncation of the Stirling series of ``(e^x - 1)^r`` at ``x = TAU``."""

RUNG_TOLERANCE = 1e-17
"""Largest ``P(N < k)`` set to 0 at a node where the largest tokens have surely rung."""

POWER_DROP_TOTAL = 1e-17
"""Bound on the change of each power sum p_r from the terms (q_x t)^n left out of the moment series."""

FLUSH = 1e-280
"""Probabilities and power-sum terms below this are set to 0 (they would turn subnormal, whose arithmetic is ~100x slower); the change is below 1e-275 in any Q."""

WINDOW = 192
"""Largest run of prefixes scanned token by token; longer runs are split by more evaluated prefixes."""

EPS = float(np.finfo(np.float64).eps)

SPLIT = 32
"""Most prefixes evaluated at once in one run of survivors (coarse to fine)."""

MARGIN = 1e-11
"""A prefix is pruned by the bound-only best value (least U_j) only when its lower bound exceeds it by this much (quadrature errors are ~1e-13)."""

TIE = 1e-13
"""A prefix whose lower bound is within this of the least computed value is not computed: the
returned minimum is then within TIE of the exact prefix minimum (needed where thousands of prefixes
tie with the minimum, e.g. Q and p both ~0 on a long run of tiny tokens)."""

HEAVY_SAMPLES = 64
"""Prefixes per round at which :func:`heavy_bounds` is evaluated (spread evenly over the candidates)."""

HEAVY_ROUNDS = 4
"""Most rounds of heavy-token bounds before the direct evaluations start."""

HEAVY_FROM = 2 * WINDOW
"""The heavy-token bounds are used only when more candidate prefixes than this survive the cheap bounds."""


def ek_bound(qH: np.ndarray, k: int, m: int | None = None) -> float:
    r"""An upper bound on the elementary symmetric polynomial :math:`e_k` of the masses ``qH``.

    With A the ``m`` largest masses and r the sum of the others,
    :math:`e_k(q) = \sum_i e_i(q_A)\, e_{k-i}(q_{\setminus A}) \le \sum_i e_i(q_A)\, r^{k-i}/(k-i)!`
    (Maclaurin: :math:`e_j \le (\sum)^j / j!`). Sums of non-negative terms only; 1e-9 relative
    is added for their rounding. Tight for a dominant token (about :math:`r^{k-1}/(k-1)!`), and
    at most :math:`q(H)^k/k!` otherwise.
    """
    n = qH.size
    m = min(k if m is None else m, n)  # default: the k largest masses
    if m == 0:
        return 0.0
    part = np.partition(qH, n - m)
    top = part[n - m :]
    r = float(part[: n - m].sum())
    e = [1.0] + [0.0] * k  # e_i of the top masses
    for x in top.tolist():
        for i in range(min(k, m), 0, -1):
            e[i] += e[i - 1] * x
    total = sum(e[i] * r ** (k - i) / math.factorial(k - i) for i in range(min(k, m) + 1))
    return total * (1 + 1e-9)


@lru_cache(maxsize=None)
def series_table(k: int) -> np.ndarray:
    r"""``C[r - 1, n] = r! S(n, r) / n!`` for ``r = 1..k-1``, ``n = 0..N-1``: :math:`(e^x-1)^r = \sum_n C_{r,n} x^n`.

    ``N`` is the smallest length whose tail at ``x = TAU`` is below
    :data:`SERIES_TAIL` relative to :math:`(e^{\tau}-1)^r` for every r (computed in
    exact rational arithmetic up to the float conversion).
    """
    rmax = max(k - 1, 1)
    nmax = 120
    S = [[0] * (rmax + 1) for _ in range(nmax + 1)]  # Stirling numbers of the second kind
    S[0][0] = 1
    for n in range(1, nmax + 1):
        for r in range(1, rmax + 1):
            S[n][r] = r * S[n - 1][r] + S[n - 1][r - 1]
    C = [[Fraction(math.factorial(r) * S[n][r], math.factorial(n)) for n in range(nmax + 1)] for r in range(1, rmax + 1)]
    tau = Fraction(TAU)
    N = 1
    for r in range(1, rmax + 1):
        total = (math.e**TAU - 1) ** r
        tail = 0.0
        for n in range(nmax, 0, -1):  # smallest N with sum_{n >= N} C tau^n <= SERIES_TAIL * total
            tail += float(C[r - 1][n] * tau**n)
            if tail > SERIES_TAIL * total:
                N = max(N, n + 1)
                break
    return np.array([[float(c) for c in row[:N]] for row in C])


@dataclass
class Window:
    """What the fast path did: evaluated prefixes, scanned windows, and the checks."""

    points: list = field(default_factory=list)  # prefixes evaluated by states_at
    windows: list = field(default_factory=list)  # (start, stop) scanned token by token
    check: float = 0.0  # largest |scan - states_at| where both computed a prefix (window ends, or the minimiser)
    checked: int = 0  # windows that ended on a directly evaluated prefix
    rounds: int = 0
    explicit: int = 0  # largest number of explicit tokens per node used
    nodes: int = 0  # race grid size G
    heavy: int = 0  # prefixes at which heavy_bounds was evaluated


def states_at(qp: np.ndarray, J: np.ndarray, y: np.ndarray, k: int,
              info: Window | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Truncated count law of the race at every node for the prefixes ``qp[:j]``, ``j`` in ``J``.

    Returns ``pmf`` of shape (M, k, G), ``pmf[i, m, g] = P(N(t_g) = m)`` for ``m < k``, and
    ``tail`` of shape (M, G), ``P(N(t_g) >= k)``. Method: module docstring, step 3. With ``info``,
    the number of explicit tokens per node used is recorded in ``info.explicit``.
    """
    J = np.asarray(J, dtype=np.int64)
    M, G = J.size, y.size
    h = float(y[1] - y[0])
    t = np.exp(y)
    last = int(J.max())
    q = qp[:last]
    logq = np.log(q)
    # token x is small (q_x t <= TAU) at nodes g <= gx
    gx = np.floor((math.log(TAU) - logq - y[0]) / h).astype(np.int64)
    gx = np.clip(gx, -1, G - 1)  # -1: large at every node
    pos = np.arange(last)
    seg = np.searchsorted(J, pos, side="right")  # token in H_j for the points j = J[seg:]
    # ---- small tokens: power sums by (point, bucket), scaled per bucket: v = q t_gx <= TAU
    C = series_table(k)
    N = C.shape[1]
    small = gx >= 0
    gs = gx[small]
    v = np.exp(logq[small] + y[gs])  # q t at the token's last small node
    key = seg[small] * G + gs
    B = np.empty((N, M * G))
    # a term (q t)^n <= v^n below `drop` is left out: each p_r then moves by at most
    # N * max(C) * (number of tokens) * drop <= POWER_DROP_TOTAL in absolute value
    drop = POWER_DROP_TOTAL / (N * float(C.max()) * max(v.size, 1))
    B[0] = 0.0  # n = 0 (the count) never enters: C[r, 0] = 0
    pw = v.copy()
    for n in range(1, N):
        B[n] = np.bincount(key, weights=pw, minlength=M * G)
        pw = pw * v
        keep = pw >= drop
        if keep.sum() < 0.8 * keep.size:  # compact the active tokens (the powers shrink geometrically)
            pw, v, key = pw[keep], v[keep], key[keep]
        else:
            pw[~keep] = 0.0
    B = B.reshape(N, M, G).cumsum(axis=1)  # over points: H_j grows
    # s_n(i, g) = sum over buckets gb >= g of B_n[i, gb] e^{-n h (gb - g)}
    decay = np.exp(-h * np.arange(N))[:, None]
    s = np.empty((N, M, G))
    acc = np.zeros((N, M))
    for g in range(G - 1, -1, -1):
        acc = acc * decay + B[:, :, g]
        s[:, :, g] = acc
    # p_r = sum_n C[r, n] s_n ; log GF = -s_1 + sum_r (-1)^{r+1} p_r z^r / r
    p = np.einsum("rn,nmg->rmg", C[:, :N], s) if k > 1 else np.zeros((0, M, G))
    a = np.zeros((k, M, G))
    a[0] = 1.0
    for m in range(1, k):  # e_m of the odds, by Newton's identities with the signs folded in
        acc2 = np.zeros((M, G))
        for r in range(1, m + 1):
            acc2 += (p[r - 1] if r % 2 else -p[r - 1]) * a[m - r]
        a[m] = acc2 / m
    with np.errstate(under="ignore"):
        a *= np.exp(-s[1])[None] if N > 1 else 1.0  # e^{-sum x}: sum x = s_1
    # ---- large tokens (q t > TAU at some node): exact product, by decreasing mass over all points
    big = np.flatnonzero(gx < G - 1)
    # by first large node (non-increasing mass up to ties within a node): a radix sort, G < 2^15
    big = big[np.argsort(gx[big].astype(np.int16 if G < 2**15 else np.int64), kind="stable")]
    gb = gx[big]
    first_point = np.searchsorted(J, big, side="right")  # the token is in H_j for the points J[i0:]
    # large tokens of H_j at node g (those with gx < g), a 2-D cumulative count
    nbig = np.bincount(first_point * (G + 1) + (gb + 1), minlength=(M + 1) * (G + 1)).reshape(M + 1, G + 1)
    nbig = nbig.cumsum(axis=0).cumsum(axis=1)[:M, :G]
    pm = np.zeros((k, M, G))
    pm[0] = 1.0
    tl = np.zeros((M, G))
    done = np.zeros((M, G), dtype=np.int64)  # large tokens processed at (point, node)
    g_hi = G  # nodes >= g_hi: P(N < k) <= RUNG_TOLERANCE for every point already
    for r in range(big.size):
        g0, i0 = int(gb[r]) + 1, int(first_point[r])
        if g0 >= g_hi:
            break  # this and every later token is large only at settled nodes
        if i0 < M:
            x = q[big[r]] * t[g0:g_hi]
            b = -np.expm1(-x)
            e = np.exp(-x)
            sl = (slice(i0, M), slice(g0, g_hi))
            tl[sl] += pm[k - 1][sl] * b
            low = pm[:, i0:, g0:g_hi]
            low[1:] = low[1:] * e + low[:-1] * b
            low[0] *= e
            low[low < FLUSH] = 0.0
            done[sl] += 1
        if r % 8 == 7 or r == big.size - 1:  # checkpoint: which nodes are settled for every point
            settled = np.all((pm.sum(axis=0) <= RUNG_TOLERANCE) | (np.arange(G) >= g_hi), axis=0)
            unsettled = np.flatnonzero(~settled)
            g_hi = int(unsettled[-1]) + 1 if unsettled.size else 0
            if np.all(done[:, :g_hi] == nbig[:, :g_hi]):
                break
    if np.any(done[:, :g_hi] != nbig[:, :g_hi]):  # pragma: no cover - every large token below g_hi is processed
        raise RuntimeError("race_window.states_at: a large token was left out below the settled nodes (a bug)")
    over = np.zeros((M, G), dtype=bool)
    over[:, g_hi:] = True  # F = 1 within RUNG_TOLERANCE
    if info is not None:
        info.explicit = max(info.explicit, int(done.max()))
    # ---- combine: N = N_large + N_small
    pmf = np.zeros((k, M, G))
    for m in range(k):
        for i in range(m + 1):
            pmf[m] += pm[i] * a[m - i]
    small_below = np.cumsum(a, axis=0)  # P(N_small <= m)
    tail = tl.copy()
    for i in range(k):
        tail += pm[i] * (1.0 - small_below[k - 1 - i])  # N_small >= k - i
    if np.any(over):
        pmf[:, over] = 0.0
        tail[over] = 1.0
    return np.moveaxis(pmf, 0, 1), tail


def add_clocks(pmf: np.ndarray, tail: np.ndarray, rung: np.ndarray, stay: np.ndarray, F: np.ndarray,
               tmp: np.ndarray) -> np.ndarray:
    """The race's token-by-token update, in place: clock i rings by t with probability ``rung[i]``
    (``stay[i] = 1 - rung[i]``); ``pmf [k, G]`` = P(N = m), m < k, and ``tail [G]`` = P(N >= k) on
    entry; ``F[i]`` = P(N >= k) after clock i. Returns the last tail (a row of F)."""
    k = pmf.shape[0]
    for i in range(rung.shape[0]):
        b = rung[i]
        np.multiply(pmf[k - 1], b, out=F[i])  # a new clock lifts the count from k-1 to k with probability b
        F[i] += tail
        tail = F[i]
        np.multiply(pmf[:-1], b, out=tmp)
        pmf *= stay[i]
        pmf[1:] += tmp
    return tail


def scan(pmf0: np.ndarray, tail0: np.ndarray, qs: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The reference token-by-token update from a known state; returns ``F`` rows after each token, shape (len(qs), G)."""
    k = pmf0.shape[0]
    pmf = pmf0.copy()
    tail = tail0.copy()
    F = np.empty((qs.size, t.size))
    tmp = np.empty((k - 1, t.size))
    x = np.multiply.outer(qs, t)
    stay = np.exp(-x)
    rung = -np.expm1(-x)
    add_clocks(pmf, tail, rung, stay, F, tmp)
    return F


def _quadrature(F: np.ndarray, c: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q = trapezoid sums of ``c t e^{-ct} F`` in ``y = log t`` (step h = y[1] - y[0]) and their error
    estimate against the step-2h rule (:func:`otm.race_quadrature.trapezoid`)."""
    return trapezoid(weights(c, y), F, float(y[1] - y[0]))


@dataclass
class PrefixSearch:
    """What :func:`window_inside` knows about the prefixes ``H_0 .. H_n`` of one law as it narrows them down.

    Fixed for the law: ``qp`` (positive draft masses in ratio order), ``k``, ``c`` (complement masses
    c_j), ``P`` (target masses P_j), ``L`` (the lower bounds of step 1) and ``rest`` (1 - S_i, the mass
    left after the i largest). Filled in place: ``inside`` and ``error`` (Q(H_j) and its quadrature
    estimate where computed, NaN elsewhere), ``q_up`` (heavy-token upper bounds on Q, NaN elsewhere).
    Updated as the search goes: ``use_heavy`` (lower bounds also take chords through ``q_up``),
    ``u_min`` (the least upper bound U_j found), ``attained`` (the least value of a computed prefix) and
    ``best`` (the least upper bound on the minimum).
    """

    qp: np.ndarray
    k: int
    c: np.ndarray
    P: np.ndarray
    L: np.ndarray
    rest: np.ndarray
    inside: np.ndarray
    error: np.ndarray
    q_up: np.ndarray
    use_heavy: bool = False
    u_min: float = math.inf
    attained: float = math.inf
    best: float = math.inf

    @classmethod
    def start(cls, qp: np.ndarray, pt: np.ndarray, k: int) -> PrefixSearch:
        """Step 1's bounds; Q known only below k tokens (0) and on the whole support (1)."""
        n = qp.size
        c = np.zeros(n + 1)
        c[:n] = np.cumsum(qp[::-1])[::-1]
        P = np.zeros(n + 1)
        np.cumsum(pt, out=P[1:])
        inside = np.full(n + 1, np.nan)
        error = np.zeros(n + 1)
        inside[:k] = 0.0  # fewer than k tokens
        inside[n] = 1.0  # the whole support
        q_up = np.full(n + 1, np.nan)  # heavy-token upper bounds on Q at some prefixes (NaN elsewhere)
        with np.errstate(divide="ignore"):
            L = P - np.expm1(k * np.log1p(-np.minimum(c, 1.0)))  # Q <= (1 - c)^k; c <= 1 up to rounding
        part = np.partition(qp, n - (k - 1))
        top = np.sort(part[n - (k - 1) :])[::-1]  # the k - 1 largest masses
        rest = part[: n - (k - 1)].sum() + np.array([top[i:].sum() for i in range(k)])  # 1 - S_i, no cancellation
        s = cls(qp=qp, k=k, c=c, P=P, L=L, rest=rest, inside=inside, error=error, q_up=q_up)
        s.u_min = float(s.upper_bounds(np.arange(0, n + 1, 16)).min())  # a first upper bound on alpha*
        s.attained = s.least_computed()
        s.best = min(s.u_min, s.attained)
        return s

    def upper_bounds(self, js: np.ndarray) -> np.ndarray:
        """U_j = P_j + 1 - prod_i (1 - c_j / (1 - S_i))_+ >= alpha*(j)."""
        with np.errstate(divide="ignore", over="ignore"):  # c / rest may overflow: the factor is then 0
            log_low = np.log1p(-np.minimum(1.0, self.c[js, None] / self.rest[None, :])).sum(axis=1)
        return self.P[js] - np.expm1(log_low)

    def lower_bounds(self, js: np.ndarray) -> np.ndarray:
        """max(L_j, P_j + 1 - chord_j): the chord of Q, as a function of the draft mass, between the
        computed prefixes a < j < b around j (Q is convex in it: module docstring, step 2)."""
        lb = np.maximum(self.L[js], self.P[js] + 1 - chords(self.qp, self.inside, js))
        if self.use_heavy:  # chords between upper bounds too: exact values, else heavy-token bounds
            known = np.where(np.isnan(self.inside), self.q_up, self.inside)
            lb = np.maximum(lb, self.P[js] + 1 - chords(self.qp, known, js))
        return lb

    def is_open(self, lb: np.ndarray) -> np.ndarray:
        """Prefixes still in the running: their bound may beat the best value (with MARGIN against
        rounding), and may beat the least computed value by more than TIE (else the returned minimum
        is within TIE of theirs)."""
        return (lb <= self.best + MARGIN) & (lb < self.attained - TIE)

    def least_computed(self) -> float:
        """The least ``P_j + 1 - Q(H_j)`` over the prefixes where Q is known."""
        known = ~np.isnan(self.inside)
        return float(np.min(self.P[known] + 1 - self.inside[known]))


def chords(qp: np.ndarray, vals: np.ndarray, js: np.ndarray) -> np.ndarray:
    """Upper bound on Q(H_j) at the sorted prefixes ``js`` from the chord between the prefixes around j
    where ``vals`` (upper bounds on Q, or Q itself; NaN where unknown) is known.

    The masses q(H_j minus H_a) are summed from a within each gap, so their relative rounding is
    at most (b - a) eps however small they are next to q(H_a); that bound is added to the chord.
    """
    if js.size == 0:
        return np.empty(0)
    ev = np.flatnonzero(~np.isnan(vals))
    i = np.searchsorted(ev, js, side="left").clip(1, ev.size - 1)
    a, b = ev[i - 1], ev[i]
    chord = np.empty(js.size)
    cut = np.flatnonzero(np.diff(a)) + 1  # js is sorted: the gaps are runs of equal a
    for lo_, hi_ in zip(np.concatenate([[0], cut]), np.concatenate([cut, [js.size]])):
        sel = slice(int(lo_), int(hi_))
        ga, gb = int(a[lo_]), int(b[lo_])
        local = np.cumsum(qp[ga:gb])  # local[j - a - 1] = q(H_j) - q(H_a)
        frac = local[js[sel] - ga - 1] / local[-1]
        rise = vals[gb] - vals[ga]
        chord[sel] = vals[ga] + frac * rise + 4 * (gb - ga) * EPS * rise
    return chord


def split_run(s_lo: int, s_hi: int) -> list[int]:
    """Prefixes to evaluate so that the run s_lo..s_hi falls into gaps of about WINDOW (at most SPLIT at once)."""
    m = min(SPLIT, int(np.ceil((s_hi - s_lo + 1) / WINDOW)))
    return np.unique(np.linspace(s_lo - 1, s_hi, m + 1).round().astype(np.int64)).tolist()


def heavy_rounds(s: PrefixSearch, cand: np.ndarray, info: Window) -> np.ndarray:
    """Step 1b: heavy-token bounds at prefixes spread over the candidates ``cand``, for up to
    :data:`HEAVY_ROUNDS` rounds while more than :data:`HEAVY_FROM` candidates are left. Their lower
    bounds on Q lower ``s.u_min`` and ``s.best``; their upper bounds go to ``s.q_up`` as chord end
    points (Q is convex in the mass). Returns the candidates still open."""
    hsets = heavy_sets(s.qp, s.k) if cand.size > HEAVY_FROM else []
    for _ in range(HEAVY_ROUNDS if hsets else 0):
        js = np.unique(cand[np.linspace(0, cand.size - 1, HEAVY_SAMPLES).round().astype(np.int64)])
        q_lo, q_hi = np.zeros(js.size), np.ones(js.size)
        for kind, hv in hsets:  # every set gives valid bounds: keep the tightest
            lo_, hi_ = (heavy_bounds if kind == "subset" else heavy_count_bounds)(hv, s.k, js)
            q_lo, q_hi = np.maximum(q_lo, lo_), np.minimum(q_hi, hi_)
        s.q_up[js] = np.fmin(s.q_up[js], q_hi)
        s.use_heavy = True
        s.u_min = min(s.u_min, float(np.min(s.P[js] + 1 - q_lo)))
        s.best = min(s.u_min, s.attained)
        info.heavy += js.size
        before = cand.size
        cand = cand[s.is_open(s.lower_bounds(cand))]
        if cand.size <= HEAVY_FROM or cand.size > 0.5 * before:
            break
    return cand


def evaluate(s: PrefixSearch, states: dict, J, y: np.ndarray, info: Window) -> None:
    """Q(H_j) at the prefixes ``J`` on the grid ``y`` (step 3) into ``s.inside`` and ``s.error``, and each
    one's race state (pmf, tail) into ``states[j]``."""
    J = np.array(sorted(set(J)), dtype=np.int64)
    pmf, tail = states_at(s.qp, J, y, s.k, info)
    live = s.c[J] > 0
    fine, err = _quadrature(tail[live], s.c[J][live], y)
    for i, j in enumerate(J):
        states[int(j)] = (pmf[i], tail[i])
    Jl = J[live]
    newv = np.where(np.isnan(s.inside[Jl]), fine, s.inside[Jl])
    s.inside[Jl] = np.where(Jl < s.k, 0.0, newv)
    s.error[Jl] = np.where(Jl < s.k, 0.0, err)
    info.points.extend(int(j) for j in J)


def plan_round(s: PrefixSearch, states: dict, surv: np.ndarray) -> tuple[list[int], list[tuple[int, int]]]:
    """For the surviving prefixes ``surv``, grouped by the computed prefix a before each: ``(new, scans)``,
    the prefixes to evaluate next (runs longer than WINDOW, or without a known state at a) and the
    windows ``(a, b)`` to scan token by token (on to the next computed prefix b when that is within
    2 WINDOW, so the scan meets a direct evaluation there: a check)."""
    ev = np.flatnonzero(~np.isnan(s.inside))
    left = ev[np.searchsorted(ev, surv, side="left") - 1]  # evaluated prefix before each survivor
    new: list[int] = []
    scans: list[tuple[int, int]] = []
    for a in np.unique(left):
        group = surv[left == a]
        s_lo, s_hi = int(group.min()), int(group.max())
        if s_hi - a <= WINDOW and int(a) in states:
            b = int(ev[np.searchsorted(ev, s_hi)])  # the computed prefix after the run
            scans.append((int(a), b if (b in states and b - a <= 2 * WINDOW) else s_hi))
        else:
            new.extend(split_run(s_lo, s_hi))
    return new, scans


def scan_window(s: PrefixSearch, states: dict, a: int, b: int, t: np.ndarray, y: np.ndarray, info: Window) -> None:
    """Step 4: Q(H_j) for a < j <= b by the token-by-token update from the state at a; where b (or any j)
    was computed directly too, the largest difference goes to ``info.check``."""
    pmf0, tail0 = states[a]
    F = scan(pmf0, tail0, s.qp[a:b], t)
    js = np.arange(a + 1, b + 1)
    live = s.c[js] > 0
    fine, err = _quadrature(F[live], s.c[js][live], y)
    jl = js[live]
    was = s.inside[jl]
    hit = ~np.isnan(was)
    if hit.any():
        info.check = max(info.check, float(np.abs(was[hit] - fine[hit]).max()))
        info.checked += 1
    s.inside[jl] = np.where(jl < s.k, 0.0, fine)
    s.error[jl] = np.where(jl < s.k, 0.0, err)
    info.windows.append((a, b))


def window_inside(qp: np.ndarray, pt: np.ndarray, k: int, step: float):
    r"""Certified minimum of ``P_j + 1 - Q(H_j)`` over the prefixes of the positive draft masses ``qp``.

    ``qp`` are the positive draft masses in ratio order, ``pt`` the target masses at the same
    positions, ``step`` the trapezoid step of the reference's race grid
    (:func:`otm.race_quadrature.race_grid`). Returns ``(inside, error, info)``:
    ``inside[j]`` is :math:`Q(H_j)` where it was computed (NaN elsewhere), ``error`` the per-prefix
    quadrature estimate, or ``None`` when the grid would need ``t > e^700`` (then the caller uses the
    reference scan). Every prefix left at NaN has a lower bound above the returned minimum
    (module docstring, steps 1-2). The state of the search is a :class:`PrefixSearch`.
    """
    n = qp.size
    info = Window()
    s = PrefixSearch.start(qp, pt, k)
    cand = np.flatnonzero(np.isnan(s.inside) & s.is_open(s.L))
    cand = heavy_rounds(s, cand, info)
    s.u_min = min(s.u_min, float(s.upper_bounds(cand).min(initial=np.inf)))  # the least U_j (the others have L_j above)
    s.best = min(s.u_min, s.attained)
    cand = cand[s.is_open(s.lower_bounds(cand))]
    if cand.size == 0:
        return s.inside, s.error, info
    # every prefix evaluated below lies in [cand.min() - 1, cand.max()] (split_run's left ends): its
    # complement mass is at least c[cand.max()] (upper cut) and c e_k(q_H) at most the bound (lower cut)
    ce_max = float(s.c[max(int(cand.min()) - 1, 0)]) * ek_bound(qp[: cand.max()], k)
    y = race_grid(k, float(s.c[cand.max()]), step, ce_max)
    if y[-1] > 700.0:
        return None
    t = np.exp(y)
    info.nodes = y.size
    states: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # prefix -> its race state (pmf, tail) on the grid
    evaluate(s, states, [max(j, 0) for j in split_run(int(cand.min()), int(cand.max()))], y, info)
    s.use_heavy = False  # from here on the exact values' chords are the ones that matter (and cost less)
    scans: list[tuple[int, int]] = []  # the windows planned by the last round that had survivors
    while True:
        info.rounds += 1
        s.attained = s.least_computed()
        s.best = min(s.best, s.attained)
        cand = cand[np.isnan(s.inside[cand])]
        surv = cand[s.is_open(s.lower_bounds(cand))]
        if surv.size == 0:
            break
        new, scans = plan_round(s, states, surv)
        if not new:
            break
        evaluate(s, states, new, y, info)
    for a, b in scans:
        scan_window(s, states, a, b, t, y, info)
    # without a window that ended on a direct evaluation, the minimiser is recomputed directly
    done = ~np.isnan(s.inside)
    j_best = int(np.flatnonzero(done)[np.argmin(s.P[done] + 1 - s.inside[done])])
    if not info.checked and j_best not in states and k <= j_best < n:
        _, tail = states_at(qp, np.array([j_best]), y, k, info)
        direct, _ = _quadrature(tail, s.c[[j_best]], y)
        info.check = max(info.check, abs(float(direct[0]) - float(s.inside[j_best])))
    return s.inside, s.error, info
