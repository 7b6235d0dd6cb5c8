"""The ratio groups of the grouped rule: buckets read from the floats' bits, the cut between them, and
the rounds that split straddling groups (:func:`rule_steps`; module doc of :mod:`otm.verifiers.optimal`,
"Groups")."""

from __future__ import annotations

import functools

import numpy as np

from ...laws import OtmError
from .lazy import GroupedRule, Scaled, tokens_in

GROUP_BITS = 3
"""Ratio groups per octave of target/draft: ``2**GROUP_BITS`` (the top bits of the float's mantissa)."""

RATIO_RANGE = 60
"""Ratios below ``2**-RATIO_RANGE`` share the lowest group, ratios above ``2**RATIO_RANGE`` the highest."""

REFINE_ROUNDS = 4
"""Rounds of splitting straddling groups into single tokens (see :func:`build`)."""

MAX_GROUP_BITS = 10
"""Largest ``group_bits`` accepted: the sub-bucket masses are arrays over the ratio range,
``(2 RATIO_RANGE + 1) 2**(group_bits + FINE_BITS)`` entries at most (4M at 10 bits)."""

FINE_BITS = 5
"""Sub-buckets per bucket: ``2**FINE_BITS``; the buckets around the cut are raced as their sub-buckets."""

SINGLE_MAX = 32
"""A straddling whole bucket of at most this many tokens is split into single tokens at once; a
larger one into its sub-buckets first (a bucket of hundreds of tokens at once made rounds of
750-1900 groups on the embedded pair's real laws)."""

SPLIT_TOLERANCE = 1e-12
"""Straddling groups whose acceptance losses are together bounded by this are left whole."""


def _ratio_bins(p: np.ndarray, q: np.ndarray, bits: int, fine: int) -> tuple[np.ndarray, int]:
    """``(fid, f0)``: the sub-bucket id of each token, counted from ``f0`` (0 = the bucket of the
    largest ratio present), and ``f0``, the absolute id of that bucket's first sub-bucket; a token's
    bucket is ``fid >> fine``.

    A bucket is a ``2**-bits`` octave slice of the ratio :math:`p/q`, a sub-bucket a ``2**-fine``
    part of it, read from the float64 bit pattern (monotone in the value for positive floats),
    so (sub-)buckets are consecutive in the ratio order and finding them needs no sort: O(V).
    Absolute ids run over the whole range of ratios (0 for ratios above ``2**RATIO_RANGE``, with
    ``q = 0``; the last for ratios below ``2**-RATIO_RANGE``, with ``p = 0``); counting from the
    first bucket present keeps the arrays over (sub-)buckets to the range the laws use (a few
    octaves of the 121). ``p = q = 0`` tokens (ratio nan) go to one of the two ends, where they are
    never selected.
    """
    lo_f = ((1023 - RATIO_RANGE) << bits) << fine
    hi_f = (((1023 + RATIO_RANGE) << bits) + 1 << fine) - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        code = np.divide(p, q).view(np.int64)
    np.right_shift(code, 52 - bits - fine, out=code)
    np.clip(code, lo_f, hi_f, out=code)
    f0 = ((hi_f - int(code.max())) >> fine) << fine
    return np.subtract(hi_f - f0, code, out=code), f0  # 0 .. (buckets << fine) - 1, descending ratio


def _bin_bounds(f: np.ndarray, bits: int, fine: int):
    """Ratio bounds ``[lo, hi)`` of the sub-buckets of absolute ids ``f`` (:func:`_ratio_bins`)."""
    hi_f = (((1023 + RATIO_RANGE) << bits) + 1 << fine) - 1
    code = hi_f - f
    shift = 52 - bits - fine
    lo = (code << shift).view(np.float64)
    hi = ((code + 1) << shift).view(np.float64)
    lo[code == ((1023 - RATIO_RANGE) << bits) << fine] = 0.0  # the lowest holds everything below
    hi[f == 0] = np.inf  # the highest everything above
    return lo, hi


@functools.lru_cache(maxsize=256)
def _bucket_bounds(bits: int, fine: int, b0: int, nb: int):
    """Ratio bounds ``[lo, hi)`` of the ``nb`` buckets from absolute bucket ``b0`` on (those of their
    lowest and highest sub-buckets), read-only."""
    f = (b0 + np.arange(nb)) * (1 << fine)
    lo = _bin_bounds(f + (1 << fine) - 1, bits, fine)[0]
    hi = _bin_bounds(f, bits, fine)[1]
    lo.flags.writeable = hi.flags.writeable = False
    return lo, hi


def _best_cut(P_g: np.ndarray, Q_g: np.ndarray, k: int) -> int:
    """Index j of the group boundary (after group j) maximising P_j - g(D_j); -1 when none gains."""
    after = np.cumsum(Q_g[::-1])[::-1] - Q_g  # draft mass after each group
    gain = np.cumsum(P_g) - (1.0 - after**k)
    j = int(np.argmax(gain))
    return j if gain[j] > 0 else -1


def rule_steps(p: np.ndarray, q: np.ndarray, k: int, group_bits: int | None, laws=None):
    """:func:`checked_rule` as a generator: yields each round's groups ``(P_g, Q_g)``, receives their layout.

    ``p``, ``q``: the normalised float64 laws, read over the vocabulary once, before the first
    layout; ``laws``, optional: the same laws as :class:`Scaled` (the same numbers where evaluated),
    which the rule keeps and reads token by token afterwards instead of ``p``, ``q``.

    Groups, in ratio order: each whole bucket; the buckets around the best cut between whole
    buckets (*split* buckets) as their ``2**FINE_BITS`` sub-buckets, and the sub-buckets around
    the best cut between those (and, in later rounds, straddling groups) as single tokens.
    """
    bits = GROUP_BITS if group_bits is None else int(group_bits)
    if not 0 <= bits <= MAX_GROUP_BITS:
        raise OtmError(f"group_bits must be in 0..{MAX_GROUP_BITS}, got {group_bits}")
    fine = FINE_BITS
    per = 1 << fine
    pl, ql = laws if laws is not None else (Scaled(p), Scaled(q))
    fid, f0 = _ratio_bins(p, q, bits, fine)  # [V] sub-bucket of each token (from f0); bucket: fid >> fine
    nb = (int(fid.max()) >> fine) + 1  # buckets up to the last one used
    nf = nb * per
    P_f = np.bincount(fid, weights=p, minlength=nf)  # [nf] mass per sub-bucket
    Q_f = np.bincount(fid, weights=q, minlength=nf)
    del p, q  # from here on the laws are read at a few tokens only
    starts = np.arange(0, nf, per)
    P_b, Q_b = np.add.reduceat(P_f, starts), np.add.reduceat(Q_f, starts)  # [nb] mass per bucket
    b_lo, b_hi = _bucket_bounds(bits, fine, f0 >> fine, nb)
    # tokens per (sub-)bucket, counted only where it matters (a group that might straddle): until
    # then every (sub-)bucket with mass counts as two or more. (Sub-)buckets holding only tokens
    # with p = q = 0 (ratio nan) have no group: their tokens take a neighbour's, never selected.
    nonempty = (P_b > 0) | (Q_b > 0)
    n_f = None
    split = np.zeros(nb, dtype=bool)  # buckets raced as their sub-buckets
    single = np.zeros(nf, dtype=bool)  # sub-buckets (of split buckets) raced as single tokens
    # the optimal cut H* lies in one of the two buckets around the best cut between whole buckets
    # (these are the groups that straddle): split them from the start, and inside them the two
    # sub-buckets around the best cut between sub-buckets, saving rounds
    filled = np.flatnonzero(nonempty)
    j = _best_cut(P_b[filled], Q_b[filled], k) if REFINE_ROUNDS > 0 else -1
    if j >= 0:
        around = filled[j : j + 2]
        split[around] = True
        # the cuts between sub-buckets: the buckets before and after them each taken as one group
        # (buckets between the two split ones are empty)
        sf = _sub_buckets(split, per)
        a, b = around[0], around[-1] + 1
        P_c = np.concatenate([[P_b[:a].sum()], P_f[sf], [P_b[b:].sum()]])
        Q_c = np.concatenate([[Q_b[:a].sum()], Q_f[sf], [Q_b[b:].sum()]])
        jc = _best_cut(P_c, Q_c, k)  # the cut after P_c[jc]: the sub-buckets jc - 1 and jc around it
        if jc >= 0:
            near = np.arange(jc - 1, jc + 1)
            single[sf[near[(near >= 0) & (near < sf.size)]]] = True
    tok = np.zeros(0, dtype=np.int64)
    P_t = Q_t = np.zeros(0)
    n_single = -1  # the number of sub-buckets whose tokens `tok` holds (only ever grows)
    for round_ in range(REFINE_ROUNDS + 1):
        sf = _sub_buckets(split, per)  # [m] the sub-buckets of the split buckets, in ratio order
        sing = single[sf]
        ids = np.flatnonzero(single)
        if ids.size != n_single:  # the single tokens, in ratio order within sub-buckets
            n_single = ids.size
            if ids.size == 2 and ids[1] == ids[0] + 1:  # two neighbours: one range test
                tok = np.flatnonzero((fid - ids[0]).view(np.uint64) <= 1)  # (ascending)
            else:
                tok = tokens_in(fid, single)
            P_t, Q_t = pl.at(tok), ql.at(tok)
            with np.errstate(divide="ignore", invalid="ignore"):
                code_t = np.divide(P_t, Q_t).view(np.int64)
            o = np.lexsort((-code_t, fid[tok]))  # ties: ascending token
            tok, P_t, Q_t = tok[o], P_t[o], Q_t[o]
        keep = sf[~sing & ((P_f[sf] > 0) | (Q_f[sf] > 0))]  # sub-buckets raced whole
        # the units inside split buckets, in ratio order: whole sub-buckets and single tokens
        u_f = np.concatenate([keep, fid[tok]])
        u_r = np.concatenate([np.full(keep.size, -1), np.arange(tok.size)])
        u = np.lexsort((u_r, u_f))
        u_f, u_r = u_f[u], u_r[u]
        u_b = u_f >> fine
        is_t = u_r >= 0
        n_u = np.ones(u.size, dtype=np.int64)
        n_u[~is_t] = 2 if n_f is None else n_f[u_f[~is_t]]
        P_u, Q_u = np.empty(u.size), np.empty(u.size)
        P_u[~is_t], Q_u[~is_t] = P_f[u_f[~is_t]], Q_f[u_f[~is_t]]
        P_u[is_t], Q_u[is_t] = P_t[u_r[is_t]], Q_t[u_r[is_t]]
        lo_u, hi_u = _bin_bounds(u_f + f0, bits, fine)
        # all groups: whole buckets and the units of split buckets
        cnt = np.bincount(u_b, minlength=nb)
        size = np.where(split, cnt, nonempty)
        base = np.cumsum(size) - size
        G = int(base[-1] + size[-1])
        whole = nonempty & ~split
        gw = base[whole]
        ug = base[u_b] + np.arange(u.size) - (np.cumsum(cnt) - cnt)[u_b]  # group of each unit
        P_g, Q_g, lo_g, hi_g = np.empty(G), np.empty(G), np.empty(G), np.empty(G)
        n_g = np.empty(G, dtype=np.int64)
        n_g[gw] = 2 if n_f is None else np.add.reduceat(n_f, starts)[whole]
        P_g[gw], Q_g[gw], lo_g[gw], hi_g[gw] = P_b[whole], Q_b[whole], b_lo[whole], b_hi[whole]
        P_g[ug], Q_g[ug], lo_g[ug], hi_g[ug], n_g[ug] = P_u, Q_u, lo_u, hi_u, n_u
        x_g, theta_g, key1_g, key2_g, x1_g = yield P_g, Q_g
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(Q_g > 0, x_g / np.where(Q_g > 0, Q_g, 1.0), 0.0)  # x_i / q_i in the group
        for _ in range(2):
            # a group with both passes can spread its pass-1 mass over its tokens so that
            # x_i = lambda_G p_i: per-unit weights a (pass 1) > b (pass 2) must bracket lambda_G r_i
            both = (n_g >= 2) & (theta_g > 0) & (theta_g < 1) & (P_g > 0) & (Q_g > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                a_G = x1_g / (theta_g * Q_g)
                b_G = (x_g - x1_g) / ((1.0 - theta_g) * Q_g)
                lam_G = x_g / P_g
                spread = both & (b_G <= lam_G * lo_g) & (lam_G * hi_g <= a_G) & (a_G > b_G)
            straddle = (n_g >= 2) & ~spread & (w > lo_g) & (w < hi_g)
            if n_f is not None or not straddle.any():
                break
            # a group might straddle: count the tokens of the (sub-)buckets (one token cannot)
            n_f = np.bincount(fid, minlength=nf)
            n_g[gw] = np.add.reduceat(n_f, starts)[whole]
            n_g[ug[~is_t]] = n_f[u_f[~is_t]]
        # a straddling group loses sum_i (p_i - w q_i)_+ <= Q (hi - w): leave the cheapest whole
        with np.errstate(invalid="ignore"):
            loss = np.where(straddle, Q_g * (hi_g - w), 0.0)
        cheap = np.flatnonzero(straddle)[np.argsort(loss[straddle])]
        cheap = cheap[np.cumsum(loss[cheap]) <= SPLIT_TOLERANCE]
        left = straddle.copy()  # straddling groups, including those left whole
        straddle[cheap] = False
        if not straddle.any() or round_ == REFINE_ROUNDS:
            break
        # straddling whole buckets: raced as their sub-buckets from the next round (all their tokens
        # single where they hold at most SINGLE_MAX); straddling sub-buckets: their tokens single
        wb = np.zeros(nb, dtype=bool)
        wb[whole] = straddle[gw]
        split |= wb
        few = np.zeros(nb, dtype=bool)
        few[whole] = straddle[gw] & (n_g[gw] <= SINGLE_MAX)
        single.reshape(nb, per)[few] = True
        single[u_f[~is_t & straddle[ug]]] = True
    # per group: theta_i = clip(t1 r_i + t0), x_i = q_i (x0 + theta_i xd): one theta and x_i = w q_i,
    # or, where the group spreads, theta_i = (lambda r_i - b)/(a - b)
    t1, t0, x0, xd = np.zeros(G), theta_g.copy(), w.copy(), np.zeros(G)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1[spread] = (lam_G / (a_G - b_G))[spread]
        t0[spread] = (-b_G / (a_G - b_G))[spread]
    x0[spread], xd[spread] = b_G[spread], (a_G - b_G)[spread]
    comp = np.zeros(G + 1)
    comp[:G] = np.cumsum(Q_g[::-1])[::-1]
    cut = np.cumsum(P_g) - (1.0 - comp[1:] ** k)  # P_j - g(D_j) over group boundaries
    alpha_g = 1.0 - max(0.0, float(cut.max()))
    # group of each sub-bucket (a whole bucket's for all of its own; sub-buckets and buckets without
    # mass: a neighbour's, their tokens having p = q = 0), and of each single token
    base_f = np.repeat(np.minimum(base, G - 1), per)
    base_f[u_f[~is_t]] = ug[~is_t]
    perm = np.argsort(tok)
    # acceptance: a group with all its tokens on one side of x_i = p_i accepts min(x_G, P_G);
    # the groups left straddling (losses below SPLIT_TOLERANCE) are summed token by token, lazily
    acc_g = np.minimum(x_g, P_g)
    lf = None
    if left.any():
        lf = np.zeros(nf, dtype=bool)
        lf.reshape(nb, per)[whole] = left[gw][:, None]
        lf[u_f[~is_t]] = left[ug[~is_t]]
        acc_g = acc_g[~left]
    # for the residual draw: each group's residual mass, and where its tokens are
    res_g = np.maximum(P_g - x_g, 0.0)
    res_g[left] = np.nan
    f_lo = np.full(G, -1, dtype=np.int64)
    f_lo[gw] = np.flatnonzero(whole) * per
    f_lo[ug[~is_t]] = u_f[~is_t]
    f_hi = f_lo + np.where(f_lo >= 0, 1, 0)
    f_hi[gw] = f_lo[gw] + per
    g_tok = np.full(G, -1, dtype=np.int64)
    g_tok[ug[is_t]] = tok[u_r[is_t]]
    return GroupedRule(pl, ql, fid, base_f, tok[perm], ug[is_t][perm] if tok.size else tok, t1, t0, x0, xd,
                key1_g, key2_g, float(acc_g.sum()), alpha_g, lf, res_g, f_lo, f_hi, g_tok)



def _sub_buckets(split: np.ndarray, per: int) -> np.ndarray:
    """The sub-buckets of the split buckets, in ratio order."""
    return (np.flatnonzero(split)[:, None] * per + np.arange(per)).ravel()

