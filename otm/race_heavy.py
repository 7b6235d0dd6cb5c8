r"""Certified bounds on :math:`Q(H_j)` that follow the heavy draft tokens (step 1b of :mod:`otm.race_window`).

The bounds of step 1 of :mod:`otm.race_window`, :math:`\prod_{i<k} (1 - c_j/(1 - S_i))_+ \le Q(H_j)
\le (1 - c_j)^k`, ignore that a drafted heavy token leaves less mass to draw from: with one draft
token of mass ~1 and the rest ~1e-14 the upper bound is ~1 at every prefix while Q is
~(q(H - a)/(1 - q_a))^{k-1}. Following the (at most :data:`MAX_HEAVY`) heavy tokens one by one
(:func:`heavy_bounds`: a walk over (heavy tokens drafted, number of light drafts), the light drafted
mass only known to lie in [0, W_u]) gives certified bounds on both sides; with more heavy tokens a
second walk counts the heavy drafts instead of naming them (:func:`heavy_count_bounds`, exact for
equal heavy masses). :func:`heavy_sets` picks the walks to use on a law; the window search of
:func:`otm.race_window.window_inside` decides where and how often they are evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS = float(np.finfo(np.float64).eps)

HEAVY_MIN = 1e-2
"""Tokens with at least this draft mass (at most :data:`MAX_HEAVY` of them) are followed one by one
by the heavy-token bounds (:func:`heavy_bounds`)."""

MAX_HEAVY = 3

HEAVY_TOTAL = 0.5
"""The heavy tokens are used only when they hold at least this much mass together: the bounds then
differ from those of step 1 (:mod:`otm.race_window`) by factors up to 1 / (1 - q(A)) in the complement
terms; below, the rounds cost more than they save (peaked laws with a top mass of 0.1)."""

HEAVY_MIN_MANY = 0.05
"""With more than :data:`MAX_HEAVY` tokens of at least this mass (together >= ``HEAVY_TOTAL``), the
count-only bounds (:func:`heavy_count_bounds`) are used as well."""


@dataclass
class Heavy:
    """What :func:`heavy_bounds` needs, computed once per law (positions are in the ratio order)."""

    pos: np.ndarray  # [m] positions of the heavy tokens A
    mass: np.ndarray  # [m] their masses
    r: np.ndarray  # [n + 1] q(H_j minus A), summed from the light tokens only
    out: np.ndarray  # [n + 1] q(complement of H_j minus A), likewise
    W: np.ndarray  # [k] W_u = sum of the u largest light masses
    delta: float  # relative rounding bound of every sum above


def heavy_tokens(qp: np.ndarray, k: int) -> Heavy | None:
    """The heavy tokens of ``qp`` (at most ``min(MAX_HEAVY, k - 1)`` masses >= ``HEAVY_MIN``), or None
    when there are none or they hold less than ``HEAVY_TOTAL`` together."""
    n = qp.size
    m = min(MAX_HEAVY, k - 1, n)
    if m <= 0:
        return None
    top = np.argpartition(qp, n - m)[n - m :]
    top = top[qp[top] >= HEAVY_MIN]
    if top.size == 0 or float(qp[top].sum()) < HEAVY_TOTAL:
        return None
    return _heavy_set(qp, k, top)


def _heavy_set(qp: np.ndarray, k: int, top: np.ndarray) -> Heavy:
    """:class:`Heavy` for the heavy positions ``top`` (the light arrays exclude them)."""
    n = qp.size
    top = np.sort(top)
    light = qp.copy()
    light[top] = 0.0
    r = np.zeros(n + 1)
    np.cumsum(light, out=r[1:])
    out = np.zeros(n + 1)
    out[:n] = np.cumsum(light[::-1])[::-1]
    big = np.sort(np.partition(light, max(n - (k - 1), 0))[max(n - (k - 1), 0) :])[::-1]
    W = np.zeros(k)
    W[1 : big.size + 1] = np.cumsum(big)[: k - 1]
    W[big.size + 1 :] = W[big.size]
    return Heavy(pos=top, mass=qp[top].copy(), r=r, out=out, W=W, delta=(n + 4 * k + 16) * EPS)


def heavy_sets(qp: np.ndarray, k: int) -> list[tuple[str, Heavy]]:
    """The heavy-token bounds to use on ``qp``: ``("subset", A)`` with the at most
    ``min(MAX_HEAVY, k - 1)`` largest masses >= ``HEAVY_MIN`` when they hold at least
    ``HEAVY_TOTAL``; and ``("count", A)`` with every mass >= ``HEAVY_MIN_MANY`` (at most
    ``4 k``) when there are more than ``MAX_HEAVY`` of them holding at least ``HEAVY_TOTAL``."""
    n = qp.size
    sets = []
    hv = heavy_tokens(qp, k)
    if hv is not None:
        sets.append(("subset", hv))
    m = min(4 * k, n)
    top = np.argpartition(qp, n - m)[n - m :]
    top = top[qp[top] >= HEAVY_MIN_MANY]
    if top.size > MAX_HEAVY and float(qp[top].sum()) >= HEAVY_TOTAL:
        sets.append(("count", _heavy_set(qp, k, top)))
    return sets


def heavy_bounds(hv: Heavy, k: int, js: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Certified bounds ``lo <= Q(H_j) <= hi`` at the prefixes ``js``, following the heavy tokens A exactly.

    Successive sampling is a walk over states (S, u): S the heavy tokens drawn so far, u the
    number of light (non-A) tokens drawn, every draw so far in H. From (S, u) the next draw is
    a in (A ∩ H) minus S with probability q_a / (x + y), and a light token of H with probability
    x / (x + y), where x = q(H minus A) - d, y = q(A minus S) + q(complement minus A), and d the
    mass of the u light drafts: 0 <= d <= W_u (the u largest light masses) and d <= q(H minus A).
    Hence, with V(S, u) = 1 when |S| + u = k,

    .. math::

        V(S, u) = \frac{\alpha + x \beta}{x + y},\qquad
        \alpha = \sum_{a \in (A \cap H) \setminus S} q_a V(S + a, u),\quad \beta = V(S, u + 1),

    and Q(H) = V(∅, 0). The right side is monotone in x (a Möbius map), so its extremes over
    the interval of x lie at the ends: taking the larger (smaller) end at every state gives an
    upper (lower) bound, by induction over the states (the map is non-decreasing in α and β).
    Without heavy tokens this is exactly (1 - c)^k and prod_i (1 - c/(1 - S_i)) (:mod:`otm.race_window`,
    step 1); with a dominant token a (q_a ~ 1) the upper bound becomes about
    q_a (q(H - a)/(1 - q_a))^{k-1} instead of ~1. Every sum is of non-negative terms; their
    rounding (``hv.delta`` relative) widens the interval of x and y, and the results are moved
    by a further 16 k eps. Upper and lower bounds are carried together as rows 0 and 1 of
    arrays of shape (2, len(js)).
    """
    js = np.asarray(js, dtype=np.int64)
    m = hv.pos.size
    dl = hv.delta
    inH = (hv.pos[:, None] < js[None, :]) * hv.mass[:, None]  # [m, J]: q_a where a is in H_j
    r = hv.r[js]
    out = hv.out[js]
    widen = np.array([[1 - dl], [1 + dl]])  # y: smaller for the upper bound, larger for the lower
    x_top = r * (1 + dl)
    x_bot = [np.maximum(r - W - dl * (r + W), 0.0) for W in hv.W]  # per u
    V: dict = {}
    one = np.ones((2, js.size))
    full = (1 << m) - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        for S in range(full, -1, -1):  # supersets first
            size = bin(S).count("1")
            free = [a for a in range(m) if not S >> a & 1]
            y = (float(sum(hv.mass[a] for a in free)) + out) * widen  # [2, J]
            den_top = x_top + y
            for u in range(k - size, -1, -1):
                if size + u == k:
                    V[S, u] = one
                    continue
                alpha = np.zeros((2, js.size))
                for a in free:
                    alpha += inH[a] * V[S | 1 << a, u]
                beta = V[S, u + 1]
                g1 = (alpha + x_top * beta) / den_top
                g2 = (alpha + x_bot[u] * beta) / (x_bot[u] + y)
                v = np.stack([np.fmax(g1[0], g2[0]), np.fmin(g1[1], g2[1])])
                v[np.isnan(v)] = 0.0
                v[0, np.isnan(g1[0]) & np.isnan(g2[0])] = 1.0  # no mass left: impossible state, 1 is safe
                V[S, u] = v
    hi = np.minimum(V[0, 0][0] * (1 + 16 * k * EPS), 1.0)
    lo = np.maximum(V[0, 0][1] * (1 - 16 * k * EPS), 0.0)
    return lo, hi


def heavy_count_bounds(hv: Heavy, k: int, js: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Certified bounds ``lo <= Q(H_j) <= hi`` following only *how many* heavy tokens were drafted.

    The walk of :func:`heavy_bounds` with states (h, u): h heavy and u light drafts, all in H.
    The heavy mass left in H, z, lies between the sums of the :math:`n_A - h` smallest and
    largest heavy masses of H (:math:`n_A` = their number), the light mass left x in
    :math:`[q(H \setminus A) - W_u, q(H \setminus A)]`, and y = q(A minus H) + q(complement minus A)
    is fixed, so

    .. math::

        V(h, u) = \frac{z\, V(h + 1, u) + x\, V(h, u + 1)}{x + z + y},

    a linear-fractional map of (x, z): its extremes over the box lie at its four corners. Exact
    when the heavy tokens of H have equal masses (four tokens of 0.25 among masses of 1e-14),
    where following subsets would need 2^{n_A} states. Rounding as in :func:`heavy_bounds`.
    """
    js = np.asarray(js, dtype=np.int64)
    dl = hv.delta
    inH = hv.pos[:, None] < js[None, :]  # [m, J]
    nA = inH.sum(axis=0)  # heavy tokens in H_j
    vals = -np.sort(-np.where(inH, hv.mass[:, None], 0.0), axis=0)  # [m, J], H's heavy masses first, descending
    m = vals.shape[0]
    largest = np.zeros((m + 1, js.size))  # largest[t] = sum of the t largest heavy masses of H
    np.cumsum(vals, axis=0, out=largest[1:])
    rest = np.zeros((m + 1, js.size))  # rest[h] = sum of vals[h:] = all but the h largest
    rest[:m] = np.cumsum(vals[::-1], axis=0)[::-1]
    cols = np.arange(js.size)
    r = hv.r[js]
    y0 = hv.mass @ (~inH) + hv.out[js]  # heavy mass outside H plus light mass outside H
    y = y0 * np.array([[1 - dl], [1 + dl]])  # [2, J]: smaller for the upper bound
    x_top = r * (1 + dl)
    x_bot = [np.maximum(r - W - dl * (r + W), 0.0) for W in hv.W]
    V: dict = {}
    one = np.ones((2, js.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        for h in range(k, -1, -1):
            left = np.maximum(nA - h, 0)  # heavy tokens of H not yet drafted
            z_hi = largest[left, cols] * (1 + dl)  # the largest ones left
            z_lo = rest[np.minimum(h, m), cols] * (1 - dl)  # the smallest ones left
            z_lo = np.where(h <= nA, z_lo, 0.0)
            for u in range(k - h, -1, -1):
                if h + u == k:
                    V[h, u] = one
                    continue
                a, b = V.get((h + 1, u), one), V[h, u + 1]
                corners = [
                    (z * a + x * b) / (x + z + y) for x in (x_top, x_bot[u]) for z in (z_hi, z_lo)
                ]
                g = np.stack(corners)  # [4, 2, J]
                v = np.stack([np.fmax.reduce(g[:, 0], axis=0), np.fmin.reduce(g[:, 1], axis=0)])
                v[0, np.isnan(v[0])] = 1.0  # 0/0 at every corner: no mass left, an impossible state
                v[1, np.isnan(v[1])] = 0.0
                V[h, u] = v
    hi = np.minimum(V[0, 0][0] * (1 + 16 * k * EPS), 1.0)
    lo = np.maximum(V[0, 0][1] * (1 - 16 * k * EPS), 0.0)
    return lo, hi
