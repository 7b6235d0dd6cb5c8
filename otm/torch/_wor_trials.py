r"""``kseq_without_replacement``'s set-up on the device: :math:`E[N_\rho]` and its root, torch float64, fixed shapes.

The host set-up (:func:`otm.verifiers.kseq_without_replacement.rule`, one row at a time in numpy) solves
:math:`E[N_\rho] = \rho` by a root search whose every evaluation is the race quadrature of
:func:`otm.verifiers.kseq_without_replacement.expected_trials`. Here the same integral and the same search run on
all rows at once, with shapes fixed by ``(batch, V, k)`` alone and no value read back (a CUDA graph can
capture it, ``torch.compile(fullgraph=True)`` traces it).

**The integral.** :math:`E[N_\rho] = \int_0^\infty e^{-\beta s} P(N_c(s) \le k - 1)\, ds` with the accepted
rates :math:`\min(q, p/\rho)` (total :math:`\beta`) and the rejected ones :math:`c = (q - p/\rho)_+`; the
trapezoid rule in :math:`y = \log s` from :math:`s_0` = ``S0`` with the host's step :func:`default_step`\ (k)
and the host's closed form left of :math:`s_0` (:func:`otm.race_quadrature.left_tail`), and the host's
step-2h error estimate. The grid is the host's grid, run on to a fixed end: :data:`GRID_LAMBDA_FLOOR`
fixes how far (the host cuts at :math:`s_1 = (42 + \log(1/\lambda))/\lambda`, :math:`\lambda` the
decay rate; the nodes past a row's own :math:`s_1` add below :math:`e^{-42}`). A row whose
:math:`\lambda` is below the floor has its integral cut short; the cut part, at most
:math:`e^{-\lambda s_{end}}/\lambda`, is added to its error, so the search still returns a valid
:math:`\rho` (:math:`E[N_\rho]` plus its error at most :math:`\rho`), only a less tight one.

The count law :math:`P(N_c(s) = m)`, :math:`m < k`, of the tokens whose rejected clock has rung by
:math:`s` splits the tokens as :func:`otm.race_window.states_at` does, with a split fixed in advance:

* the :math:`L` largest rates (``torch.topk``, :func:`exact_tokens`): the exact product of
  :math:`(e^{-x} + (1 - e^{-x}) z)`, :math:`x = c s`, truncated to degree :math:`k - 1`, by a
  tree of pairwise products;
* the others, at the nodes where their largest :math:`x` is at most :data:`otm.race_window.TAU`:
  the moment series of :func:`otm.race_window.series_table` (one pass over V per power sum
  :math:`\sum c^n`, scaled by :math:`s^n` at every node) and Newton's identities;
* at the nodes where some other token has :math:`x > \tau`, each of the L largest has rung with
  probability at least :math:`1 - e^{-\tau}`, so :math:`P(N_c \le k - 1)` is at most the binomial
  tail :math:`P(\mathrm{Bin}(L, 1 - e^{-\tau}) \le k - 1)`, below ``RUNG_TOLERANCE`` = 1e-17 by the
  choice of L: it is set to 0 there (the host's own rule at its settled nodes).

**The root.** The host's test in :math:`\log \rho` (``g``: the log of :math:`(E[N_\rho] + \text{error})/\rho`,
its sign the validity test :math:`E[N_\rho] + \text{error} \le \rho`; the exact bound :math:`E[N_\rho] \le \rho`
where every :math:`p \le \rho q`) on the bracket from :math:`\rho^*_{iid}` (K-SEQ's, from the sync-free
:func:`otm.torch._rho.search`; invalid unless it is the answer) to the smaller of :math:`E[T]`, the expected
index of the k-th distinct arrival (:math:`E[N_\rho] \le E[T]` for every rho), and :math:`\max p/q` (from
there on every rho is valid): both ends hold in exact arithmetic. Then :data:`ROOT_STEPS` Illinois steps,
with two safeguards: a bisection where the secant leaves the bracket or the bracket has not halved in two
steps, and after a step that landed on the invalid side a step :data:`PUSH` times the secant's (the
invalid end converges on the root, and the valid end, the result, would otherwise follow by bisection
only). A row stops moving at the host's stop (:math:`-g \le` ``ROOT_TOL`` = 1e-10 at the valid end, or a
bracket of 1e-13); a row that has not reached it keeps its valid end (``Root.converged`` says which).
The stop reads g, not rho, so where g is flat two valid stops lie further apart: the device's and the
host's rho differ by at most 2.5e-10 relatively on the 160 small rows of tests/test_wor_device.py, 8e-8 on
64 rows of V = 49152 (``analysis/bench_wor_device.py``). The host's special cases are kept: disjoint laws
(rho = max(rho*_iid, E[T])), a valid rho*_iid (kept), fewer than k rejected tokens (:math:`E[N_\rho] = 1/\beta`
exactly).

**Cost.** ``ROOT_STEPS`` + 3 = 43 quadratures per row (the host's search: 5-13), each a top-L, ~20 passes
over V for the power sums and O(L G k^2) for the exact product, G ~ 350 nodes; figures beside the host's in
docs/torch_verifiers.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..race_quadrature import default_step, left_tail
from ..race_window import RUNG_TOLERANCE, TAU, series_table
from ..verifiers.kseq_without_replacement import ROOT_TOL, S0, TAIL
from . import _rho

GRID_LAMBDA_FLOOR = 1e-12
r"""The fixed grid runs to the host's :math:`s_1` of a row with decay rate :math:`\lambda` = this
(:math:`s_{end} \approx 7 \cdot 10^{13}`): 317 nodes at k = 2, 377 at k = 4."""

ROOT_STEPS = 40
"""Illinois steps of the root search, every row (rows that reached the host's stop do not move)."""

PUSH = 2.0
"""After a step that landed on the invalid side, the next step goes this many times the secant's step from it."""

BRACKET_TOL = 1e-13
"""A row also stops when its bracket in log rho is this narrow (the host's second stop)."""


class Trials(NamedTuple):
    """:math:`E[N_\\rho]` per row, float64 ``[batch]``: the value, its error estimate and the bound the
    validity test reads (``value + error``, or rho itself where every p <= rho q)."""

    value: torch.Tensor
    error: torch.Tensor
    upper: torch.Tensor


def exact_tokens(k: int) -> int:
    """L: the smallest count with :math:`P(\\mathrm{Bin}(L, 1 - e^{-\\tau}) \\le k - 1) \\le` RUNG_TOLERANCE."""
    b = -math.expm1(-TAU)
    n = k
    while sum(math.comb(n, i) * b**i * (1 - b) ** (n - i) for i in range(k)) > RUNG_TOLERANCE:
        n += 1
    return n


def grid_size(k: int) -> int:
    """Nodes of the fixed grid: the host's :func:`otm.race_quadrature.nodes` up to :data:`GRID_LAMBDA_FLOOR`'s s1."""
    h = default_step(k)
    y0 = math.log(S0)
    y1 = math.log((TAIL + math.log(1.0 / GRID_LAMBDA_FLOOR)) / GRID_LAMBDA_FLOOR)
    return max(2 * math.ceil((y1 - y0) / (2 * h)), 2) + 1


_CONSTANTS: dict[int, tuple[int, int, list]] = {}


def constants(k: int) -> tuple[int, int, list]:
    """``(L, G, series)`` for k drafts: :func:`exact_tokens`, :func:`grid_size` and the rows of
    :func:`otm.race_window.series_table` as lists (computed once per k)."""
    if k not in _CONSTANTS:
        _CONSTANTS[k] = (exact_tokens(k), grid_size(k), series_table(k).tolist())
    return _CONSTANTS[k]


def _truncated_product(poly: torch.Tensor) -> torch.Tensor:
    """Product over dim 2 of polynomials ``[k, batch, L, G]`` (coefficients of z^0..z^{k-1}), truncated to
    degree k - 1, by a tree of pairwise products: ``[k, batch, G]``."""
    k = poly.shape[0]
    while poly.shape[2] > 1:
        if poly.shape[2] % 2:
            one = torch.zeros_like(poly[:, :, :1])
            one[0] = 1.0
            poly = torch.cat([poly, one], dim=2)
        a, b = poly[:, :, 0::2], poly[:, :, 1::2]
        poly = torch.stack([sum(a[i] * b[m - i] for i in range(m + 1)) for m in range(k)])
    return poly[:, :, 0]


def expected_trials(p: torch.Tensor, q: torch.Tensor, k: int, rho: torch.Tensor) -> Trials:
    """:math:`E[N_\\rho]` of float64 normalised rows ``p, q [batch, V]`` at ``rho [batch]`` (may be inf: E[T])."""
    batch, V = p.shape
    dev = p.device
    f64 = torch.float64
    acc = torch.minimum(q, p / rho.unsqueeze(1))  # [batch, V]: host's np.minimum(draft, target / rho)
    c = q - acc  # rejected rates
    beta = acc.sum(-1)  # [batch]
    n_rejected = (c > 0).sum(-1)
    L_k, G, table = constants(k)
    L = min(L_k, V)
    top, idx = c.topk(min(L + 1, V), dim=-1)  # [batch, L (+1)], largest first
    low = c.scatter(1, idx[:, : k - 1], 0.0).sum(-1) if k > 1 else c.sum(-1)  # rejected rates outside the k-1 largest
    lam = beta + low
    h = default_step(k)
    y = math.log(S0) + h * torch.arange(G, dtype=f64, device=dev)  # [G]
    s = y.exp()
    # the L largest: exact truncated product at every node
    x = top[:, :L, None] * s  # [batch, L, G]
    poly = torch.zeros(k, batch, L, G, dtype=f64, device=dev)
    poly[0] = torch.exp(-x)
    if k > 1:
        poly[1] = -torch.expm1(-x)
    exact = _truncated_product(poly)  # [k, batch, G]: P(N_top = m)
    # the others: moment series where their largest x is at most TAU
    if V > L:
        rest = c.scatter(1, idx[:, :L], 0.0)  # [batch, V]
        series_ok = top[:, L, None] * s <= TAU  # [batch, G]
        C = torch.tensor(table, dtype=f64, device=dev)  # [k - 1, N]
        N = C.shape[1]
        sums = [rest.sum(-1)]  # sum c^n, n = 1..N-1
        pw = rest
        for _ in range(2, N):
            pw = pw * rest
            sums.append(pw.sum(-1))
        S = torch.stack(sums, dim=1)  # [batch, N - 1]
        n = torch.arange(1, N, dtype=f64, device=dev)
        power = torch.exp(n[:, None] * y + S.log().unsqueeze(2))  # [batch, N - 1, G]: sum x^n = s^n sum c^n
        power = torch.where(series_ok.unsqueeze(1), power, torch.zeros_like(power))
        a = [torch.ones(batch, G, dtype=f64, device=dev)]
        if k > 1:
            pr = torch.einsum("rn,bng->brg", C[:, 1:], power)  # [batch, k - 1, G]: sum (e^x - 1)^r
            for m in range(1, k):  # e_m of the odds by Newton's identities
                term = torch.zeros(batch, G, dtype=f64, device=dev)
                for r in range(1, m + 1):
                    term = term + (pr[:, r - 1] if r % 2 else -pr[:, r - 1]) * a[m - r]
                a.append(term / m)
        weight = torch.exp(-power[:, 0])  # e^{-sum x}
        below = torch.zeros(batch, G, dtype=f64, device=dev)
        for m in range(k):
            for i in range(m + 1):
                below = below + exact[i] * a[m - i]
        below = torch.where(series_ok, below * weight, torch.zeros_like(below))
    else:
        below = exact.sum(0)
    f = s * torch.exp(-beta.unsqueeze(1) * s) * below  # [batch, G]
    fine = h * f[:, 1:].sum(-1) + f[:, 0] * left_tail(h)
    coarse = 2 * h * f[:, 2::2].sum(-1) + f[:, 0] * left_tail(2 * h)
    cut = torch.exp(-lam * s[-1]) / lam  # the part past the grid's end (below e^-42 for lam >= the floor)
    error = (fine - coarse).abs() + cut
    few = n_rejected < k  # the test ends at its first acceptance: 1/beta exactly
    value = torch.where(few, 1.0 / beta, fine)
    error = torch.where(few, torch.zeros_like(error), error)
    upper = value + error
    capped = (p <= rho.unsqueeze(1) * q).all(-1)  # the exact bound E[N_rho] <= rho (host: bounded)
    value = torch.where(capped, torch.minimum(value, rho), value)
    upper = torch.where(capped, torch.minimum(upper, rho), upper)
    return Trials(value, error, upper)


class Root(NamedTuple):
    """The device set-up of a batch: ``rho``, ``trials`` (E[N_rho] at it) and K-SEQ's ``rho_iid``, ``[batch]``."""

    rho: torch.Tensor
    trials: torch.Tensor
    rho_iid: torch.Tensor
    converged: torch.Tensor  # bool: the row reached the host's stop within the steps (else a valid, looser rho)


def _g(p, q, k, x):
    """The host's test at rho = e^x: ``(g, value)``, g > 0 where not valid, <= 0 where valid."""
    rho = x.exp()
    t = expected_trials(p, q, k, rho)
    out = torch.log((t.value + t.error) / rho)
    return torch.where(t.upper <= rho, out.clamp(max=0.0), out.clamp(min=1e-300)), t


def root(p: torch.Tensor, q: torch.Tensor, k: int, steps: int | None = None) -> Root:
    """rho with E[N_rho] = rho (valid side, host's tolerance) for float64 normalised ``p, q [batch, V]``."""
    steps = ROOT_STEPS if steps is None else steps
    lo = _rho.search(p, q, k).rho  # [batch]
    a = lo.log()
    fa, ta = _g(p, q, k, a)
    at_lo = fa <= 0  # rho*_iid is valid: kept
    top = expected_trials(p, q, k, torch.full_like(lo, math.inf))  # E[T]
    b = torch.log(top.value + top.error) + 1e-9
    # where every p <= rho q, beta = 1/rho and E[N_rho] <= 1/beta: all of [rho_0, inf) is valid, rho_0 = max p/q
    ratio = torch.where(q > 0, p / q, torch.where(p > 0, math.inf, 0.0)).amax(-1)
    b = torch.maximum(torch.minimum(b, ratio.log()), a)
    fb, tb = _g(p, q, k, b)
    fb = fb.clamp(max=-1e-300)  # E[N_rho] <= E[T] < e^b: valid in exact arithmetic
    gb, vb = fb, tb.value
    side = torch.zeros_like(lo)
    w1 = w2 = torch.full_like(lo, math.inf)  # the bracket's width one and two steps ago
    for _ in range(steps):
        done = (-gb <= ROOT_TOL) | (b - a <= BRACKET_TOL)
        x = b - fb * (b - a) / (fb - fa)
        # after an invalid point, overshoot: the invalid end converges on the root from below, the valid end
        # (the result) would follow by bisection only; twice the secant's step from a lands just past the root
        x = torch.where(side == 1, a + PUSH * (x - a), x)
        secant = (a < x) & (x < b) & (b - a <= 0.5 * w2)  # else bisect: the width halves every 3 steps at least
        x = torch.where(secant, x, 0.5 * (a + b))
        w2, w1 = w1, b - a
        fx, tx = _g(p, q, k, x)
        invalid = ~done & (fx > 0)
        valid = ~done & (fx <= 0)
        fb = torch.where(invalid & (side == 1), 0.5 * fb, fb)
        fa = torch.where(valid & (side == -1), 0.5 * fa, fa)
        a, fa = torch.where(invalid, x, a), torch.where(invalid, fx, fa)
        b, fb, gb, vb = (torch.where(valid, x, b), torch.where(valid, fx, fb), torch.where(valid, fx, gb),
                         torch.where(valid, tx.value, vb))
        side = torch.where(invalid, torch.ones_like(side), torch.where(valid, -torch.ones_like(side), side))
    converged = at_lo | (-gb <= ROOT_TOL) | (b - a <= BRACKET_TOL)
    disjoint = torch.minimum(p, q).sum(-1) == 0
    rho = torch.where(disjoint, torch.maximum(lo, ta.upper), torch.where(at_lo, lo, b.exp()))
    trials = torch.where(disjoint | at_lo, ta.value, vb)
    return Root(rho, trials, lo, converged | disjoint)
