"""The layered two-pass priority race over weighted entries (tokens or groups of tokens): the isotonic
layers, the split of each layer into two passes, the selection law of the race (module doc of
:mod:`otm.verifiers.optimal`, "Realising it")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THETA_CANDIDATES = (0.5, 0.25, 0.75, 0.0, 1.0) + tuple(
    f for f in (i / 16 for i in range(17)) if f not in (0.5, 0.25, 0.75, 0.0, 1.0)
)
"""Fractions of the admissible split range tried per layer: 0.5, then 0.25 for the layers whose
acceptance falls short of their share of alpha*, then all the others at once for those still short
(the first of largest acceptance wins). The 16ths after the first five close gaps of 1e-8 to 3e-3 seen on 3 of 192 real
positions (embedded pair); 32nds closed the same three at two to four times the cost. Candidates
after the first two are tried all at once, on the layers still short."""

NEWTON_STEPS = 12
"""Newton iterations for the per-token split equation (monotone from below; exits early)."""


def dpow(a: np.ndarray, b: np.ndarray, d: np.ndarray, k: int) -> np.ndarray:
    """``a**k - b**k`` for ``a >= b >= 0`` given ``d = a - b`` exactly: ``d * sum a^j b^(k-1-j)``,
    the sum by Horner in b (``S_m = b S_{m-1} + a^m``, all terms non-negative)."""
    shape = np.broadcast(a, b).shape
    s = np.ones(shape)
    am = np.ones(shape)
    for _ in range(k - 1):
        am *= a
        s *= b
        s += am
    return d * s



@dataclass(frozen=True)
class RacePlan:
    """One position's selection rule: per-token pass-1 probability, race keys, selection law."""

    x: np.ndarray  # [V] exact selection law P(selected = y)
    theta: np.ndarray  # [V] probability that a position with this token runs in pass 1
    key1: np.ndarray  # [V] int64 race key in pass 1 (smaller wins)
    key2: np.ndarray  # [V] int64 race key in pass 2
    acceptance: float  # sum min(x, target)
    residual: np.ndarray  # [V] (target - x)_+, unnormalised
    group: np.ndarray | None = None  # [V] group of each token (build), None for build_tokens
    alpha_groups: float = float("nan")  # min over group-closed cuts: an upper bound on alpha*

    @property
    def gap_bound(self) -> float:
        """``alpha_groups - acceptance``: an upper bound on the gap to alpha*, found without a sort."""
        return self.alpha_groups - self.acceptance


def split_root(cA, L, Q, Vt, theta_split, k):
    """Solve (c^k - (c-T)^k) + ((c-S)^k - (c-S-Q+T)^k) = Vt for T in [max(0, Q-L+S), min(Q, S)].

    With a = c - T and b = (c - S - Q + T) = W - a this is a^k + (W - a)^k = C, convex and
    increasing in a on a >= W/2; Newton from the upper bound a = C^(1/k) decreases monotonically.
    At k = 2 and 4 it starts from the root in closed form, its rounding polished by Newton (which
    then stops after a step or two instead of about eight): with a = m + t, m = W/2, the equation
    is symmetric in t, 2 m^2 + 2 t^2 = C at k = 2 and 2 (m^4 + 6 m^2 t^2 + t^4) = C at k = 4, a
    quadratic in t^2 whose root is written t^2 = (C/2 - m^4) / (3 m^2 + sqrt(8 m^4 + C/2)) (no
    cancellation between the square root and 3 m^2).
    """
    lo = np.maximum(0.0, Q - (L - theta_split))
    hi = np.minimum(Q, theta_split)
    cs = cA - theta_split
    W = cs - Q + cA
    C = np.maximum(cA**k + cs**k - Vt, 0.0)
    a_min, a_max = cA - hi, cA - lo
    if k in (2, 4):  # the root itself, a = m + t with m = W/2 (see the docstring): Newton then polishes
        m = 0.5 * W
        m2 = m * m
        if k == 2:
            t2 = 0.5 * C - m2
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                t2 = (0.5 * C - m2 * m2) / (3.0 * m2 + np.sqrt(8.0 * m2 * m2 + 0.5 * C))
        a = np.clip(m + np.sqrt(np.maximum(np.nan_to_num(t2), 0.0)), a_min, a_max)
    else:
        a = np.clip(C ** (1.0 / k), a_min, a_max)
    tol = 4 * np.finfo(float).eps
    shape = a.shape
    a = a.ravel()
    live = np.arange(a.size)  # the entries still iterating, and their own W, C, a_min, a
    W, C, a_min = (np.broadcast_to(v, shape).ravel()[live] for v in (W, C, a_min))
    a_live = a
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(NEWTON_STEPS):
            b = np.maximum(W - a_live, 0.0)
            ak1, bk1 = a_live ** (k - 1), b ** (k - 1)
            over = a_live * ak1 + b * bk1 - C
            d = k * (ak1 - bk1)
            step = np.where((over > 0) & (d > 0), over / d, 0.0)
            a_live = np.maximum(a_live - step, a_min)
            a[live] = a_live
            go = step > tol * a_live  # an entry stops after its first step below tolerance (its own
            if not go.any():  # result, whatever else is solved beside it): only the others go on
                break
            live, a_live, W, C, a_min = live[go], a_live[go], W[go], C[go], a_min[go]
    return cA - a.reshape(shape)


def layout(p: np.ndarray, q: np.ndarray, k: int):
    """``(x, theta, key1, key2, x1)`` of the layered two-pass race over the entries of ``p``, ``q``
    (``x1``: the part of ``x`` selected in pass 1)."""
    return layout_rows([p], [q], k)[0]


def _row_cumsum(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Cumulative sums restarted at every row (rows are ``values[bounds[r]:bounds[r + 1]]``), each
    row's sums computed from that row alone (so a row's numbers do not depend on the others)."""
    out = np.empty_like(values)
    for a, b in zip(bounds[:-1], bounds[1:]):
        np.cumsum(values[..., a:b], axis=-1, out=out[..., a:b])
    return out


def layout_rows(Ps, Qs, k: int):
    """:func:`layout` of several rows at once: elementwise work on all rows together, every
    order-dependent step (sort, cumulative sums, isotonic regression) row by row, so each row's
    result is the one it gets alone, bit for bit."""
    from scipy.optimize import isotonic_regression

    n_r = np.array([P.size for P in Ps])
    bounds = np.concatenate([[0], np.cumsum(n_r)])
    N = int(bounds[-1])
    p, q = np.concatenate(Ps), np.concatenate(Qs)
    row = np.repeat(np.arange(n_r.size), n_r)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    key = np.where(p > 0, -ratio, np.inf)
    ordered = key[1:] >= key[:-1]  # the groups arrive in ratio order, as a rule: then the sort is the identity
    ordered[bounds[1:-1] - 1] = True  # (row boundaries)
    identity = bool(ordered.all())
    order = np.arange(N) if identity else np.lexsort((key, row))  # stable: ties keep their index order
    ps, qs = p[order], q[order]
    # comp_lo[j] = 1 - D_{j-1}, comp_hi[j] = 1 - D_j within the row, from the small end
    comp_lo = _row_cumsum(qs[::-1], (N - bounds)[::-1])[::-1]
    comp_hi = np.zeros(N)
    last = bounds[1:] - 1
    comp_hi[:-1] = comp_lo[1:]
    comp_hi[last] = 0.0
    x_s = dpow(comp_lo, comp_hi, qs, k)  # the plain ratio-order priority
    theta_s = np.ones(N)
    x1_s = x_s
    block = np.arange(N)  # layer of each sorted position (ids unique over all rows)
    lam = np.zeros(N)
    starts_all = []
    if k >= 2:
        for r in range(n_r.size):
            a, b = bounds[r], bounds[r + 1]
            npos = int(np.count_nonzero(ps[a:b]))
            if npos < 2:
                starts_all.append(np.arange(a, b))
                continue
            iso = isotonic_regression(x_s[a : a + npos] / ps[a : a + npos], weights=ps[a : a + npos], increasing=True)
            lam[a : a + npos] = iso.x
            st = a + np.asarray(iso.blocks)[:-1]
            starts_all.append(np.concatenate([st, np.arange(a + npos, b)]))
        starts = np.concatenate(starts_all + [[N]]).astype(np.int64)
        sizes = np.diff(starts)
        block = np.repeat(np.arange(sizes.size), sizes)
        multi_blocks = np.flatnonzero(sizes >= 2)
        if multi_blocks.size:
            cum_p = _row_cumsum(ps, bounds) - ps  # P before each position, within its row
            x_s, theta_s, x1_s = _layers(ps, qs, comp_lo, comp_hi, cum_p, lam, starts, sizes, multi_blocks,
                                         row, bounds, x_s, theta_s, k)
    out = []
    if identity:  # every row already in ratio order: its sorted arrays are its arrays
        blk_all = block - np.repeat(block[bounds[:-1]], n_r)  # layer within the row
        for r in range(n_r.size):
            a, b = bounds[r], bounds[r + 1]
            V, rank, blk = b - a, np.arange(b - a), blk_all[a:b]
            out.append((x_s[a:b], theta_s[a:b], (2 * blk) * V + rank, (2 * blk + 1) * V + rank, x1_s[a:b]))
        return out
    for r in range(n_r.size):
        a, b = bounds[r], bounds[r + 1]
        V = b - a
        o = order[a:b] - a
        x = np.empty(V)
        x[o] = x_s[a:b]
        theta = np.empty(V)
        theta[o] = theta_s[a:b]
        x1 = np.empty(V)
        x1[o] = x1_s[a:b]
        rank = np.empty(V, dtype=np.int64)
        rank[o] = np.arange(V)
        blk = np.empty(V, dtype=np.int64)
        blk[o] = block[a:b] - block[a]
        out.append((x, theta, (2 * blk) * V + rank, (2 * blk + 1) * V + rank, x1))
    return out


def _layers(ps, qs, comp_lo, comp_hi, cum_p, lam, starts, sizes, multi_blocks, row, bounds, x_s, theta_s, k):
    """Two-pass layout of every multi-token layer; returns updated (x_s, theta_s, x1_s).

    Split candidates are tried in the order of :data:`THETA_CANDIDATES`, each on the layers whose
    best acceptance so far falls short of :math:`\\sum \\min(\\lambda p, p)` over the layer.
    """
    x_s = x_s.copy()
    theta_s = theta_s.copy()
    x1_s = x_s.copy()
    todo = multi_blocks
    best_acc = np.full(sizes.size, -np.inf)
    # 0.5, then 0.25 (most layers stop there), then the rest all at once
    for f in (*THETA_CANDIDATES[:2], np.asarray(THETA_CANDIDATES[2:])):
        pos, acc, want, xx, th, x1 = _layers_at(ps, qs, comp_lo, comp_hi, cum_p, lam, starts, sizes, todo, row, k, f)
        if np.ndim(f):  # [candidates, ...]: per layer the first candidate of largest acceptance
            c = np.argmax(acc, axis=0)
            acc = np.take_along_axis(acc, c[None], 0)[0]
            c_t = np.repeat(c, sizes[todo])[None]
            xx, th, x1 = (np.take_along_axis(a, c_t, 0)[0] for a in (xx, th, x1))
        better = acc > best_acc[todo]
        best_acc[todo] = np.where(better, acc, best_acc[todo])
        take = np.repeat(better, sizes[todo])
        x_s[pos[take]] = xx[take]
        theta_s[pos[take]] = th[take]
        x1_s[pos[take]] = x1[take]
        todo = todo[best_acc[todo] < want * (1 - 1e-12) - 1e-15]  # short of its share beyond rounding
        if not todo.size:
            break
    return x_s, theta_s, x1_s


def _layers_at(ps, qs, comp_lo, comp_hi, cum_p, lam, starts, sizes, multi_blocks, row, k, frac):
    """One split candidate ``frac`` on the given layers: (positions, acceptance and its target
    per layer, x, theta and the pass-1 part of x per position). Sums run within each row."""
    a_idx = starts[multi_blocks]
    n_b = sizes[multi_blocks]
    e_idx = a_idx + n_b - 1  # last position of each layer
    pos = np.repeat(a_idx - np.cumsum(n_b) + n_b, n_b) + np.arange(n_b.sum())  # their sorted positions
    which = np.repeat(np.arange(multi_blocks.size), n_b)
    seg = np.concatenate([[0], np.cumsum(n_b)[:-1]])  # reduceat offsets
    first = np.zeros(pos.size, dtype=bool)
    first[seg] = True
    r_pos = row[pos]
    rb = np.concatenate([[0], np.flatnonzero(np.diff(r_pos)) + 1, [pos.size]])  # row bounds in `pos`
    cA = comp_lo[a_idx][which]
    L = (comp_lo[a_idx] - comp_hi[e_idx])[which]
    Q = cA - comp_hi[pos]  # prefix mass of the layer up to this token (inclusive)
    lam_t = lam[pos]
    Vt = lam_t * ((cum_p[pos] + ps[pos]) - cum_p[a_idx][which])
    pq, qq = ps[pos], qs[pos]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(qq > 0, lam_t * pq / np.where(qq > 0, qq, 1.0), np.inf)
    last = np.concatenate([first[1:], [True]])
    v_first = v[first]
    v_last = v[last]
    cAb, Lb = comp_lo[a_idx], comp_lo[a_idx] - comp_hi[e_idx]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s_lo = cAb - np.minimum(v_first / k, 1e300) ** (1.0 / (k - 1))
        s_hi = cAb - (v_last / k) ** (1.0 / (k - 1))
    s_lo = np.clip(np.nan_to_num(s_lo, nan=0.0, neginf=0.0), 0.0, Lb)
    s_hi = np.clip(np.nan_to_num(s_hi, nan=0.0, neginf=0.0), s_lo, Lb)
    frac = np.asarray(frac, dtype=float)[..., None]  # [candidates, 1] or [1]
    S = (s_lo + frac * (s_hi - s_lo))[..., which]  # [(candidates,) tokens]
    T = split_root(cA, L, Q, Vt, S, k)
    T_prev = np.where(first, 0.0, np.roll(T, 1, axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        th = np.where(qq > 0, np.clip((T - T_prev) / np.where(qq > 0, qq, 1.0), 0.0, 1.0), 1.0)
    piece1 = th * qq
    piece2 = qq - piece1
    c1 = _row_cumsum(piece1, rb)
    T_end = c1 - np.repeat(c1[..., seg] - piece1[..., seg], n_b, axis=-1)  # within-layer cumulative pass-1 mass
    c2 = _row_cumsum(piece2, rb)
    U_end = c2 - np.repeat(c2[..., seg] - piece2[..., seg], n_b, axis=-1)
    Theta = np.add.reduceat(piece1, seg, axis=-1)[..., which]
    a1 = cA - (T_end - piece1)
    x1 = dpow(a1, np.maximum(a1 - piece1, 0.0), piece1, k)
    a2 = cA - Theta - (U_end - piece2)
    x2 = dpow(np.maximum(a2, 0.0), np.maximum(a2 - piece2, 0.0), piece2, k)
    xx = x1 + x2
    acc = np.add.reduceat(np.minimum(xx, pq), seg, axis=-1)
    want = np.add.reduceat(np.minimum(lam_t, 1.0) * pq, seg)
    return pos, acc, want, xx, th, x1  # with a leading candidates axis when frac is an array

