r"""K-SEQ's division factor rho* for a batch of rows, exactly, without sorting V.

:math:`\rho^*` is the smallest :math:`\rho \in [1, k]` with :math:`g(\rho) \le 0`,

.. math::

    g(\rho) = 1 - (1 - \beta(\rho))^k - \rho\,\beta(\rho), \qquad
    \beta(\rho) = \sum_x \min\!\left(q(x), \frac{p(x)}{\rho}\right).

**Search.** ``g`` is non-increasing; between consecutive breakpoints
:math:`p(x)/q(x)` it is a smooth closed form. The numpy twin
(:func:`otm.verifiers.kseq.rho_star`) sorts the breakpoints, locates the
bracketing segment and runs Brent's method on that segment's closed form.
Sorting 49152 floats costs ~4 ms on a CPU, so here Brent's method (the
algorithm of scipy's ``brentq``, same tolerances ``xtol = 1e-15``,
``rtol = 4 eps``) runs directly on ``g`` over ``[1, k]``, all rows at once. Each
evaluation of ``g`` is one float64 pass over V (a multiply, a minimum or
positive part, a sum: no sort). Brent needs no smoothness, only a sign change;
on LLM-like and random rows of V = 49152 it converges in 6 to 9 evaluations,
falling back to bisection where interpolation stalls (kinks, flat sides).

**Evaluation without cancellation.** Two forms of ``g`` are used:

* :math:`g = p_{acc}(\beta) - \rho\beta` with :math:`p_{acc}(\beta) = -\mathrm{expm1}(k\,
  \mathrm{log1p}(-\beta))`, exact to relative precision when :math:`\beta` is small
  (disjoint or nearly disjoint laws);
* with :math:`S(\rho) = \sum_x (p(x)/\rho - q(x))_+` and :math:`\sum p = \sum q = 1`:
  :math:`g = \rho S - (1 - 1/\rho + S)^k`, exact to relative precision when
  :math:`\beta \approx 1` (identical or nearly identical laws, near point masses).

A row is searched on the first form when :math:`\beta(1) = \sum \min(p, q)` is
below :data:`BETA_FORM_BELOW`, else on the second. (The first form alone subtracts numbers
close to 1 where :math:`\beta \approx 1`, and where ``g`` is also flat that noise decides the
sign; the numpy twin, which searches each bracketing segment's closed form, now returns the same
float on the rows the tests measure against exact rational arithmetic.) Rows with :math:`\beta(1) = 0` (disjoint) get 1, as numpy's
:math:`g(1) = 0` gives.

**Result.** The end of Brent's final bracket where ``g <= 0`` was evaluated
(within ``xtol + rtol rho`` of the root), rounded up by the numpy module's
relative ``SAFETY`` (1e-14) and capped at k; 1 where ``g(1) <= 0``; k where
``g(k) > 0`` (rounding only), as in numpy. A converged row evaluates its point
again (same value), so the result does not depend on when convergence is
checked.

**Cost.** The per-row logic is some sixty operations on ``[batch]`` values per
step. They run as Python floats for a single row on the CPU (~40 ns an
operation), as numpy arrays for several rows on the CPU (~0.5 us; a torch call
costs ~1.5 us) with convergence checked after every step (no device to
synchronise), and as torch tensors on other devices with convergence checked
(one sync) every :data:`RHO_SYNC_EVERY` steps.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import numpy as np
import torch

from ..verifiers.kseq import SAFETY

RHO_XTOL = 1e-15
RHO_RTOL = 4 * float(np.finfo(np.float64).eps)
"""Brent's tolerances, those of the numpy brentq call."""
RHO_MAX_ITERATIONS = 100
"""Cap on Brent's steps (typically 5 to 9 are needed)."""
RHO_SYNC_EVERY = 4
"""Off the CPU, with ``SYNC_FREE`` off, convergence is checked (a device sync) every this many steps."""
SYNC_FREE = True
"""Off the CPU, run :data:`RHO_DEVICE_STEPS` steps and never read a value back (no device sync: the
search can be captured in a CUDA graph or compiled with ``fullgraph=True``)."""
RHO_DEVICE_STEPS = 64
"""Steps of the sync-free search: bisection alone shrinks [1, k <= 8] below the tolerance in 53, Brent's
interpolation in 6-9 on LLM-like rows; a converged row re-evaluates its point, and a row the cap stops
early still returns a valid rho (the smallest point with g <= 0 it evaluated)."""
FORCE_DEVICE_PATH = False
"""Tests only: run the device path (``_Torch``, sync-free when :data:`SYNC_FREE`) on the CPU too."""
DROP_FRACTION = 0.25
"""On the CPU, rows that ``search``'s ``stop`` reports done are dropped once they are at least this
fraction of the rows searched (each drop copies the remaining rows of ``p, q``)."""
BETA_FORM_BELOW = 0.5
r"""Rows with :math:`\beta(1)` below this are searched on :math:`p_{acc}(\beta) - \rho\beta`, the others on the excess form."""


class Rho(NamedTuple):
    """A division factor and what K-SEQ needs at it, float64 ``[batch]`` each."""

    rho: torch.Tensor
    beta: torch.Tensor  # beta(rho)
    coef: torch.Tensor  # c = p_acc(beta) / beta (0 where beta = 0): the residual is (p - min(p/rho, q) c)_+
    eps: torch.Tensor  # 1 - c / rho = -g(rho) / (rho beta), clipped to [0, 1] (1 where beta = 0)


def p_acc(beta: torch.Tensor, k: int) -> torch.Tensor:
    """``1 - (1 - beta)^k`` without cancellation for small beta (1 for beta >= 1)."""
    return -torch.expm1(k * torch.log1p(-beta.clamp(0.0, 1.0)))


class Sums:
    r"""Per-row sums over V of float64 ``p, q [batch, V]``, one pass each over reused buffers.

    :math:`\beta(\rho) = \sum \min(q, p/\rho)` (multiply by ``1/rho``, minimum, sum)
    and :math:`S(\rho) = \sum (p/\rho - q)_+ = \frac{1}{\rho} \sum (p - \rho q)_+`
    (fused multiply-add, positive part, sum). ``rho`` is a float64 ``[batch]``
    tensor, or a float when ``batch == 1``. Rounding differs from numpy's
    ``p / rho`` by at most one rounding per term.
    """

    def __init__(self, p: torch.Tensor, q: torch.Tensor):
        self.p, self.q = p, q
        self.buf = torch.empty_like(p)  # [batch, V]
        self._buf2 = None

    def beta(self, rho) -> torch.Tensor:
        inv = 1.0 / rho if isinstance(rho, float) else rho.reciprocal().unsqueeze(1)  # float or [batch, 1]
        torch.mul(self.p, inv, out=self.buf)  # [batch, V]: p / rho
        return torch.minimum(self.buf, self.q, out=self.buf).sum(-1)  # [batch]

    def excess(self, rho) -> torch.Tensor:
        if isinstance(rho, float):
            torch.add(self.p, self.q, alpha=-rho, out=self.buf)  # [batch, V]: p - rho q
        else:
            torch.addcmul(self.p, self.q, rho.unsqueeze(1), value=-1.0, out=self.buf)
        return self.buf.clamp_min_(0.0).sum(-1) / rho  # [batch]

    def both(self, rho=None):
        """``(beta, S)``; ``(p/rho - q)_+ = p/rho - min(p/rho, q)`` exactly. ``rho = 1`` when None."""
        if rho is None:
            w = self.p  # [batch, V]
        else:
            if self._buf2 is None:
                self._buf2 = torch.empty_like(self.p)
            w = torch.mul(self.p, rho.reciprocal().unsqueeze(1), out=self._buf2)  # [batch, V]: p / rho
        torch.minimum(w, self.q, out=self.buf)
        beta = self.buf.sum(-1)  # [batch]
        return beta, torch.sub(w, self.buf, out=self.buf).sum(-1)  # [batch], [batch]


# -- where the per-row state lives ------------------------------------------------------
# The search is written once against three backends: Python floats (one row on the CPU),
# numpy arrays (several rows on the CPU; CPU tensors share memory with them) and torch
# tensors (other devices). All compute in IEEE float64.


class _Scalar:
    """One row on the CPU: Python floats (~40 ns an operation)."""

    sync_every = 1
    minimum, maximum, abs = staticmethod(min), staticmethod(max), staticmethod(abs)

    @staticmethod
    def where(cond, x, y):
        return x if cond else y

    @staticmethod
    def div(x, y):
        return x / y if y != 0 else math.nan  # nan only in branches that the where's discard

    @staticmethod
    def all(x):
        return bool(x)

    @staticmethod
    def p_acc(b, k):
        return 1.0 if b >= 1.0 else -math.expm1(k * math.log1p(-b))

    def full(self, value):
        return float(value)

    def call(self, f, x):
        return f(x).item()

    def host(self, t):
        return t.item()

    def tensor(self, x, device):
        return torch.tensor([x], dtype=torch.float64, device=device)

    def tensors(self, values, device):
        return tuple(torch.tensor(values, dtype=torch.float64, device=device).unsqueeze(1))


class _Numpy:
    """Several rows on the CPU: numpy float64 arrays (~0.5 us an operation)."""

    sync_every = 1
    where, minimum, maximum, abs = (staticmethod(f) for f in (np.where, np.minimum, np.maximum, np.abs))

    def __init__(self, batch):
        self.batch = batch

    @staticmethod
    def div(x, y):
        return x / y

    @staticmethod
    def all(x):
        return bool(x.all())

    @staticmethod
    def p_acc(b, k):
        return -np.expm1(k * np.log1p(-np.minimum(b, 1.0)))

    def full(self, value):
        return np.full(self.batch, value, dtype=np.float64)

    def call(self, f, x):
        return f(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    def host(self, t):
        return t.numpy()

    def tensor(self, x, device):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))

    def tensors(self, values, device):
        return tuple(torch.from_numpy(np.stack([np.broadcast_to(v, (self.batch,)) for v in values])))


class _Torch:
    """Rows on another device: torch tensors, no synchronisation but every RHO_SYNC_EVERY steps."""

    sync_every = RHO_SYNC_EVERY
    where, abs = staticmethod(torch.where), staticmethod(torch.abs)
    p_acc = staticmethod(p_acc)

    @staticmethod
    def minimum(x, y):
        return torch.minimum(x, y) if isinstance(y, torch.Tensor) else torch.clamp(x, max=y)

    @staticmethod
    def maximum(x, y):
        return torch.maximum(x, y) if isinstance(y, torch.Tensor) else torch.clamp(x, min=y)

    def __init__(self, batch, device):
        self.batch, self.device = batch, device
        self.sync_every = None if SYNC_FREE else RHO_SYNC_EVERY  # None: never

    @staticmethod
    def div(x, y):
        return x / y

    @staticmethod
    def all(x):
        return bool(x.all())

    def full(self, value):
        return torch.full((self.batch,), value, dtype=torch.float64, device=self.device)

    def call(self, f, x):
        return f(x)

    def host(self, t):
        return t

    def tensor(self, x, device):
        return x

    def tensors(self, values, device):
        return tuple(torch.as_tensor(v, dtype=torch.float64, device=device).expand(self.batch) for v in values)


def _quiet(xp):
    """numpy's warnings off for the discarded branches of ``where`` (torch has none to silence, and
    ``np.errstate`` would break a ``torch.compile`` graph)."""
    return contextlib.nullcontext() if isinstance(xp, _Torch) else np.errstate(divide="ignore", invalid="ignore",
                                                                                over="ignore")


def on_host(device) -> bool:
    """Whether the host paths run (the CPU, where reading a value back costs nothing)."""
    return device.type == "cpu" and not FORCE_DEVICE_PATH


def _backend(p: torch.Tensor):
    batch = p.shape[0]
    if not on_host(p.device):
        return _Torch(batch, p.device)
    return _Scalar() if batch == 1 else _Numpy(batch)


def _forms(xp, k):
    """The two forms of g from the sums at x (see the module docstring)."""

    def from_beta(x, b):
        return xp.p_acc(b, k) - x * b

    def from_excess(x, s):
        return x * s - xp.maximum(1.0 - 1.0 / x + s, 0.0) ** k

    return from_beta, from_excess


def _finish(xp, sums: Sums, rho, k: int, mode: str, device, small=None) -> Rho:
    """:class:`Rho` at ``rho`` (a host value of the backend): one more pass over V.

    The deficit -g(rho) is evaluated in the form the row was searched on (``small``:
    the beta form; default: by beta(rho)), so its sign agrees with the search's.
    """
    from_beta, from_excess = _forms(xp, k)
    if mode == "beta":  # the other sum from beta + S = 1/rho: absolute error ~1e-16, harmless in that regime
        beta = xp.call(sums.beta, rho)
        s = xp.maximum(1.0 / rho - beta, 0.0)
    elif mode == "excess":
        s = xp.call(sums.excess, rho)
        beta = xp.minimum(xp.maximum(1.0 / rho - s, 0.0), 1.0)
    else:
        beta, s = (xp.host(t) for t in sums.both(xp.tensor(rho, device)))
    if small is None:
        small = beta < BETA_FORM_BELOW
    with _quiet(xp):
        deficit = xp.where(small, -from_beta(rho, beta), -from_excess(rho, s))  # -g(rho)
        positive = beta > 0
        coef = xp.where(positive, xp.div(xp.p_acc(beta, k), beta), 0.0)
        eps = xp.where(positive, xp.minimum(xp.maximum(xp.div(deficit, rho * beta), 0.0), 1.0), 1.0)
    return Rho(*xp.tensors([rho, beta, coef, eps], device))


def at(p: torch.Tensor, q: torch.Tensor, k: int, rho: torch.Tensor) -> Rho:
    """:class:`Rho` at a given ``rho [batch]`` (any value; valid when ``rho >= rho*``)."""
    xp = _backend(p)
    host = xp.host(rho) if not isinstance(xp, _Scalar) else float(rho.item())
    return _finish(xp, Sums(p, q), host, k, "both", p.device)


def search(p: torch.Tensor, q: torch.Tensor, k: int, max_iterations: int = RHO_MAX_ITERATIONS, stop=None) -> Rho | None:
    """rho* of float64 normalised rows ``p, q [batch, V]`` (see the module docstring).

    ``stop(lo, hi)``, optional (CPU only: it synchronises), is shown before every
    step a bracket of the rho this search would return, per row still searched (floats or
    numpy arrays): ``lo <= rho <= hi``. It returns which of these rows need no more search
    (a bool, or a bool array over the rows shown). When every row is done the search ends
    and returns None (K-SEQ stops once every row's first acceptance is settled). When at
    least :data:`DROP_FRACTION` of the rows are done (several rows on the CPU), they are
    dropped: the search goes on over the others' rows of ``p, q`` only, calls
    ``stop.keep(mask)`` with the rows kept (a bool array over the rows last shown), and
    returns :class:`Rho` of the rows it kept, in order. Every other row's steps are the ones
    it takes in the full batch (each row's search is its own; a converged row re-evaluates
    its point), so its result is the same.
    """
    batch, device = p.shape[0], p.device
    xp = _backend(p)
    sums = Sums(p, q)
    if k == 1:
        return _finish(xp, sums, xp.full(1.0), k, "both", device)
    beta1, s1 = (xp.host(t) for t in sums.both())  # at rho = 1
    small = beta1 < BETA_FORM_BELOW  # search these rows on the beta form
    if isinstance(xp, _Torch):
        mode = "both"  # no synchronisation to learn the rows' forms: both sums every step
    else:
        n_small = int(np.sum(small))
        mode = "beta" if n_small == batch else "excess" if n_small == 0 else "both"
    from_beta, from_excess = _forms(xp, k)

    def g(x):
        if mode == "beta":
            return from_beta(x, xp.call(sums.beta, x))
        if mode == "excess":
            return from_excess(x, xp.call(sums.excess, x))
        b, s = (xp.host(t) for t in sums.both(xp.tensor(x, device)))
        return xp.where(small, from_beta(x, b), from_excess(x, s))

    with _quiet(xp):  # discarded branches may hold nan
        # Brent's method as scipy's brentq (zeros/brentq.c), one step for all rows at a time
        xpre, xcur = xp.full(1.0), xp.full(float(k))
        fpre = xp.where(small, from_beta(xpre, beta1), s1 - s1**k)  # g(1); the excess form: 1 - 1/1 = 0
        fcur = g(xcur)
        at_one, at_top = (beta1 <= 0) | (fpre <= 0), fcur > 0  # rho = 1 (disjoint: g = 0) / rho = k
        fixed = at_one | at_top
        xblk, fblk, spre, scur = xpre, fpre, xcur - xpre, xcur - xpre
        steps = max_iterations if xp.sync_every is not None else min(max_iterations, RHO_DEVICE_STEPS)
        for step in range(steps):
            flip = (fpre != 0) & (fcur != 0) & ((fpre < 0) != (fcur < 0))  # xpre is the new contrapoint
            xblk, fblk = xp.where(flip, xpre, xblk), xp.where(flip, fpre, fblk)
            spre, scur = xp.where(flip, xcur - xpre, spre), xp.where(flip, xcur - xpre, scur)
            swap = xp.abs(fblk) < xp.abs(fcur)  # keep the better end in xcur
            xpre, xcur, xblk = xp.where(swap, xcur, xpre), xp.where(swap, xblk, xcur), xp.where(swap, xcur, xblk)
            fpre, fcur, fblk = xp.where(swap, fcur, fpre), xp.where(swap, fblk, fcur), xp.where(swap, fcur, fblk)
            delta = 0.5 * (RHO_XTOL + RHO_RTOL * xp.abs(xcur))
            sbis = 0.5 * (xblk - xcur)
            converged = fixed | (fcur == 0) | (xp.abs(sbis) < delta)
            if xp.sync_every is not None and step % xp.sync_every == 0 and xp.all(converged):
                break
            if stop is not None:
                # the root lies between the end with g > 0 and the end with g <= 0; the result will be
                # the smallest point with g <= 0 seen, times (1 + SAFETY), capped at k. Where g(xcur) = 0
                # the row has converged on xcur and both ends may have g <= 0: the result lies between
                # the smallest of the points held and xcur (1 + SAFETY)
                lo = xp.where(fcur > 0, xcur, xp.where(fcur == 0, xp.minimum(xcur, xp.minimum(xpre, xblk)), xblk))
                hi = xp.minimum(xp.where(fcur > 0, xblk, xcur) * (1.0 + SAFETY), float(k))
                fixed_rho = xp.where(at_one, 1.0, float(k))
                done = stop(xp.where(fixed, fixed_rho, lo), xp.where(fixed, fixed_rho, hi))
                if xp.all(done):
                    return None
                if isinstance(xp, _Numpy) and np.count_nonzero(done) >= DROP_FRACTION * done.size:
                    keep = ~done  # drop the rows that are done: the others' state, sums and rows of p, q
                    stop.keep(keep)
                    (xpre, xcur, xblk, fpre, fcur, fblk, spre, scur, fixed, at_one, at_top, small, converged) = (
                        a[keep] for a in (xpre, xcur, xblk, fpre, fcur, fblk, spre, scur, fixed, at_one, at_top, small, converged))
                    rows = torch.from_numpy(np.flatnonzero(keep))
                    sums = Sums(sums.p.index_select(0, rows), sums.q.index_select(0, rows))
                    xp = _Numpy(int(keep.sum()))
                    delta, sbis = delta[keep], sbis[keep]
            secant = xp.div(-fcur * (xcur - xpre), fcur - fpre)
            dpre, dblk = xp.div(fpre - fcur, xpre - xcur), xp.div(fblk - fcur, xblk - xcur)
            inverse_quadratic = xp.div(-fcur * (fblk * dblk - fpre * dpre), dblk * dpre * (fblk - fpre))
            stry = xp.where(xpre == xblk, secant, inverse_quadratic)
            good = (xp.abs(spre) > delta) & (xp.abs(fcur) < xp.abs(fpre))
            good = good & (2.0 * xp.abs(stry) < xp.minimum(xp.abs(spre), 3.0 * xp.abs(sbis) - delta))
            spre, scur = xp.where(good, scur, sbis), xp.where(good, stry, sbis)  # else bisect
            xpre, fpre = xcur, fcur
            move = xp.where(xp.abs(scur) > delta, scur, xp.where(sbis > 0, delta, -delta))
            xcur = xp.where(converged, xcur, xcur + move)  # converged rows evaluate xcur again: no change
            fcur = g(xcur)
        # the smallest point where g <= 0 was evaluated: an end of the final bracket once converged, and
        # valid (if not yet tight) when the step cap stops the search first
        top = float(k)
        valid = xp.minimum(xp.where(fcur <= 0, xcur, top), xp.where(fpre <= 0, xpre, top))
        valid = xp.minimum(valid, xp.where(fblk <= 0, xblk, top))
        rho = xp.where(at_one, 1.0, xp.where(at_top, float(k), xp.minimum(valid * (1.0 + SAFETY), float(k))))
    return _finish(xp, sums, rho, k, mode, device, small)
