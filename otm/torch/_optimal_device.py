r"""The device path of :func:`otm.torch.optimal`: a set-up with fixed shapes that reads nothing back.

The host path (:mod:`otm.torch._optimal`) copies the laws to the CPU and builds each row's grouped rule
in numpy (:func:`otm.verifiers.optimal.rule`: ratio groups refined until nothing straddles). This path
builds a grouped rule of the same kind with torch ops on the input's device, all rows at once, with shapes
that depend on ``batch``, ``V`` and ``k`` only and fixed iteration counts: no ``.item()``, ``bool(t)``,
``nonzero`` or copy to the host, and no host tensor copied in, so a call traces into one graph with
``torch.compile(fullgraph=True)`` (tests/test_sync_free.py) and meets the conditions of CUDA-graph capture
(not run on a GPU here), with ``validate=False`` and the uniforms given (``validate=True`` adds the checks'
one sync).

The output law is exactly the target whatever the groups (the canonical form: select one draft with an
exactly known selection law :math:`x`, then single-draft speculative sampling from :math:`x` to the
target; :mod:`otm.verifiers.optimal`). The groups decide only the acceptance
:math:`\sum_i \min(x_i, p_i)`, which can fall short of the numpy rule's (about :math:`\alpha^*`): the
gap is measured in ``docs/torch_verifiers.md`` ("Device syncs"). For the same uniforms the two paths
may give different tokens (different groups, hence different race keys and selection laws).

Set-up, per row, in float64 (:func:`setup`):

1. **Cells and buckets.** Each token's ratio :math:`r = p/q` is read from its float64 bits (no sort):
   ``2**DEVICE_GROUP_BITS`` buckets per octave over :math:`[2^{-R}, 2^{R})` (:data:`DEVICE_RATIO_RANGE`;
   ratios outside fall in the outermost of these), each of ``2**sum(ZOOM_BITS)`` cells (the next bits of
   the mantissa); tokens with :math:`q = 0 < p` in their own first bucket, tokens with :math:`p = 0` in
   their own last bucket: :data:`BUCKETS` buckets in descending ratio order.
2. **Groups.** A group is a run of consecutive cells; a token's group and the groups' masses
   :math:`P_G, Q_G` come from a few integer shifts per token and one ``scatter_add``. Zoom rounds
   (:data:`ZOOM_BITS`, numpy's step 1): the two groups around the best cut (the group boundary maximising
   :math:`P_{\le j} - g(D_j)`, :math:`g(s) = 1 - (1 - s)^k`, and the next group with mass), which hold
   the optimal cut :math:`H^*`, are cut into parts, buckets into sub-buckets, then those into
   micro-buckets. A refinement round (:data:`REFINE_ROUNDS`, numpy's step 4 with a fixed count): the
   groups are laid out (steps 3-5) and the :data:`REFINE_GROUPS` groups that lose the most acceptance by
   straddling (tokens on both sides of :math:`x_i = p_i`) are cut into parts. :data:`GROUPS` groups in
   all, in descending ratio order; the layout runs on those with mass, packed first.
3. **Layers.** The isotonic (increasing, weights :math:`P_G`) regression :math:`\lambda` of the
   plain-priority slopes :math:`x_G / P_G` (the slopes of the greatest convex minorant of
   :math:`(P_j, g(D_j))`) by the min-max formula
   :math:`\lambda_i = \max_{a \le i} \min_{b \ge i} \sum_{a..b} x / \sum_{a..b} P`, an
   ``O(GROUPS^2)`` array per row (:data:`CHUNK_ROWS` rows at a time); runs of equal :math:`\lambda` are
   the layers (groups with :math:`P_G = 0`, each a layer of their own).
4. **Splits.** In each layer of two or more groups every split candidate of
   :data:`otm.verifiers.optimal.layout.THETA_CANDIDATES` is tried at once: the per-group pass-1 prefix
   :math:`T_i` by a fixed number of Newton steps (:data:`DEVICE_NEWTON_STEPS` at k = 2, 4 from the root
   in closed form, :data:`otm.verifiers.optimal.layout.NEWTON_STEPS` otherwise; no early exit), theta clipped to
   [0, 1], the selection law recomputed from the clipped theta by the closed form, and the candidate of
   largest acceptance per layer kept (the first in that order on ties: 0.5, 0.25, 0.75, ...;
   interior splits, which let a group spread its theta over its tokens). The kept thetas' law is then recomputed once
   more by the closed form (:func:`race_law`), so the **selection law used is exactly the one the race
   realises** (a theta that is not finite is set to 1 first).
5. **Tokens.** Inside a group, numpy's step 3 (per-token theta, not theta_G alone): where the group runs
   both passes and :math:`b_G \le \lambda_G r \le a_G` over the group's ratio bounds,
   :math:`\theta_i = (\lambda_G r_i - b_G)/(a_G - b_G)` (so :math:`x_i = \lambda_G p_i`), else
   :math:`\theta_i = \theta_G` (:math:`x_i = x_G q_i / Q_G`); either way
   :math:`x_i = q_i (\theta_i a_G + (1 - \theta_i) b_G)` exactly, with
   :math:`\sum_{i \in G} q_i \theta_i = \theta_G Q_G` (:math:`a_G, b_G`: the group's pass-1 and pass-2
   selection mass per unit of draft mass).

Decisions (:func:`decide`): draft position :math:`i` runs in pass 1 iff ``u_i < theta(d_i)``, its key
is its group's pass-1 or pass-2 key (layer, pass, group rank), the smallest key wins (the first
position on ties); accept iff ``u_k * x(y) < p(y)``; else one draw from
:math:`\mathrm{norm}((p - x)_+)` over the vocabulary with ``u_{k+1}``
(:func:`otm.torch._core.residual_draw`, the target where the residual has no mass). The uniform
layout ``[batch, k + 2]`` is the host path's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..verifiers.optimal.layout import NEWTON_STEPS, THETA_CANDIDATES
from ._core import NOT_ACCEPTED, Verified, accept_test, normalised, residual_draw

DEVICE_GROUP_BITS = 3
"""Buckets per octave of the ratio: ``2**DEVICE_GROUP_BITS`` (the top bits of the float's mantissa)."""
ZOOM_BITS = (5, 5)
"""Zoom rounds: in each, the two groups around the best cut between the current groups are cut into
``2**bits`` parts of their ratio range (the next bits of the mantissa): buckets into sub-buckets, then
sub-buckets into micro-buckets of ``2**-(3 + 5 + 5)`` octave."""
REFINE_ROUNDS = 1
"""Rounds that lay the groups out, then cut the :data:`REFINE_GROUPS` groups that lose the most acceptance
(``min(x_G, P_G) - sum_i min(x_i, p_i)``: tokens on both sides of ``x_i = p_i``) into ``2**REFINE_BITS``
parts (numpy's refinement, with a fixed count of groups)."""
REFINE_GROUPS = 4
"""Groups cut per refinement round (the straddling groups are most often one to three whole buckets beside
the cut)."""
REFINE_BITS = 4
"""Each refined group is cut into ``2**REFINE_BITS`` parts."""
REFINE_CANDIDATES = THETA_CANDIDATES[:5]
"""Split candidates of the layout that finds the straddling groups (0.5, 0.25, 0.75, 0, 1); the final layout
tries all of :data:`otm.verifiers.optimal.layout.THETA_CANDIDATES`."""
DEVICE_NEWTON_STEPS = 4
"""Newton steps at k = 2 and 4, where they start from the root in closed form (numpy's ``split_root``, which
stops after a step or two there); other k take :data:`otm.verifiers.optimal.layout.NEWTON_STEPS`."""
DEVICE_RATIO_RANGE = 16
"""Ratios below ``2**-DEVICE_RATIO_RANGE`` share the lowest interior bucket, those from ``2**DEVICE_RATIO_RANGE``
on the highest."""
CHUNK_ROWS = 4
"""Rows whose ``[GROUPS, GROUPS]`` isotonic arrays are formed at once (1.6 MB a row, float64)."""

_ZOOM = sum(ZOOM_BITS)
_WIDTH = 1 << _ZOOM  # finest ratio cells per bucket
_SHIFT = 52 - DEVICE_GROUP_BITS - _ZOOM  # finest cell code = the float64 bits >> _SHIFT
_LO = (1023 - DEVICE_RATIO_RANGE) << (DEVICE_GROUP_BITS + _ZOOM)  # code of 2**-R
_HI = ((1023 + DEVICE_RATIO_RANGE) << (DEVICE_GROUP_BITS + _ZOOM)) - 1  # last code below 2**R
INTERIOR = (2 * DEVICE_RATIO_RANGE) << DEVICE_GROUP_BITS
"""Buckets of ratios in (0, inf): 256."""
BUCKETS = INTERIOR + 2
"""With the bucket of ``q = 0 < p`` (first) and that of ``p = 0`` (last): 258."""
GROUPS = BUCKETS + sum(2 * ((1 << b) - 1) for b in ZOOM_BITS) + REFINE_ROUNDS * REFINE_GROUPS * ((1 << REFINE_BITS) - 1)
"""Raced groups per row: the buckets, and the parts the zoom and refinement rounds add: 442."""


class Setup(NamedTuple):
    """The device set-up of a batch (:func:`setup`): what the race and the accept test read."""

    group: torch.Tensor  # [batch, V] int64: group of each token (0 .. GROUPS - 1, descending ratio)
    theta: torch.Tensor  # [batch, V] float64: probability that a position drafting the token runs in pass 1
    x: torch.Tensor  # [batch, V] float64: the exact selection law
    key1: torch.Tensor  # [batch, GROUPS] int64: race key of a group's pass 1 (smaller wins)
    key2: torch.Tensor  # [batch, GROUPS] int64: race key of its pass 2
    x_groups: torch.Tensor  # [batch, GROUPS] float64: selection law of each group
    theta_groups: torch.Tensor  # [batch, GROUPS] float64: pass-1 fraction of each group's draft mass
    layer: torch.Tensor  # [batch, GROUPS] int64: layer of each group


def _dpow(a, b, d, k: int):
    """``a**k - b**k`` for ``a >= b >= 0`` given ``d = a - b``: ``d * sum a^j b^(k-1-j)`` (Horner in b)."""
    s = torch.ones_like(a * b)
    am = torch.ones_like(s)
    for _ in range(k - 1):
        am = am * a
        s = s * b + am
    return d * s


def _cells(p, q):
    """``(cell, r)``: each token's finest ratio cell, ``0 .. BUCKETS * _WIDTH - 1`` in descending ratio (the
    ``q = 0 < p`` bucket first, the ``p = 0`` bucket last, each ``_WIDTH`` cells), and ``r = p / q`` (p where
    q = 0). Read from the float64 bits, monotone in ``r >= 0``: no sort."""
    r = p / torch.where(q > 0, q, torch.ones_like(q))
    code = (r.view(torch.int64) >> _SHIFT).clamp(_LO, _HI)
    cell = torch.where(p == 0, (BUCKETS - 1) * _WIDTH, torch.where(q == 0, 0, _WIDTH + _HI - code))
    return cell, r


def _masses(cell, splits, p, q, G: int):
    """``(group, P, Q)``: the group of each token and the groups' masses ``[batch, G]``. A token's group is its
    bucket plus, for each split (cut points ``start + m * 2**shift``, ``m = 1 .. parts - 1``), the cut points at
    or below its cell: the count of group starts at or below it, less one (a searchsorted over the sorted
    starts, computed with a shift per split)."""
    group = cell >> _ZOOM
    for start, shift, parts in splits:
        group += ((cell - start) >> shift).clamp_(0, parts - 1)
    P = torch.zeros(p.shape[0], G, dtype=p.dtype, device=p.device).scatter_add_(1, group, p)
    return group, P, torch.zeros_like(P).scatter_add_(1, group, q)


def _split_groups(starts, splits, js, bits: int):
    """``starts`` (sorted) and ``splits`` with cut points ``start + m * 2**shift`` (``m = 1 .. 2**bits - 1``) added
    at each group ``js`` (``[batch, 1]`` each), ``2**shift`` the largest power of two at most its width over
    ``2**bits``, at least 1: the group in ``2**bits`` parts (one narrower than that: cut points past its end,
    which still cut the cells into consecutive groups)."""
    ends = F.pad(starts[:, 1:], (0, 1), value=BUCKETS * _WIDTH)
    m = torch.arange(1, 1 << bits, device=starts.device)
    new = []
    for j in js:
        start = starts.gather(1, j)
        width = (ends.gather(1, j) - start).clamp_min(1)
        shift = (torch.log2(width.to(torch.float64)).floor().long() - bits).clamp_min(0)  # exact for these ints
        new.append(start + (m << shift))
        splits = splits + [(start, shift, 1 << bits)]
    return torch.cat([starts, *new], 1).sort(-1).values, splits


def _cut_groups(P, Q, k: int):
    """The two groups around the best cut: the group boundary maximising ``P_{<=j} - g(D_j)`` is after group
    ``j1``; ``j2`` is the next group with mass (the last group if none). ``[batch, 1]`` each."""
    G = P.shape[1]
    after = Q.flip(-1).cumsum(-1).flip(-1) - Q  # draft mass after each group
    gain = P.cumsum(-1) - (1.0 - after**k)
    j1 = gain[:, : G - 1].argmax(-1, keepdim=True)
    gi = torch.arange(G, device=P.device)
    j2 = torch.where(((P > 0) | (Q > 0)) & (gi > j1), gi, G - 1).amin(-1, keepdim=True)
    return j1, j2


def _group_bounds(starts):
    """``(lo, hi, interior)`` ``[batch, G]``: the ratio bounds ``[lo, hi)`` of each group's tokens, and whether
    the group lies in the interior buckets (the end buckets have no bounds)."""
    ends = F.pad(starts[:, 1:], (0, 1), value=BUCKETS * _WIDTH)
    interior = (starts >= _WIDTH) & (ends <= (BUCKETS - 1) * _WIDTH) & (ends > starts)
    code_hi = (_HI - (starts - _WIDTH)).clamp(_LO, _HI)
    code_lo = (_HI - (ends - 1 - _WIDTH)).clamp(_LO, _HI)
    lo = torch.where(code_lo == _LO, 0.0, (code_lo << _SHIFT).view(torch.float64))
    hi = torch.where(code_hi == _HI, torch.inf, ((code_hi + 1) << _SHIFT).view(torch.float64))
    return lo, hi, interior


def _isotonic(y, w):
    """Increasing isotonic regression of ``y / w`` (``y, w >= 0``, ``[batch, n]``) with weights ``w`` by the min-max
    formula :math:`\\lambda_i = \\max_{a \\le i} \\min_{b \\ge i} \\sum_{a..b} y / \\sum_{a..b} w`, :data:`CHUNK_ROWS`
    rows at a time, the ``b`` axis reversed (so the minimum over ``b >= i`` is a cumulative minimum); entries of
    zero weight get some value (unused). The excluded pairs (``b < a``; no weight on a..b) are set to inf by
    additive constants and ``nan_to_num`` (a boolean ``where`` on the CPU costs ten times as much)."""
    n = y.shape[1]
    j = torch.arange(n, device=y.device)
    below = j.unsqueeze(1) > (n - 1 - j).unsqueeze(0)  # [a, j]: a > i = n - 1 - j, i.e. b < a for b = i
    plus = torch.zeros(n, n, dtype=y.dtype, device=y.device).masked_fill_(below, torch.inf)  # once per call
    out = []
    for s in range(0, y.shape[0], CHUNK_ROWS):
        cy = F.pad(y[s : s + CHUNK_ROWS].cumsum(-1), (1, 0))  # [c, n + 1]: non-decreasing
        cw = F.pad(w[s : s + CHUNK_ROWS].cumsum(-1), (1, 0))
        m = cy[:, 1:].flip(-1).unsqueeze(1) - cy[:, :-1].unsqueeze(2)  # [c, a, j]: sum of y over a..b, b = n - 1 - j
        m = m.div_(cw[:, 1:].flip(-1).unsqueeze(1) - cw[:, :-1].unsqueeze(2))  # b >= a: >= 0, inf or nan (0 / 0)
        m = m.add_(plus).nan_to_num_(nan=torch.inf, posinf=torch.inf).cummin(-1).values  # min over b >= i
        out.append(m.sub_(plus).nan_to_num_(nan=-torch.inf).amax(1).flip(-1))  # max over a <= i
    return torch.cat(out)


def race_law(theta, Q, cA, st, en, k: int):
    """``(x, x1)`` of the layered two-pass race: the exact selection law of each group and its pass-1 part.

    ``theta``, ``Q`` ``[..., G]`` (a leading candidates axis allowed on ``theta``), ``cA`` the draft mass
    from each group's layer on (``1 - D`` before the layer), ``st``, ``en`` the first and last group of each
    group's layer. Within a layer pass 1 runs over the groups in rank order, then pass 2: with ``T``, ``U``
    the layer's pass-1 and pass-2 prefix masses and ``Theta`` its pass-1 mass,
    ``x = [(cA - T_{i-1})^k - (cA - T_i)^k] + [(cA - Theta - U_{i-1})^k - (cA - Theta - U_i)^k]``.
    """
    shape = theta.shape
    Qb, cAb = Q.expand(shape), cA.expand(shape)
    stb, enb = st.expand(shape), en.expand(shape)
    piece1 = theta * Qb
    piece2 = Qb - piece1
    c1 = piece1.cumsum(-1)
    T = c1 - (c1 - piece1).gather(-1, stb)  # within-layer inclusive prefix of pass 1
    c2 = piece2.cumsum(-1)
    U = c2 - (c2 - piece2).gather(-1, stb)
    Theta = T.gather(-1, enb)
    a1 = cAb - (T - piece1)
    x1 = _dpow(a1, (a1 - piece1).clamp_min(0.0), piece1, k)
    a2 = (cAb - Theta - (U - piece2)).clamp_min(0.0)
    x2 = _dpow(a2, (a2 - piece2).clamp_min(0.0), piece2, k)
    return x1 + x2, x1


def _split(cA, L, Qc, Vt, S, k: int):
    """``T`` solving ``(c^k - (c-T)^k) + ((c-S)^k - (c-S-Qc+T)^k) = Vt`` in ``[max(0, Qc-L+S), min(Qc, S)]``:
    :func:`otm.verifiers.optimal.layout.split_root`'s start, then a fixed count of Newton steps
    (:data:`DEVICE_NEWTON_STEPS` at k = 2 and 4, :data:`otm.verifiers.optimal.layout.NEWTON_STEPS` otherwise),
    none skipped."""
    lo = (Qc - (L - S)).clamp_min(0.0)
    hi = torch.minimum(Qc, S)
    cs = cA - S
    W = cs - Qc + cA
    C = (cA**k + cs**k - Vt).clamp_min(0.0)
    a_min, a_max = cA - hi, cA - lo
    if k in (2, 4):
        m = 0.5 * W
        m2 = m * m
        t2 = 0.5 * C - m2 if k == 2 else (0.5 * C - m2 * m2) / (3.0 * m2 + torch.sqrt(8.0 * m2 * m2 + 0.5 * C))
        a = m + torch.sqrt(torch.nan_to_num(t2, nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0))
    else:
        a = C ** (1.0 / k)
    a = torch.minimum(torch.maximum(a, a_min), a_max)
    for _ in range(DEVICE_NEWTON_STEPS if k in (2, 4) else NEWTON_STEPS):
        b = (W - a).clamp_min(0.0)
        ak1, bk1 = a ** (k - 1), b ** (k - 1)
        over = a * ak1 + b * bk1 - C
        d = k * (ak1 - bk1)
        ok = (over > 0) & (d > 0)
        step = torch.where(ok, over / torch.where(ok, d, 1.0), 0.0)
        a = torch.maximum(a - step, a_min)
    return cA - a


def _constant(values, like):
    """``values`` (Python floats) as a tensor of ``like``'s dtype and device, made there by ``where`` over an
    ``arange``: no host tensor is copied in (a CUDA graph cannot capture that copy)."""
    i = torch.arange(len(values), device=like.device)
    out = torch.zeros(len(values), dtype=like.dtype, device=like.device)
    for j, v in enumerate(values):
        out = torch.where(i == j, v, out)
    return out


def _layout(P, Q, k: int, candidates):
    """The layered two-pass race on the groups ``P``, ``Q`` ``[batch, G]`` (descending ratio, the groups with
    mass first, the empty ones after them):
    ``(x, theta, x1, layer)`` per group, ``x`` exactly the race's selection law for ``theta``."""
    batch, G = P.shape
    idx = torch.arange(G, device=P.device).expand(batch, G)
    comp_lo = Q.flip(-1).cumsum(-1).flip(-1)  # 1 - D before each group
    comp_hi = F.pad(comp_lo[:, 1:], (0, 1))  # 1 - D after it
    if k == 1:  # the selection law is the draft whatever the layout
        ones = torch.ones_like(P)
        return _dpow(comp_lo, comp_hi, Q, 1), ones, _dpow(comp_lo, comp_hi, Q, 1), idx
    x_plain = _dpow(comp_lo, comp_hi, Q, k)
    lam = _isotonic(x_plain, P)
    lam = torch.where(P > 0, lam, -torch.inf).cummax(-1).values  # groups without target mass: the previous value
    solo = P == 0  # p = 0 (never accepted; plain priority) and the empty groups (packed last): a layer each
    start = torch.ones_like(solo)
    start[:, 1:] = (lam[:, 1:] != lam[:, :-1]) | solo[:, 1:] | solo[:, :-1]
    end = torch.ones_like(solo)
    end[:, :-1] = start[:, 1:]
    layer = start.long().cumsum(-1) - 1
    st = torch.where(start, idx, 0).cummax(-1).values
    en = torch.where(end, idx, G).flip(-1).cummin(-1).values.flip(-1)
    fixed = (start & end) | solo | (Q == 0)  # theta = 1: single-group layers, p = 0, no draft mass
    cA = comp_lo.gather(1, st)
    L = cA - comp_hi.gather(1, en)
    Qc = cA - comp_hi  # draft mass of the layer up to this group, inclusive
    cum_p = P.cumsum(-1)
    Vt = lam * (cum_p - (cum_p - P).gather(1, st))
    v = lam * P / torch.where(Q > 0, Q, 1.0)
    v = torch.where(Q > 0, v, torch.inf)
    v_first, v_last = v.gather(1, st), v.gather(1, en)
    s_lo = cA - torch.clamp_max(v_first / k, 1e300) ** (1.0 / (k - 1))
    s_hi = cA - (v_last / k) ** (1.0 / (k - 1))
    s_lo = torch.minimum(torch.nan_to_num(s_lo, nan=0.0, neginf=0.0).clamp_min(0.0), L)
    s_hi = torch.minimum(torch.maximum(torch.nan_to_num(s_hi, nan=0.0, neginf=0.0), s_lo), L)
    frac = _constant(candidates, P)[:, None]  # [C, 1]
    S = s_lo.unsqueeze(1) + frac * (s_hi - s_lo).unsqueeze(1)  # [batch, C, G]
    c = lambda t: t.unsqueeze(1)  # noqa: E731  [batch, 1, G]
    T = _split(c(cA), c(L), c(Qc), c(Vt), S, k)
    T_prev = torch.where(c(start), 0.0, F.pad(T[..., :-1], (1, 0)))
    th = ((T - T_prev) / c(torch.where(Q > 0, Q, 1.0))).clamp(0.0, 1.0)
    th = torch.where(c(fixed) | ~torch.isfinite(th), 1.0, th)
    x_c, _ = race_law(th, c(Q), c(cA), c(st), c(en), k)
    acc = torch.zeros_like(x_c).scatter_add_(-1, c(layer).expand_as(x_c), torch.minimum(x_c, c(P)))  # per layer
    best = torch.nan_to_num(acc, nan=-torch.inf).argmax(1)  # [batch, G layers]: first of the largest
    theta = th.gather(1, best.gather(1, layer).unsqueeze(1)).squeeze(1)
    x, x1 = race_law(theta, Q, cA, st, en, k)
    return x, theta, x1, layer


def _group_rule(P, Q, starts, k: int, candidates=THETA_CANDIDATES):
    """The layered two-pass race on the groups (masses ``P``, ``Q``, cells from ``starts``) and the rule inside
    each group (module docstring, steps 3-5): ``(key1, key2, x, theta, layer, t1, t0, x0, xd)`` per group, with
    ``theta_i = clip(t1 r_i + t0, 0, 1)`` and ``x_i = q_i (x0 + theta_i xd)`` for a token of ratio ``r_i``."""
    G = P.shape[1]
    # the layout runs on the groups with mass, packed first in ratio order (empty groups last, a layer each)
    live = (P > 0) | (Q > 0)
    n_live = live.long().sum(-1, keepdim=True)
    dest = torch.where(live, live.long().cumsum(-1) - 1, n_live + (~live).long().cumsum(-1) - 1)  # [batch, G]
    packed = (torch.zeros_like(P).scatter_(1, dest, t) for t in (P, Q))
    x_g, th_g, x1_g, layer = (t.gather(1, dest) for t in _layout(*packed, k, candidates))
    key1 = 2 * layer * G + dest  # (layer, pass, rank among the groups with mass)
    key2 = key1 + G
    # inside a group (module docstring, step 5)
    lo, hi, interior = _group_bounds(starts)
    both = interior & (th_g > 0) & (th_g < 1) & (P > 0) & (Q > 0)
    Qs = torch.where(Q > 0, Q, 1.0)
    a_g = x1_g / torch.where(both, th_g * Qs, 1.0)  # pass-1 selection mass per unit of draft mass
    b_g = (x_g - x1_g) / torch.where(both, (1.0 - th_g) * Qs, 1.0)  # pass 2
    lam_g = x_g / torch.where(P > 0, P, 1.0)
    spread = both & (b_g <= lam_g * lo) & (lam_g * hi <= a_g) & (a_g > b_g)
    width = torch.where(spread, a_g - b_g, 1.0)
    t1 = torch.where(spread, lam_g / width, 0.0)
    t0 = torch.where(spread, -b_g / width, th_g)
    w = x_g / Qs
    x0 = torch.where(spread, b_g, w)
    xd = torch.where(spread, a_g - b_g, 0.0)
    return key1, key2, x_g, th_g, layer, t1, t0, x0, xd


def _token_law(group, r, q, t1, t0, x0, xd):
    """``(theta, x)`` per token: ``theta_i = clip(t1 r_i + t0, 0, 1)``, ``x_i = q_i (x0 + theta_i xd)`` (its group's)."""
    theta = (t1.gather(1, group) * r + t0.gather(1, group)).clamp(0.0, 1.0)
    return theta, q * (x0.gather(1, group) + theta * xd.gather(1, group))


def setup(p: torch.Tensor, q: torch.Tensor, k: int) -> Setup:
    """The device set-up for normalised float64 laws ``p``, ``q`` ``[batch, V]`` and ``k`` i.i.d. drafts
    (module docstring, steps 1-5): fixed shapes, no value read back."""
    batch = p.shape[0]
    cell, r = _cells(p, q)
    starts, splits = (torch.arange(BUCKETS, device=p.device) * _WIDTH).repeat(batch, 1), []
    for bits in ZOOM_BITS:  # the groups around the best cut, cut finer
        _, P, Q = _masses(cell, splits, p, q, starts.shape[1])
        starts, splits = _split_groups(starts, splits, _cut_groups(P, Q, k), bits)
    for _ in range(REFINE_ROUNDS):  # the groups that lose the most acceptance by straddling, cut finer
        group, P, Q = _masses(cell, splits, p, q, starts.shape[1])
        _, _, x_g, _, _, *coef = _group_rule(P, Q, starts, k, REFINE_CANDIDATES)
        x = _token_law(group, r, q, *coef)[1]
        loss = torch.minimum(x_g, P) - torch.zeros_like(P).scatter_add_(1, group, torch.minimum(x, p))
        worst = loss.topk(REFINE_GROUPS, -1).indices.split(1, -1)
        starts, splits = _split_groups(starts, splits, worst, REFINE_BITS)
    group, P, Q = _masses(cell, splits, p, q, starts.shape[1])  # GROUPS
    key1, key2, x_g, th_g, layer, *coef = _group_rule(P, Q, starts, k)
    theta, x = _token_law(group, r, q, *coef)
    return Setup(group, theta, x, key1, key2, x_g, th_g, layer)


def decide(p: torch.Tensor, s: Setup, d: torch.Tensor, u: torch.Tensor) -> Verified:
    """The race, the accept test and the residual draw on the device (module docstring): ``p`` the normalised
    float64 target ``[batch, V]``, ``d`` int64 drafts ``[batch, k]``, ``u`` float64 ``[batch, k + 2]``."""
    k = d.shape[1]
    g = s.group.gather(1, d)  # [batch, k]
    keys = torch.where(u[:, :k] < s.theta.gather(1, d), s.key1.gather(1, g), s.key2.gather(1, g))
    index = keys.argmin(-1)  # [batch]: smallest key, the first position on ties
    y = d.gather(1, index.unsqueeze(1))  # [batch, 1]
    ok = accept_test(u[:, k], p.gather(1, y).squeeze(1), s.x.gather(1, y).squeeze(1))  # u * x(y) < p(y)
    z = residual_draw((p - s.x).clamp_min(0.0), p, u[:, k + 1])  # norm((p - x)_+), the target if empty
    hit = d == z.unsqueeze(1)
    z_index = torch.where(hit.any(-1), hit.to(torch.uint8).argmax(-1), NOT_ACCEPTED)
    return Verified(torch.where(ok, y.squeeze(1), z), torch.where(ok, index, z_index))


def optimal_on_device(target: torch.Tensor, draft: torch.Tensor, d: torch.Tensor, u: torch.Tensor) -> Verified:
    """:func:`otm.torch.optimal` on checked inputs (``d`` int64 ``[batch, k]``, ``u`` float64 ``[batch, k + 2]``):
    laws normalised in float64 on their device, :func:`setup`, :func:`decide`."""
    p, q = normalised(target, torch.float64), normalised(draft, torch.float64)
    return decide(p, setup(p, q, d.shape[1]), d, u)


def acceptance(s: Setup, p: torch.Tensor) -> torch.Tensor:
    """``[batch]`` :math:`\\sum_i \\min(x_i, p_i)`: the probability that the selected draft is accepted."""
    return torch.minimum(s.x, p).sum(-1)


__all__ = ["BUCKETS", "GROUPS", "Setup", "acceptance", "decide", "optimal_on_device", "race_law", "setup"]
