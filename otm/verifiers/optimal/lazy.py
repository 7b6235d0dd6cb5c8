"""One position's grouped rule, kept lazily: :class:`Scaled` laws and the :class:`GroupedRule` evaluated at the
tokens asked (module doc of :mod:`otm.verifiers.optimal`, "Groups")."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .layout import RacePlan


def tokens_in(gid: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(buckets[gid])``: the tokens whose bucket is marked, ascending (a few buckets:
    comparisons with each, cheaper than the lookup per token)."""
    ids = np.flatnonzero(buckets)
    if ids.size > 3:
        return np.flatnonzero(buckets[gid])
    mask = gid == ids[0] if ids.size else np.zeros(gid.size, dtype=bool)
    for b in ids[1:]:
        mask |= gid == b
    return np.flatnonzero(mask)



@dataclass(frozen=True)
class Scaled:
    """A law kept as ``raw / total``, evaluated in float64 where asked.

    ``raw`` as given (float32 or float64), ``total`` the float64 sum it is divided by (1.0 for a
    law already normalised in float64, whose values are then ``raw`` itself): a rule keeps its
    laws this way, so that a caller holding the raw rows needs no normalised copy of the whole
    vocabulary beside each row's rule (only the k drafted tokens, and the rows that reject, are
    ever read again).
    """

    raw: np.ndarray  # [V]
    total: float = 1.0

    def at(self, tokens=None) -> np.ndarray:
        """``raw[tokens] / total`` in float64 (the whole law when ``tokens`` is None)."""
        if tokens is None:
            if self.total == 1.0 and self.raw.dtype == np.float64:
                return self.raw
            return np.divide(self.raw, self.total, dtype=np.float64)
        return np.divide(self.raw[tokens], self.total, dtype=np.float64)


@dataclass(frozen=True)
class GroupedRule:
    """One position's grouped rule (:func:`rule`), evaluated lazily.

    Per token asked: O(1) (its group from its ratio's bits, then the group's coefficients:
    ``theta_i = clip(t1 r_i + t0, 0, 1)``, ``x_i = q_i (x0 + theta_i xd)``); a draw from the
    residual ``(p - x)_+`` after a rejection costs O(G) and one pass over the sub-bucket ids
    (:meth:`draw_residual`); the whole residual (:meth:`residual`, O(V)) is for the exact law.
    """

    target_law: Scaled  # the normalised target, evaluated where asked
    draft_law: Scaled  # the normalised draft
    gid: np.ndarray  # [V] ratio sub-bucket of each token (counted from the first bucket present)
    base: np.ndarray  # [sub-buckets] group of each sub-bucket (its bucket's where raced whole)
    split_tok: np.ndarray  # [m] tokens raced alone, ascending
    split_grp: np.ndarray  # [m] their groups
    t1: np.ndarray  # [G] theta_i = clip(t1 r_i + t0, 0, 1)
    t0: np.ndarray
    x0: np.ndarray  # [G] x_i = q_i (x0 + theta_i xd)
    xd: np.ndarray
    key1: np.ndarray  # [G] race key in pass 1 (smaller wins)
    key2: np.ndarray  # [G] race key in pass 2
    acc_groups: float  # sum of min(x_G, P_G) over the groups not left straddling
    alpha_groups: float  # min over group-closed cuts: an upper bound on alpha*
    left: np.ndarray | None = None  # [sub-buckets] those of the groups left straddling; None: none
    res_g: np.ndarray | None = None  # [G] (P_G - x_G)_+, the residual mass of a group on one side of
    # x_i = p_i; nan for the groups left straddling (summed token by token when asked)
    f_lo: np.ndarray | None = None  # [G] first sub-bucket of a group raced whole (-1: a single token)
    f_hi: np.ndarray | None = None  # [G] one past its last sub-bucket
    g_tok: np.ndarray | None = None  # [G] the token of a single-token group (-1 otherwise)

    @functools.cached_property
    def acceptance(self) -> float:
        """``sum min(x, target)``: ``min(x_G, P_G)`` per group, token by token in the groups left
        straddling (their tokens found over the vocabulary: O(V), so computed when first asked)."""
        if self.left is None:
            return self.acc_groups
        tok = tokens_in(self.gid, self.left)
        return self.acc_groups + float(np.minimum(self.at(tok)[3], self.target_law.at(tok)).sum())

    @property
    def target(self) -> np.ndarray:
        """``[V]`` normalised target (O(V) unless the rule was given it normalised)."""
        return self.target_law.at()

    @property
    def draft(self) -> np.ndarray:
        """``[V]`` normalised draft."""
        return self.draft_law.at()

    def groups(self, tokens=None) -> np.ndarray:
        """Group of each token asked (all tokens when ``tokens`` is None)."""
        if tokens is None:
            g = self.base[self.gid]
            g[self.split_tok] = self.split_grp
            return g
        tokens = np.asarray(tokens, dtype=np.int64)
        g = self.base[self.gid[tokens]]
        if self.split_tok.size:
            j = np.minimum(np.searchsorted(self.split_tok, tokens), self.split_tok.size - 1)
            g = np.where(self.split_tok[j] == tokens, self.split_grp[j], g)
        return g

    def at(self, tokens=None):
        """``(theta, key1, key2, x)`` at the tokens asked (all tokens when None)."""
        g = self.groups(tokens)
        p, q = self.target_law.at(tokens), self.draft_law.at(tokens)
        theta = np.clip(self.t1[g] * (p / np.where(q > 0, q, 1.0)) + self.t0[g], 0.0, 1.0)
        return theta, self.key1[g], self.key2[g], q * (self.x0[g] + theta * self.xd[g])

    def selection(self) -> np.ndarray:
        """``[V]`` the selection law ``x``: ``at()[3]``, the same numbers, with fewer temporaries."""
        g = self.groups()
        p, q = self.target_law.at(), self.draft_law.at()
        if p is self.target_law.raw:
            p = p.copy()
        if q.min() > 0:
            r = np.divide(p, q, out=p)
        else:
            r = np.divide(p, np.where(q > 0, q, 1.0), out=p)
        theta = np.multiply(self.t1[g], r, out=r)
        theta += self.t0[g]
        np.clip(theta, 0.0, 1.0, out=theta)
        x = np.multiply(theta, self.xd[g], out=theta)
        x += self.x0[g]
        x *= q
        return x

    def residual(self, out: np.ndarray | None = None) -> np.ndarray:
        """``(target - x)_+`` over the vocabulary, unnormalised: O(V).

        The same numbers as ``np.maximum(self.target - self.selection(), 0.0)`` (the same float64
        operations in the same order), written into ``out`` (``[V]`` float64) when given, with one
        normalised copy of each law and two scratch rows instead of a temporary per step."""
        V = self.gid.size
        g = np.take(self.base, self.gid, mode="clip")  # ids all in range: "clip" gives the same values
        g[self.split_tok] = self.split_grp  # and skips the buffered bounds check of "raise" (half the time)
        p, q = self.target_law.at(), self.draft_law.at()  # read only
        a = np.empty(V)
        b = np.empty(V)
        if q.min() > 0:
            np.divide(p, q, out=a)  # r
        else:
            np.divide(p, np.where(q > 0, q, 1.0), out=a)
        a *= np.take(self.t1, g, out=b, mode="clip")  # theta = t1 r + t0, clipped to [0, 1]
        a += np.take(self.t0, g, out=b, mode="clip")
        np.clip(a, 0.0, 1.0, out=a)
        a *= np.take(self.xd, g, out=b, mode="clip")  # x = q (x0 + theta xd)
        a += np.take(self.x0, g, out=b, mode="clip")
        a *= q
        out = np.subtract(p, a, out=out)
        return np.maximum(out, 0.0, out=out)

    @functools.cached_property
    def residual_groups(self) -> np.ndarray:
        """``[G]`` residual mass :math:`\\sum_{i \\in G} (p_i - x_i)_+` per group: :math:`(P_G - x_G)_+`
        for a group with all its tokens on one side of :math:`x_i = p_i` (every group but those left
        straddling, whose tokens are found over the vocabulary and summed: O(V) each, when asked)."""
        r = self.res_g.copy()
        for G in np.flatnonzero(np.isnan(r)):
            r[G] = float(self._group_residual(int(G))[1].sum())
        return r

    def _group_residual(self, G: int):
        """``(tokens, (p - x)_+ at them)`` of group ``G``, tokens ascending (one pass over the vocabulary's
        sub-bucket ids for a group raced whole, none for a single token)."""
        t = int(self.g_tok[G])
        if t >= 0:
            toks = np.array([t], dtype=np.int64)
        else:
            lo, hi = int(self.f_lo[G]), int(self.f_hi[G])
            toks = np.flatnonzero((self.gid - lo).view(np.uint64) < hi - lo)
        return toks, np.maximum(self.target_law.at(toks) - self.at(toks)[3], 0.0)

    def draw_residual(self, u: float) -> int | None:
        """One draw from :math:`\\mathrm{norm}((p - x)_+)` with the uniform ``u`` in [0, 1): the group by
        inverse CDF over :attr:`residual_groups`, then the token by inverse CDF over the group's own
        residuals, with the conditional uniform ``(u R - C_{G-1}) / R_G``. O(G) plus one pass over
        the sub-bucket ids (none for a single-token group), instead of the O(V) residual.

        Its law is :math:`\\mathrm{norm}((p - x)_+)`: group G w.p. :math:`R_G / R`, token i of G w.p.
        :math:`(p_i - x_i)_+ / R_G`, with :math:`R_G = \\sum_{i \\in G} (p_i - x_i)_+` (for a group on
        one side, :math:`(P_G - x_G)_+` equals that sum up to rounding). A zero-residual token is
        never drawn (``searchsorted(side="right")`` at both levels). ``None`` when the residual has no
        mass (probability 0 in exact arithmetic; the caller draws from the target with the same ``u``)."""
        return self.draw_residual_many([u])[0]

    def draw_residual_many(self, us) -> list[int | None]:
        """:meth:`draw_residual` for each uniform in ``us`` (the rows of a batch sharing this rule): one pass
        over a group's sub-bucket ids per group drawn, not per draw."""
        return self._draw(self.residual_groups, np.asarray(us, dtype=np.float64))

    def _draw(self, r: np.ndarray, us: np.ndarray) -> list[int | None]:
        out: list[int | None] = [None] * us.size
        c = np.cumsum(r)
        if not c[-1] > 0:
            return out
        v = us * c[-1]
        G = np.searchsorted(c, v, side="right")
        G[G >= r.size] = np.flatnonzero(r > 0)[-1]  # u * R rounded up to R: the last group with residual mass
        for g in np.unique(G):
            rows = np.flatnonzero(G == g)
            toks, res = self._group_residual(int(g))
            cc = np.cumsum(res)
            if not cc[-1] > 0:  # a rounding-level (P_G - x_G)_+ on a group whose tokens have no residual:
                r0 = r.copy()  # draw these rows again without it
                r0[g] = 0.0
                for i, tok in zip(rows, self._draw(r0, us[rows])):
                    out[i] = tok
                continue
            w = np.minimum((v[rows] - (c[g - 1] if g else 0.0)) / r[g], 1.0)
            j = np.searchsorted(cc, w * cc[-1], side="right")
            j[j >= toks.size] = np.flatnonzero(res > 0)[-1]
            for i, t in zip(rows, toks[j]):
                out[i] = int(t)
        return out

    def plan(self) -> RacePlan:
        """Every token's arrays at once (the form :func:`selection_law` and the tests read)."""
        theta, key1, key2, x = self.at()
        return RacePlan(x, theta, key1, key2, self.acceptance, np.maximum(self.target - x, 0.0),
                    self.groups(), self.alpha_groups)

