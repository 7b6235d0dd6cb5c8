r"""``optimal``: select one draft by a layered two-pass priority race, then single-draft SD.

For k i.i.d. drafts :math:`x_1..x_k \sim q` (``draft``) and target :math:`p`
(``target``) the rule has Khisti et al.'s canonical form (ICLR 2025, theory
section 5.2): (1) select ONE drafted token :math:`Y'` with an exactly known law
:math:`x(y) = P(Y' = y)`; (2) single-draft speculative sampling from :math:`x` to
:math:`p`: accept :math:`Y'` w.p. :math:`\min(1, p(Y')/x(Y'))`, else draw from
:math:`\mathrm{norm}((p - x)_+)`. Step (2) outputs exactly :math:`p` for ANY
selection law :math:`x`, so the output law is the target whatever the choices
below; they only decide the acceptance :math:`\sum_y \min(x(y), p(y))`.

Selection as a race on the draft-mass clock
-------------------------------------------
Give every token :math:`i` a measure :math:`\mu_i` on :math:`[0, 1]` of mass
:math:`q_i` with :math:`\sum_i \mu_i = ` Lebesgue (a *tiling*). Each draft position
with token :math:`i` draws a key :math:`s \sim \mu_i / q_i`; the position with the
smallest key is selected. Positions are i.i.d. and the key of a position is
Uniform[0,1], so

.. math::

    x_i = k \int (1 - s)^{k-1}\, d\mu_i(s) = \int g'(s)\, d\mu_i(s),
    \qquad g(s) = 1 - (1 - s)^k .

A fixed priority order is the tiling by consecutive intervals
(:math:`x_{\sigma_j} = g(D_j) - g(D_{j-1})`); every point of the base polytope
of the coverage function :math:`f(A) = g(q(A))` (theory section 11) is some tiling.

The target selection law
------------------------
Sort tokens by :math:`r = p/q` descending (tokens with :math:`p = 0` last) and let
:math:`\lambda` be the isotonic (increasing, weights :math:`p`) regression of the
per-token slopes :math:`s_j = (g(D_j) - g(D_{j-1}))/p_j`, i.e. the slopes of the
greatest convex minorant of the points :math:`(P_j, g(D_j))`. Then
:math:`x^\star = \lambda p` is the lexicographically optimal base of :math:`f`
with respect to :math:`p` (Fujishige 1980, "Lexicographically optimal base of a
polymatroid with respect to a weight vector"); since :math:`\min(x, p) = p\,h(x/p)`
with :math:`h(t) = \min(t, 1)` concave, that base maximises
:math:`\sum \min(x, p)` over the base polytope, whose maximum is
:math:`\alpha^* = \min_H p(H) + 1 - q(H)^k` (polymatroid rank of the box
:math:`p`; Hu et al., ICLR 2025). [Proved, standard results; the equality
:math:`\sum\min(x^\star, p) = \alpha^*` is also checked against
:func:`otm.optimum.optimal_acceptance_of` and the LP in the tests.]

Realising it: layered two-pass priority
---------------------------------------
The isotonic blocks (layers) are consecutive in the ratio order and are given
consecutive intervals :math:`[A, B]` of the clock (layers in ratio order). Inside a
layer with tokens :math:`1..n` (ratio order), prefix masses :math:`Q_i` and prefix
targets :math:`V_i = \lambda P_i`, a split point :math:`\Theta` divides
:math:`[A, B]` into a first pass :math:`[A, A+\Theta]` and a second pass
:math:`[A+\Theta, B]`; token :math:`i` takes a fraction :math:`\theta_i` of its mass
in the first pass and the rest in the second, each pass laid out in ratio order.
As a rule: a position with token :math:`i` is in pass 1 w.p. :math:`\theta_i`
(independently); select the drafted position with the smallest key
(layer, pass, ratio rank). With :math:`T_i = \sum_{j \le i} \theta_j q_j`,
:math:`U_i = Q_i - T_i`, :math:`c = 1 - A` and :math:`\Theta = T_n`:

.. math::

    x_i = \big[(c - T_{i-1})^k - (c - T_i)^k\big]
        + \big[(c - \Theta - U_{i-1})^k - (c - \Theta - U_i)^k\big].

Given :math:`\Theta`, :math:`T_i` solves the scalar monotone equation
:math:`(c^k - (c-T)^k) + ((c-\Theta)^k - (c-\Theta-Q_i+T)^k) = V_i` (independently
per token: vectorised, Newton from below on a concave increasing function). If the
solution is monotone with :math:`0 \le T_i - T_{i-1} \le q_i`, the layer realises
:math:`x^\star` exactly. Otherwise :math:`\theta` is clipped to [0, 1] and
:math:`x` recomputed from the clipped :math:`\theta` by the formula above, so
**the selection law used is always exactly the one the sampler realises**; only
the acceptance may fall short of :math:`\alpha^*`. :math:`\Theta` is chosen per
layer among a few candidates in :math:`[g'^{-1}(v_1), g'^{-1}(v_n)] - A`
(:math:`v = \lambda r`), the necessary range for the first and last token, keeping
the candidate with the largest acceptance.

What is proved and what is tested
---------------------------------
* Proved: the output law is exactly the target for every input (canonical form
  + exact selection law; the selection law's closed form is also checked by
  enumeration in the tests); :math:`\sum\min(x^\star, p) = \alpha^*`.
* NOT proved: that a two-pass layout realising :math:`x^\star` always exists.
  Measured: on random peaked laws at V = 49152, k = 2, 4, 8 the gap
  :math:`\alpha^* - ` :func:`acceptance` was below 1e-12 in every case tried; on
  the embedded pair's real laws (64 positions, k = 2, 4, 8; ``analysis/accept_vs_time.py``)
  it was above 1e-9 at 1 of 192 cases (2.1e-3, k = 4; three more, 1e-8 to 3e-3, were
  closed by trying more split candidates); on adversarial small laws (Dirichlet 0.1-3,
  V <= 13, k <= 8) it was positive in about 0.2% of cases (largest seen 5e-3). The rule
  reports its own gap: ``bind(target, scheme).gap``.

``acceptance`` returns :math:`\sum_y \min(x(y), p(y))`, the probability that the
selected draft is accepted. When the gap is 0 the residual never lands on a draft
(rejection implies every draft lies in the min cut :math:`H^*`, where
:math:`x \ge p`), so this is the membership acceptance :math:`\alpha^*`; when the gap
is positive the membership acceptance lies between it and :math:`\alpha^*`.

Groups: the rule at real vocabularies
-------------------------------------
:func:`build_tokens` lays out every token (one argsort, one isotonic regression,
Newton passes over the tokens of multi-token layers): 10-200 ms per position at
V = 49152. The rule that :func:`sample`, :func:`law`, :func:`bind` and
:func:`otm.torch.optimal` use, :func:`rule` (and :func:`build`, its arrays over the
vocabulary), races *groups* of tokens instead:

1. tokens are cut into ratio slices (*buckets*) of ``2**-GROUP_BITS`` octave, and
   each bucket into ``2**FINE_BITS`` *sub-buckets*, read from the floats' bits (no sort
   over the vocabulary; one weighted bincount per law); the two buckets around the
   best cut between whole buckets hold the optimal cut :math:`H^*` and are raced as
   their sub-buckets, and the two sub-buckets around the best cut between those as
   single tokens, from the start;
2. the layered two-pass race above is built on the groups (each a "token" of target
   mass :math:`P_G` and draft mass :math:`Q_G`; about 150-350 groups at V = 49152);
3. inside a group, each draft position takes its group's pass-1 key with
   probability :math:`\theta_i`, else the pass-2 key, and ties go to the first
   position. Given the groups and passes of all positions (which decide the winning
   position), the tokens are independent with law :math:`q_i \theta_i / \Theta_G` in
   pass 1 and :math:`q_i (1 - \theta_i) / (Q_G - \Theta_G)` in pass 2, so the selection
   law is exactly :math:`x_i = q_i(\theta_i a_G + (1 - \theta_i) b_G)`, with
   :math:`a_G, b_G` the group's pass-1 and pass-2 selection mass per unit of draft mass.
   :math:`\theta_i = \theta_G` gives :math:`x_i = x_G q_i / Q_G`; where :math:`b_G \le
   \lambda_G r_i \le a_G` over the group's ratio range, :math:`\theta_i = (\lambda_G r_i -
   b_G)/(a_G - b_G)` gives :math:`x_i = \lambda_G p_i` (:math:`\lambda_G = x_G / P_G`),
   and the constraint :math:`\sum_i q_i \theta_i = \Theta_G` holds by construction;
4. a group whose tokens lie on both sides of :math:`x_i = p_i` (a *straddling* group)
   is split into single tokens and the layout redone (up to :data:`REFINE_ROUNDS`);
   a whole bucket's tokens are counted only then (one token cannot straddle).

The law is exact whatever the groups (step 3); the acceptance is
:math:`\sum_G \min(x_G, P_G)` when nothing straddles, which equals the optimum over
group-closed cuts, :math:`\alpha_G \ge \alpha^*`, and so is :math:`\alpha^*` itself.
``Plan.gap_bound = alpha_groups - acceptance`` bounds the gap from above without a
sort. Measured (tests and ``analysis/bench_verify.py --optimal-only``): gap below
1e-12 on every peaked and real law tried at V = 49152, k = 2, 4, 8, usually after one
group layout. Per position: O(V) passes (the ratio's bits, two weighted bincounts, the
tokens of the two single sub-buckets),
one group layout, and O(k) for the race and the accept test; after a rejection, the draw
from :math:`\mathrm{norm}((p - x)_+)` goes group first (inverse CDF over the groups' residual
masses :math:`(P_G - x_G)_+`), then to a token of that group (one pass over the sub-bucket
ids): :meth:`Rule.draw_residual`, never the O(V) residual itself. Times:
``docs/torch_verifiers.md``.

>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)  # alpha* = 0.2 + 1 - 0.6**2
0.84
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..laws import OtmError, check_k, check_law
from .base import Bound, Outcome, check_inputs, inverse_cdf_draw, require_scheme, residual_law, serve_selected

THETA_CANDIDATES = (0.5, 0.25, 0.75, 0.0, 1.0) + tuple(
    f for f in (i / 16 for i in range(17)) if f not in (0.5, 0.25, 0.75, 0.0, 1.0)
)
"""Fractions of the admissible split range tried per layer: 0.5, then 0.25 for the layers whose
acceptance falls short of their share of alpha*, then all the others at once for those still short
(the first of largest acceptance wins). The 16ths after the first five close gaps of 1e-8 to 3e-3 seen on 3 of 192 real
positions (embedded pair); 32nds closed the same three at two to four times the cost. (Until
2026-11-26 the next four were tried one at a time first: on the real laws a batch-32 layout then made
4.5 passes on average, each with its fixed cost of some 60 numpy calls.)"""

NEWTON_STEPS = 12
"""Newton iterations for the per-token split equation (monotone from below; exits early)."""


def _dpow(a: np.ndarray, b: np.ndarray, d: np.ndarray, k: int) -> np.ndarray:
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
class Plan:
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


def _split(cA, L, Q, Vt, theta_split, k):
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


def _descending(values: np.ndarray) -> np.ndarray:
    """``np.argsort(-values, kind="stable")``: the unstable (vectorised) sort when no two values are
    equal, which is then the only order; the stable sort when some are (or are nan)."""
    order = np.argsort(-values)
    s = values[order]
    if (s[1:] == s[:-1]).any() or np.isnan(s[-1:]).any():  # nan sorts last
        order = np.argsort(-values, kind="stable")
    return order


def _tokens_in(gid: np.ndarray, buckets: np.ndarray) -> np.ndarray:
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
class Rule:
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
        tok = _tokens_in(self.gid, self.left)
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

    def plan(self) -> Plan:
        """Every token's arrays at once (the form :func:`selection_law` and the tests read)."""
        theta, key1, key2, x = self.at()
        return Plan(x, theta, key1, key2, self.acceptance, np.maximum(self.target - x, 0.0),
                    self.groups(), self.alpha_groups)


def build(target, draft, k: int, *, group_bits: int | None = None) -> Plan:
    """The selection rule for one position, every token's arrays at once: ``rule(...).plan()``."""
    return rule(target, draft, k, group_bits=group_bits).plan()


def rule(target, draft, k: int, *, group_bits: int | None = None) -> Rule:
    r"""The selection rule for one position, racing groups of tokens of nearly equal ratio.

    Tokens are cut into groups consecutive in the ratio order (``2**group_bits`` buckets per
    octave of :math:`p/q`, each of ``2**FINE_BITS`` sub-buckets, :func:`_ratio_bins`: no sort;
    steps 1 and 4 of the module docstring say which are raced whole); the layered two-pass race of
    the module docstring is built on the groups as if each were one token of target mass
    :math:`P_G = p(G)` and draft mass :math:`Q_G = q(G)`, giving the group selection law
    :math:`x_G`. Each draft position gets its group's pass and key; the smallest key wins,
    the first position on ties. Given the positions' groups and passes (which decide the
    winning position) the drafted tokens are independent with law :math:`q_i / Q_G` inside
    their groups, so the selected token's law is exactly

    .. math::  x_i = x_{G(i)}\, q_i / Q_{G(i)} .

    Acceptance. :math:`\sum_i \min(x_i, p_i) \le \sum_G \min(x_G, P_G)`, with equality
    when no group *straddles*, i.e. has tokens on both sides of :math:`x_i = p_i`; a group
    of ratios in :math:`[lo, hi)` cannot straddle when :math:`x_G/Q_G \le lo` or
    :math:`\ge hi`. Straddling groups are split into single tokens (sorted: they are few)
    and the groups rebuilt, up to :data:`REFINE_ROUNDS` times; straddling groups whose losses
    :math:`\\sum_i (p_i - x_i)_+ \\le Q_G (hi - x_G/Q_G)` add up to at most
    :data:`SPLIT_TOLERANCE` stay whole. The group race reaches
    :math:`\alpha_G = 1 + \min_j g(D_j) - P_j` over the group boundaries (when its own
    layout reaches its optimum), and :math:`\alpha_G \ge \alpha^*` since fewer cuts are
    tried; so when nothing straddles, the acceptance equals :math:`\alpha^*`.
    ``plan.gap_bound = alpha_groups - acceptance`` bounds the gap to :math:`\alpha^*`
    from above without a sort; :func:`bind` reports the gap itself.
    """
    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    return _rule(p, q, check_k(k), group_bits)


def _rule(p: np.ndarray, q: np.ndarray, k: int, group_bits: int | None = None) -> Rule:
    """:func:`rule` on checked, normalised float64 laws."""
    return _drive([_rule_steps(p, q, k, group_bits)], k)[0]


def rules(targets, drafts, k: int) -> list[Rule]:
    """:func:`rule` of every row of ``targets``, ``drafts`` (``[rows, V]``), the rows' group layouts
    solved together (:func:`_layout_rows`): each row's rule is the one :func:`rule` gives it alone,
    bit for bit. Each row is checked and normalised by :func:`otm.laws.check_law`."""
    targets, drafts = np.asarray(targets, dtype=np.float64), np.asarray(drafts, dtype=np.float64)
    if targets.ndim != 2 or drafts.shape != targets.shape:
        raise OtmError(f"targets and drafts must be [rows, V] arrays of one shape, got {targets.shape} and {drafts.shape}")
    k = check_k(k)
    rows = [(check_law(t, "target"), check_law(d, "draft")) for t, d in zip(targets, drafts)]
    return _rules(np.array([t for t, _ in rows]), np.array([d for _, d in rows]), k)


def _rules(targets: np.ndarray, drafts: np.ndarray, k: int) -> list[Rule]:
    """:func:`rules` on checked, normalised float64 rows."""
    return _drive([_rule_steps(t, d, k, None) for t, d in zip(targets, drafts)], k)


def _drive(steps, k: int) -> list[Rule]:
    """Run :func:`_rule_steps` generators in lock step: each round's group layouts in one call."""
    out: list = [None] * len(steps)
    pending = {i: next(s) for i, s in enumerate(steps)}
    while pending:
        ids = list(pending)
        layouts = _layout_rows([pending[i][0] for i in ids], [pending[i][1] for i in ids], k)
        pending = {}
        for i, lay in zip(ids, layouts):
            try:
                pending[i] = steps[i].send(lay)
            except StopIteration as done:
                out[i] = done.value
    return out


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


def _rule_steps(p: np.ndarray, q: np.ndarray, k: int, group_bits: int | None, laws=None):
    """:func:`_rule` as a generator: yields each round's groups ``(P_g, Q_g)``, receives their layout.

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
                tok = _tokens_in(fid, single)
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
    return Rule(pl, ql, fid, base_f, tok[perm], ug[is_t][perm] if tok.size else tok, t1, t0, x0, xd,
                key1_g, key2_g, float(acc_g.sum()), alpha_g, lf, res_g, f_lo, f_hi, g_tok)


def _sub_buckets(split: np.ndarray, per: int) -> np.ndarray:
    """The sub-buckets of the split buckets, in ratio order."""
    return (np.flatnonzero(split)[:, None] * per + np.arange(per)).ravel()


def build_tokens(target, draft, k: int) -> Plan:
    """The token-level construction (module docstring): O(V log V), every token its own race key.

    The reference the grouped :func:`build` reduces to when every group is one token; at
    V = 49152 it costs 10-200 ms (the Newton passes over the tokens of large layers).
    """
    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    k = check_k(k)
    x, theta, key1, key2, _ = _layout(p, q, k)
    acc = float(np.minimum(x, p).sum())
    return Plan(x, theta, key1, key2, acc, np.maximum(p - x, 0.0))


def _layout(p: np.ndarray, q: np.ndarray, k: int):
    """``(x, theta, key1, key2, x1)`` of the layered two-pass race over the entries of ``p``, ``q``
    (``x1``: the part of ``x`` selected in pass 1)."""
    return _layout_rows([p], [q], k)[0]


def _row_cumsum(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Cumulative sums restarted at every row (rows are ``values[bounds[r]:bounds[r + 1]]``), each
    row's sums computed from that row alone (so a row's numbers do not depend on the others)."""
    out = np.empty_like(values)
    for a, b in zip(bounds[:-1], bounds[1:]):
        np.cumsum(values[..., a:b], axis=-1, out=out[..., a:b])
    return out


def _layout_rows(Ps, Qs, k: int):
    """:func:`_layout` of several rows at once: elementwise work on all rows together, every
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
    x_s = _dpow(comp_lo, comp_hi, qs, k)  # the plain ratio-order priority
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
    T = _split(cA, L, Q, Vt, S, k)
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
    x1 = _dpow(a1, np.maximum(a1 - piece1, 0.0), piece1, k)
    a2 = cA - Theta - (U_end - piece2)
    x2 = _dpow(np.maximum(a2, 0.0), np.maximum(a2 - piece2, 0.0), piece2, k)
    xx = x1 + x2
    acc = np.add.reduceat(np.minimum(xx, pq), seg, axis=-1)
    want = np.add.reduceat(np.minimum(lam_t, 1.0) * pq, seg)
    return pos, acc, want, xx, th, x1  # with a leading candidates axis when frac is an array


def selection_law(plan: Plan, drafts: np.ndarray) -> np.ndarray:
    """Exact P(selected = y | drafts): each position's key is its token's pass-1 key w.p. theta,
    else its pass-2 key; the smallest key wins, the first position on ties (as ``argmin``)."""
    d = np.asarray(drafts, dtype=np.int64).reshape(-1)
    th = plan.theta[d]
    keys = np.stack([plan.key1[d], plan.key2[d]], 1)  # [k, 2]
    probs = np.stack([th, 1.0 - th], 1)  # [k, 2]
    pos = np.arange(d.size)[:, None]
    out = np.zeros(plan.x.size)
    for j in range(d.size):
        for s in range(2):
            if probs[j, s] == 0:
                continue
            kk = keys[j, s]
            loses_to = (keys > kk) | ((keys == kk) & (pos > j))  # [k, 2]: options of l that j beats
            survive = (probs * loses_to).sum(1)
            survive[j] = 1.0
            out[d[j]] += probs[j, s] * float(np.prod(survive))
    return out


def _law(plan: Plan, target: np.ndarray, d: np.ndarray) -> np.ndarray:
    sel = selection_law(plan, d)
    hit = sel > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(hit, np.minimum(1.0, target / np.where(hit, plan.x, 1.0)), 0.0)
    out = sel * acc
    reject = float((sel * (1.0 - acc)).sum())
    if reject > 0:
        out = out + reject * residual_law(plan.residual, target)
    return out


def _sample(plan: Plan, target: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Outcome:
    u = rng.random(d.size)
    keys = np.where(u < plan.theta[d], plan.key1[d], plan.key2[d])
    i = int(np.argmin(keys))
    return serve_selected(rng, d, i, target[d[i]], plan.x[d[i]], inverse_cdf_draw(lambda: plan.residual), target)


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the k = len(drafts) drafts."""
    target, draft, d = check_inputs(target, draft, drafts)
    return _law(build(target, draft, d.size), target, d)


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    """One verification: race selection (k uniforms), SD accept (one), residual draw if rejected.

    The rule is evaluated lazily (:class:`Rule`): at the k drafts, and after a rejection the
    residual is drawn group first (:meth:`Rule.draw_residual`); the same selection and accept
    decisions as :func:`_sample` on ``rule.plan()`` (whose residual draw is the inverse CDF over
    the tokens: the same law, another token for the same uniform).
    """
    target, draft, d = check_inputs(target, draft, drafts)
    return _sample_rule(_rule(target, draft, d.size), d, rng)


def _sample_rule(rl: Rule, d: np.ndarray, rng: np.random.Generator) -> Outcome:
    u = rng.random(d.size)
    theta, key1, key2, x = rl.at(d)
    i = int(np.argmin(np.where(u < theta, key1, key2)))
    return serve_selected(rng, d, i, rl.target_law.at(d[i : i + 1])[0], x[i], rl.draw_residual, rl.target)


def acceptance(target, draft, k: int) -> float:
    r""":math:`\sum_y \min(x(y), p(y))`, the probability the selected draft is accepted (module doc)."""
    return build(target, draft, k).acceptance


@dataclass(frozen=True)
class OptimalBound(Bound):
    """:class:`Bound` plus the rule's own acceptance, the optimum and the gap between them
    (``bind`` of this module and of :mod:`otm.verifiers.optimal_without_replacement`; ``plan`` is
    that module's ``Plan``)."""

    acceptance: float = float("nan")
    alpha_star: float = float("nan")
    plan: Plan | None = None

    @property
    def gap(self) -> float:
        """``alpha_star - acceptance`` (>= 0 up to rounding; 0 when the layout realises x*)."""
        return self.alpha_star - self.acceptance


def bind(target, scheme) -> OptimalBound:
    """Build the rule once for ``target`` and an ``iid`` scheme; refuse other schemes."""
    from ..optimum import optimal_acceptance_of
    from ..schemes import check_target

    require_scheme(scheme, "iid", "the optimal verifier", "use lp_optimal (small V) or the scheme's own verifier")
    target = check_target(scheme, target)
    plan = build(target, scheme.draft, scheme.k)
    k = scheme.k

    def _law_b(drafts):
        t, _, d = check_inputs(target, scheme.draft, drafts)
        return _law(plan if d.size == k else build(target, scheme.draft, d.size), t, d)

    def _sample_b(drafts, rng):
        t, _, d = check_inputs(target, scheme.draft, drafts)
        return _sample(plan if d.size == k else build(target, scheme.draft, d.size), t, d, rng)

    alpha = optimal_acceptance_of(scheme, target).value
    return OptimalBound(_law_b, _sample_b, acceptance=plan.acceptance, alpha_star=alpha, plan=plan)


__all__ = ["Plan", "Rule", "Scaled", "OptimalBound", "build", "build_tokens", "rule", "rules", "selection_law", "law", "sample", "acceptance", "bind"]
