r"""The exact OTM optimum by linear programming, and its transport plan.

The OTM problem (SpecTr, Sun et al. 2023) asks for the coupling of the draft
scheme's law :math:`P` (over draft tuples :math:`\bar x`) and the target law
:math:`p` that maximises the *membership acceptance*
:math:`P(Y \in \mathrm{set}(\bar X))`. The membership cost only sees the set of
distinct tokens of a tuple, so the LP may be written over the rows of
:meth:`otm.schemes.Scheme.rows`: *sets* (``fold=True``) or ordered tuples
(``fold=False``); both have the same optimum.

We solve the relaxed form of Hu et al. (ICLR 2025; docs/theory.md section 1): only the
variables :math:`\pi_{r,y}` with :math:`y \in r` are kept and the marginal
equalities become inequalities (unmatched mass can always be coupled outside
the sets, at cost 1). The constraint matrix is the incidence matrix of a
bipartite graph (every variable sits in exactly one row constraint and one token
constraint), which :func:`solve_lp` hands to HiGHS directly in CSC form
(``backend="highs"``, the fast path), through cvxpy (``backend="cvxpy"``, the
general formulation), or, as a sparse min-cost flow with one dummy row and one
dummy token, to POT's network simplex (``backend="pot"``, fastest, optional).

The inequality form is also the numerically safe one: HiGHS presolve was seen
to report a false "Infeasible" on the equality form when a mass is below about
1e-7; the inequality form is always feasible (:math:`\pi = 0`) and bounded, and
the tests solve it with masses down to 1e-12 and exact zeros.

The solution is turned into a :class:`TransportPlan`, repaired to exact feasibility and
completed into a full coupling whose output law is exactly the target; the
LP-optimal verifier (:mod:`otm.verifiers.lp_optimal`) samples from it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .laws import OtmError
from .schemes import IID, MAX_ENUMERATION, Greedy, Rows, Scheme, SpecHub, Table, WithoutReplacement, check_target

BACKENDS = ("cvxpy", "highs", "pot")

MAX_VARIABLES = 2_000_000
"""Default largest LP (number of variables :math:`\\pi_{r,y}`) :func:`solve_lp` builds."""

FEASIBILITY_TOLERANCE = 1e-10
"""HiGHS primal and dual feasibility tolerance (its default is 1e-7, too loose for tiny masses)."""

HIGHS_OPTIONS = {
    "primal_feasibility_tolerance": FEASIBILITY_TOLERANCE,
    "dual_feasibility_tolerance": FEASIBILITY_TOLERANCE,
}
"""Options given to HiGHS by both backends (cvxpy forwards them with ``setOptionValue``)."""

FAST_PATH_OPTIONS = {"presolve": "off"}
"""Extra HiGHS options of the ``"highs"`` backend. Presolve finds little to remove in this LP
(no zero rows unless a mass is 0) and costs about a third of the solve time at V=16..48,
k=3..4; it is also the part of HiGHS that misjudged tiny masses. The call is retried with
presolve on if the first solve is not optimal."""

MAX_DENSE = 20_000_000
"""Largest ``n_rows * V`` :meth:`TransportPlan.coupling` builds as a dense matrix."""


# ---------------------------------------------------------------------------------------------
# rows: the draft law in compressed form
# ---------------------------------------------------------------------------------------------


def rows_from_tuples_unfolded(tuples: np.ndarray, probs: np.ndarray) -> Rows:
    """One row per ordered tuple holding its sorted distinct tokens (vectorised).

    Same result as ``otm.schemes.rows_from_tuples(tuples, probs, fold=False)``
    without the Python loop over tuples.

    >>> r = rows_from_tuples_unfolded(np.array([[2, 0, 2], [1, 1, 1]]), np.array([0.25, 0.75]))
    >>> r.ptr.tolist(), r.tokens.tolist()
    ([0, 2, 3], [0, 2, 1])
    """
    t = np.sort(np.asarray(tuples, dtype=np.int64), axis=1)
    keep = np.ones(t.shape, dtype=bool)
    keep[:, 1:] = t[:, 1:] != t[:, :-1]
    ptr = np.zeros(t.shape[0] + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    return Rows(ptr, t[keep], np.asarray(probs, dtype=np.float64))


def _row_ids(rows: Rows) -> np.ndarray:
    """Row index of every entry of ``rows.tokens``."""
    return np.repeat(np.arange(rows.n, dtype=np.int64), np.diff(rows.ptr))


def _set_keys(rows: Rows) -> np.ndarray:
    """``[n, width]`` matrix: row r's sorted tokens, padded with -1 (a hashable set key per row)."""
    lengths = np.diff(rows.ptr)
    width = int(lengths.max()) if rows.n else 0
    keys = np.full((rows.n, width), -1, dtype=np.int64)
    rid = _row_ids(rows)
    keys[rid, np.arange(rows.tokens.size) - rows.ptr[rid]] = rows.tokens
    return keys


def _fold_entries(rows: Rows, values: np.ndarray) -> tuple[Rows, np.ndarray]:
    """Merge rows with equal token sets: masses add up and so do the ``values`` per (set, token)."""
    keys = _set_keys(rows)
    uniq, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    lengths = (uniq >= 0).sum(axis=1)
    ptr = np.zeros(uniq.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    tokens = uniq[uniq >= 0]  # row-major: each set's tokens in order
    rid = _row_ids(rows)
    pos = ptr[group[rid]] + (np.arange(rows.tokens.size) - rows.ptr[rid])
    folded_values = np.bincount(pos, weights=values, minlength=tokens.size)
    mass = np.bincount(group, weights=rows.mass, minlength=uniq.shape[0])
    return Rows(ptr, tokens, mass), folded_values


def count_variables(scheme: Scheme, fold: bool = True) -> int | None:
    """Exact number of LP variables :math:`\\pi_{r,y}` (pairs row, member), computed without building rows.

    Returns ``None`` for a scheme class it does not know.

    >>> from otm.schemes import IID
    >>> count_variables(IID([0.25] * 4, 2), fold=True), count_variables(IID([0.25] * 4, 2), fold=False)
    (16, 28)
    """
    k = scheme.k
    if isinstance(scheme, IID):
        s = int(scheme.support.size)
        if fold:
            return sum(math.comb(s, m) * m for m in range(1, min(k, s) + 1))
        return s * (s**k - (s - 1) ** k)  # token y is a member of s^k - (s-1)^k tuples
    if isinstance(scheme, (WithoutReplacement, Greedy, SpecHub)):
        # every tuple has k distinct tokens
        return (scheme.n_sets() if fold else scheme.n_tuples()) * k
    if isinstance(scheme, Table):
        t = np.sort(scheme.tuples, axis=1)
        distinct = 1 + (t[:, 1:] != t[:, :-1]).sum(axis=1)
        if not fold:
            return int(distinct.sum())
        keys = np.where(np.concatenate([np.ones((t.shape[0], 1), bool), t[:, 1:] != t[:, :-1]], axis=1), t, -1)
        keys.sort(axis=1)
        uniq = np.unique(keys, axis=0)
        return int((uniq >= 0).sum())
    return None


def _too_large(scheme: Scheme, fold: bool, n: int, limit: int, at_least: bool = False) -> OtmError:
    form = "folded" if fold else "unfolded"
    return OtmError(
        f"the OTM LP for {scheme.name} V={scheme.V} k={scheme.k} ({form}) would have "
        f"{'at least ' if at_least else ''}{n:,} variables, more than max_variables={limit:,}: "
        "use the closed form (otm.optimum) or a smaller V/k"
    )


def _build_rows(scheme: Scheme, fold: bool, max_variables: int) -> Rows:
    """The scheme's rows, after refusing (before building anything) an LP over ``max_variables``."""
    n_rows = scheme.n_sets() if fold else scheme.n_tuples()
    n_vars = count_variables(scheme, fold)
    if n_vars is not None and n_vars > max_variables:
        raise _too_large(scheme, fold, n_vars, max_variables)
    if n_vars is None and n_rows > max_variables:  # every row has at least one member
        raise _too_large(scheme, fold, n_rows, max_variables, at_least=True)
    limit = max(MAX_ENUMERATION, max_variables)
    if fold:
        rows = scheme.rows(fold=True, limit=limit)
    else:
        rows = rows_from_tuples_unfolded(*scheme.enumerate(limit))
    if rows.tokens.size > max_variables:
        raise _too_large(scheme, fold, int(rows.tokens.size), max_variables)
    return rows


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------


@dataclass
class TransportPlan:
    r"""A feasible OTM transport plan, repaired and completed into an exact coupling.

    ``pi[j]`` is the mass moved from row ``r`` (the row holding entry ``j``) to
    token ``rows.tokens[j]`` (a member of the row): a *hit*. Build it with
    :meth:`from_solution`, which repairs a solver's answer to exact feasibility:
    negatives are clipped to 0, each row is scaled down to at most ``mass[r]``,
    then each token column to at most ``target[y]``, then every entry whose row and token both
    have mass left gets the smaller of the two (the plan stays feasible; acceptance only rises).

    The *completion* couples the leftover row masses
    :math:`l_r = m_r - \sum_y \pi_{r,y}` independently with the leftover target
    :math:`c_y = p_y - \sum_r \pi_{r,y}` (both sum to :math:`1 - \alpha`):

    .. math::
        \Pi(y \mid r) = \frac{\pi_{r,y}}{m_r} + \frac{l_r}{m_r} \frac{c_y}{\sum_z c_z}

    so the draft marginal is the scheme's law and the output marginal is exactly
    the target, whatever the solver's tolerances.

    Attributes
    ----------
    rows : Rows
        The rows (sets, or tuples' sets when not ``folded``) with their masses :math:`m_r`.
    pi : ndarray, shape (nnz,)
        Hit masses aligned with ``rows.tokens``.
    target : ndarray, shape (V,)
    folded : bool
        Whether the rows are distinct sets (``scheme.rows(fold=True)``).
    """

    rows: Rows
    pi: np.ndarray
    target: np.ndarray
    folded: bool = True
    _index: dict | None = field(default=None, repr=False)
    _folded_plan: TransportPlan | None = field(default=None, repr=False)

    @classmethod
    def from_solution(cls, rows: Rows, x, target: np.ndarray, folded: bool = True) -> TransportPlan:
        """Repair a solver's (possibly slightly infeasible) solution ``x`` into a feasible plan."""
        pi = np.maximum(np.asarray(x, dtype=np.float64), 0.0)
        rid = _row_ids(rows)
        row_sum = np.bincount(rid, weights=pi, minlength=rows.n)
        over = row_sum > rows.mass
        if over.any():
            scale = np.ones(rows.n)
            scale[over] = rows.mass[over] / row_sum[over]
            pi *= scale[rid]
        col_sum = np.bincount(rows.tokens, weights=pi, minlength=target.size)
        over = col_sum > target
        if over.any():
            scale = np.ones(target.size)
            scale[over] = target[over] / col_sum[over]
            pi *= scale[rows.tokens]
        # top-up: the scaling (and the solver's tolerance) may leave an entry whose row and token
        # both have mass left; moving min(row left, token left) onto it keeps the plan feasible and
        # only raises the acceptance. At an optimum no such entry exists but for rounding, so the
        # loop visits a handful of entries.
        row_left = np.maximum(rows.mass - np.bincount(rid, weights=pi, minlength=rows.n), 0.0)
        col_left = np.maximum(target - np.bincount(rows.tokens, weights=pi, minlength=target.size), 0.0)
        for j in np.flatnonzero((row_left[rid] > 0) & (col_left[rows.tokens] > 0)):
            r, y = rid[j], rows.tokens[j]
            t = min(row_left[r], col_left[y])
            if t > 0:
                pi[j] += t
                row_left[r] -= t
                col_left[y] -= t
        return cls(rows, pi, target, folded)

    # -- marginals ----------------------------------------------------------------------------
    @property
    def V(self) -> int:
        return int(self.target.size)

    @property
    def acceptance(self) -> float:
        r"""Membership acceptance of the plan, :math:`\sum \pi` (a true lower bound on the optimum)."""
        return float(self.pi.sum())

    def hit_row_sums(self) -> np.ndarray:
        """:math:`\\sum_y \\pi_{r,y}` per row, shape (n_rows,)."""
        return np.bincount(_row_ids(self.rows), weights=self.pi, minlength=self.rows.n)

    def hit_col_sums(self) -> np.ndarray:
        """:math:`\\sum_r \\pi_{r,y}` per token, shape (V,)."""
        return np.bincount(self.rows.tokens, weights=self.pi, minlength=self.V)

    def row_leftover(self) -> np.ndarray:
        """:math:`l_r = m_r - \\sum_y \\pi_{r,y} \\ge 0`, shape (n_rows,)."""
        return np.maximum(self.rows.mass - self.hit_row_sums(), 0.0)

    def target_leftover(self) -> np.ndarray:
        """:math:`c_y = p_y - \\sum_r \\pi_{r,y} \\ge 0`, shape (V,)."""
        return np.maximum(self.target - self.hit_col_sums(), 0.0)

    def _completion(self):
        """Per-row completion: leftover target law, completion mass per row, completed row sums.

        The completed row r holds its hits plus ``l_r * c / sum(c)``; its sum ``s_r``
        equals ``m_r`` up to rounding. Rows are divided by ``s_r`` (not ``m_r``), so every
        conditional law sums to 1 even when rounding leaves ``l_r ~ 1e-16`` but no
        leftover target (``sum(c) == 0``). A row with ``s_r == 0`` (mass 0) gets the target.
        """
        c = self.target_leftover()
        total = float(c.sum())
        comp = self.row_leftover() if total > 0 else np.zeros(self.rows.n)
        law_c = c / total if total > 0 else c
        return law_c, comp, self.hit_row_sums() + comp

    def output_law(self) -> np.ndarray:
        """Law of the output token under the completed plan, :math:`\\sum_r m_r \\Pi(\\cdot|r)`: the target."""
        law_c, comp, s = self._completion()
        m = self.rows.mass
        ok = s > 0
        w = np.divide(m, s, out=np.zeros_like(m), where=ok)  # m_r / s_r, about 1
        out = np.bincount(self.rows.tokens, weights=self.pi * w[_row_ids(self.rows)], minlength=self.V)
        out += law_c * float(comp @ w)
        return out + self.target * float(m[~ok].sum())

    def coupling(self) -> np.ndarray:
        """The completed coupling as a dense matrix, shape (n_rows, V): row sums ``mass``, column sums ``target``."""
        n, V = self.rows.n, self.V
        if n * V > MAX_DENSE:
            raise OtmError(f"the dense coupling would have {n * V:,} entries (more than {MAX_DENSE:,}): use row_law")
        law_c, comp, s = self._completion()
        m = self.rows.mass
        ok = s > 0
        w = np.divide(m, s, out=np.zeros_like(m), where=ok)
        out = np.zeros((n, V))
        rid = _row_ids(self.rows)
        np.add.at(out, (rid, self.rows.tokens), self.pi * w[rid])
        out += np.outer(comp * w, law_c)
        out[~ok] = np.outer(m[~ok], self.target)
        return out

    # -- conditional laws -----------------------------------------------------------------------
    def row_law(self, r: int) -> np.ndarray:
        """:math:`\\Pi(\\cdot \\mid r)`, the output law given row ``r``, shape (V,), summing to 1."""
        a, b = self.rows.ptr[r], self.rows.ptr[r + 1]
        hits = self.pi[a:b]
        c = self.target_leftover()
        total = float(c.sum())
        left = max(float(self.rows.mass[r]) - float(hits.sum()), 0.0) if total > 0 else 0.0
        s = float(hits.sum()) + left
        if not s > 0:  # a row of probability 0 (underflow): any law is valid, take the target
            return self.target.copy()
        out = np.zeros(self.V)
        out[self.rows.tokens[a:b]] = hits / s
        if left > 0:
            out += (left / s) * (c / total)
        return out

    def fold(self) -> TransportPlan:
        """The same plan on distinct-token sets (rows with equal sets merged); ``self`` when already folded."""
        if self.folded:
            return self
        if self._folded_plan is None:
            rows, pi = _fold_entries(self.rows, self.pi)
            self._folded_plan = TransportPlan(rows, pi, self.target, folded=True)
        return self._folded_plan

    def row_of(self, drafts) -> int:
        """Index of the (folded) row whose token set is ``set(drafts)``; raises :class:`OtmError` if none."""
        plan = self.fold()
        if plan._index is None:
            keys = _set_keys(plan.rows)
            plan._index = {tuple(int(t) for t in key if t >= 0): r for r, key in enumerate(keys)}
        key = tuple(sorted({int(t) for t in np.asarray(drafts).reshape(-1)}))
        r = plan._index.get(key)
        if r is None:
            raise OtmError(f"the draft set {list(key)} has probability 0 under the scheme: no conditional law")
        return r

    def conditional(self, drafts) -> np.ndarray:
        """Output law given the realised drafts (array of k token ids), shape (V,).

        The law of :math:`Y` given :math:`\\mathrm{set}(\\bar X) = \\mathrm{set}(\\text{drafts})`
        under the completed plan (an unfolded plan is folded first).
        """
        plan = self.fold()
        return plan.row_law(self.row_of(drafts))


# ---------------------------------------------------------------------------------------------
# solving
# ---------------------------------------------------------------------------------------------


@dataclass
class LPResult:
    """Result of :func:`solve_lp`.

    Attributes
    ----------
    value : float
        Optimal membership acceptance :math:`\\alpha^*`: the acceptance of the repaired
        (exactly feasible) plan, so a certified lower bound; with ``dual_bound`` it brackets
        :math:`\\alpha^*` (the two agree to ~1e-15 in practice).
    plan : TransportPlan
        The repaired, completed transport plan (``plan.acceptance == value``).
    n_variables, n_constraints : int
        LP size: pairs (row, member), and rows + tokens.
    seconds : float
        Wall time of the whole call (rows, build, solve, repair).
    backend : str
    folded : bool
    dual_bound : float or None
        A certified upper bound from the repaired dual solution
        (see :func:`_dual_bound`), when the solver gave duals.
    timings : dict
        Seconds per stage: ``rows``, ``build``, ``solve``, ``plan``.
    solver_value : float
        The objective the solver reported; it may exceed :math:`\\alpha^*` by the solver's
        feasibility tolerance (1e-10 per constraint).
    """

    value: float
    plan: TransportPlan
    n_variables: int
    n_constraints: int
    seconds: float
    backend: str
    folded: bool
    dual_bound: float | None = None
    timings: dict = field(default_factory=dict)
    solver_value: float = float("nan")


def _dual_bound(rows: Rows, target: np.ndarray, u, v) -> float | None:
    r"""Weak-duality upper bound on :math:`\alpha^*` from (approximate) row and token duals ``u``, ``v``.

    Two repairs of the solver's duals, both valid, the smaller is returned:

    * with the implied column bounds :math:`\pi_{r,y} \le b_{r,y} = \min(m_r, p_y)`, any
      :math:`u, v, w \ge 0` with :math:`u_r + v_y + w_{r,y} \ge 1` gives
      :math:`\alpha^* \le \sum_r u_r m_r + \sum_y v_y p_y + \sum w_{r,y} b_{r,y}`; take
      :math:`w = (1 - u_r - v_y)_+` (this absorbs the solver's column-bound duals);
    * without them, raise :math:`u_r` to :math:`\max_{y \in r} (1 - v_y)`.
    """
    if u is None or v is None:
        return None
    u = np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0)
    v = np.clip(np.asarray(v, dtype=np.float64), 0.0, 1.0)
    if not (np.isfinite(u).all() and np.isfinite(v).all()):
        return None
    w = np.maximum(1.0 - u[_row_ids(rows)] - v[rows.tokens], 0.0)
    with_bounds = u @ rows.mass + v @ target + w @ _column_bounds(rows, target)
    u_raised = np.maximum(u, np.maximum.reduceat(1.0 - v[rows.tokens], rows.ptr[:-1]))  # rows are never empty
    without = u_raised @ rows.mass + v @ target
    return float(min(with_bounds, without))


def _column_bounds(rows: Rows, target: np.ndarray) -> np.ndarray:
    """Implied bounds ``pi[r, y] <= min(mass[r], target[y])``: simplex keeps nonbasic variables
    exactly at a bound, so entries with a zero mass or target come back exactly 0."""
    return np.minimum(rows.mass[_row_ids(rows)], target[rows.tokens])


@contextlib.contextmanager
def _stdout_silenced():
    """Send file descriptor 1 to /dev/null for the duration: highspy >= 1.16 prints a licence banner
    from C++ when the first ``Highs`` object of a process is built, before ``output_flag`` can be
    set, which would corrupt ``otm acceptance --json`` and anything else written to stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def new_highs():
    import highspy

    with _stdout_silenced():
        return highspy.Highs()


def _solve_highs(rows: Rows, target: np.ndarray, timings: dict):
    import highspy

    t0 = time.perf_counter()
    n, V, nnz = rows.n, target.size, rows.tokens.size
    inf = highspy.kHighsInf
    # column j (variable pi[r, y]) has a 1 in row constraint r and in token constraint n + y
    index = np.empty(2 * nnz, dtype=np.int32)
    index[0::2] = _row_ids(rows)
    index[1::2] = n + rows.tokens
    h = new_highs()
    h.setOptionValue("output_flag", False)
    for name, value in {**HIGHS_OPTIONS, **FAST_PATH_OPTIONS}.items():
        h.setOptionValue(name, value)
    # the array form of passModel takes the numpy buffers as they are (filling a HighsLp's
    # fields converts element by element, ~60 ns per entry, more than the solve at V=32)
    status = h.passModel(
        nnz,  # columns
        n + V,  # rows
        2 * nnz,  # nonzeros
        int(highspy.MatrixFormat.kColwise),
        int(highspy.ObjSense.kMinimize),
        0.0,  # objective offset
        np.full(nnz, -1.0),  # minimise -sum(pi)
        np.zeros(nnz),
        _column_bounds(rows, target),
        np.full(n + V, -inf),
        np.concatenate([rows.mass, target]),
        np.arange(0, 2 * nnz, 2, dtype=np.int32),  # column starts
        index,
        np.ones(2 * nnz),
        np.zeros(nnz, dtype=np.int32),  # integrality: all continuous
    )
    if status != highspy.HighsStatus.kOk:
        raise OtmError(f"HiGHS refused the OTM LP ({status}): try backend='cvxpy'")
    t1 = time.perf_counter()
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        h.setOptionValue("presolve", "on")  # second chance with presolve
        h.clearSolver()
        h.run()
        status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise OtmError(f"HiGHS did not solve the OTM LP (status {h.modelStatusToString(status)}): try backend='cvxpy'")
    value = -h.getInfo().objective_function_value
    sol = h.getSolution()
    x = np.asarray(sol.col_value)
    u = v = None
    if sol.dual_valid:
        dual = -np.asarray(sol.row_dual)  # minimisation with <= rows: HiGHS duals are <= 0
        u, v = dual[:n], dual[n:]
    timings["build"] = t1 - t0
    timings["solve"] = time.perf_counter() - t1
    return value, x, u, v


def _solve_cvxpy(rows: Rows, target: np.ndarray, timings: dict):
    import cvxpy as cp
    import scipy.sparse as sp

    t0 = time.perf_counter()
    n, V, nnz = rows.n, target.size, rows.tokens.size
    cols = np.arange(nnz)
    ones = np.ones(nnz)
    a_row = sp.csr_matrix((ones, (_row_ids(rows), cols)), shape=(n, nnz))  # row memberships
    a_tok = sp.csr_matrix((ones, (rows.tokens, cols)), shape=(V, nnz))  # token memberships
    x = cp.Variable(nnz, bounds=[np.zeros(nnz), _column_bounds(rows, target)])
    constraints = [a_row @ x <= rows.mass, a_tok @ x <= target]
    problem = cp.Problem(cp.Maximize(cp.sum(x)), constraints)
    t1 = time.perf_counter()
    try:
        with _stdout_silenced():  # cvxpy builds its own Highs (banner, see _stdout_silenced)
            problem.solve(solver=cp.HIGHS, highs_options=dict(HIGHS_OPTIONS))
        if problem.status != cp.OPTIMAL:
            with _stdout_silenced():
                problem.solve(solver=cp.HIGHS, highs_options=dict(HIGHS_OPTIONS, presolve="off"))
    except cp.error.SolverError as exc:
        raise OtmError(f"cvxpy/HiGHS failed on the OTM LP ({exc}): try backend='highs'") from None
    if problem.status != cp.OPTIMAL:
        raise OtmError(f"cvxpy/HiGHS did not solve the OTM LP (status {problem.status}): try backend='highs'")
    timings["build"] = t1 - t0
    timings["solve"] = time.perf_counter() - t1
    return float(problem.value), x.value, constraints[0].dual_value, constraints[1].dual_value


def _solve_pot(rows: Rows, target: np.ndarray, timings: dict):
    """The same LP as a sparse min-cost transport problem for POT's network simplex.

    Sources: the rows (mass m_r) and a dummy row R (mass 1); sinks: the tokens
    (mass p_y) and a dummy token D (mass 1). Edges: r -> y for members (cost 1),
    r -> D (cost 2: unmatched draft mass), R -> y (cost 1: unmatched target) and
    R -> D (cost 1). Every feasible flow moves 2 units, so cost = 2 + (1 - acceptance).
    The potentials (alpha, beta) map to relaxed duals u_r = 2 - beta_D - alpha_r,
    v_y = 1 - alpha_R - beta_y (feasible when alpha, beta are).
    """
    try:
        import ot
        import scipy.sparse as sp
    except ImportError:
        raise OtmError("backend='pot' needs POT (pip install pot): use backend='highs'") from None

    t0 = time.perf_counter()
    n, V, nnz = rows.n, target.size, rows.tokens.size
    rid = _row_ids(rows)
    src = np.concatenate([rid, np.arange(n), np.full(V + 1, n)])
    dst = np.concatenate([rows.tokens, np.full(n, V), np.arange(V + 1)])
    cost = np.concatenate([np.ones(nnz), np.full(n, 2.0), np.ones(V + 1)])
    graph = sp.coo_array((cost, (src, dst)), shape=(n + 1, V + 1))
    a = np.concatenate([rows.mass, [1.0]])
    b = np.concatenate([target, [1.0]])
    t1 = time.perf_counter()
    try:
        flow, log = ot.emd(a, b, graph, numItermax=max(100_000, 100 * graph.nnz), log=True)
    except (TypeError, NotImplementedError, ValueError) as exc:  # e.g. a POT without sparse emd
        raise OtmError(f"POT's emd failed on the sparse OTM problem ({exc}): use backend='highs'") from None
    if log.get("warning"):
        raise OtmError(f"POT's network simplex did not finish ({log['warning']}): use backend='highs'")
    if not sp.issparse(flow):
        raise OtmError("this POT returned a dense plan for a sparse problem (needs POT >= 0.9.7): use backend='highs'")
    x = np.asarray(sp.csr_array(flow)[rid, rows.tokens]).reshape(-1)
    alpha, beta = np.asarray(log["u"]), np.asarray(log["v"])
    u = 2.0 - beta[V] - alpha[:n]
    v = 1.0 - alpha[n] - beta[:V]
    timings["build"] = t1 - t0
    timings["solve"] = time.perf_counter() - t1
    return 3.0 - float(log["cost"]), x, u, v


def solve_lp(
    scheme: Scheme,
    target,
    *,
    fold: bool = True,
    backend: str = "highs",
    max_variables: int = MAX_VARIABLES,
) -> LPResult:
    r"""Solve the OTM linear program exactly: the optimal membership acceptance and plan.

    With rows :math:`r` of the draft law (distinct-token sets, or ordered
    tuples' sets when ``fold=False``) of mass :math:`m_r`, and the target
    :math:`p`, the relaxed OTM LP (docs/theory.md section 1) is

    .. math::
        \alpha^* = \max_{\pi \ge 0} \sum_r \sum_{y \in r} \pi_{r,y}

        s.t. \ \sum_{y \in r} \pi_{r,y} \le m_r \quad \forall r, \qquad
             \sum_{r \ni y} \pi_{r,y} \le p_y \quad \forall y

    It has the optimum of the full OTM LP over couplings of the draft law and
    :math:`p` with cost :math:`1\{y \notin \mathrm{set}(\bar x)\}`, and of the
    subset formula :math:`\min_{H} [p(H) + 1 - P(\bar X \subseteq H)]`.

    Parameters
    ----------
    scheme : otm.schemes.Scheme
        Joint law of the k drafts (V tokens).
    target : array_like, shape (V,)
        Target next-token law :math:`p`; checked by :func:`otm.schemes.check_target`.
    fold : bool, default True
        Rows on distinct-token sets (smaller, same optimum) or on ordered tuples.
    backend : {"highs", "cvxpy", "pot"}, default "highs"
        ``"highs"``: the LP passed to HiGHS directly as a CSC matrix (3-6x faster than through
        cvxpy, docs/lp_benchmark.md). ``"cvxpy"``: the same LP in cvxpy's modelling language
        (sparse incidence matrices), solved by HiGHS: the readable formulation, kept as the
        cross-check. ``"pot"``: the same LP as a sparse min-cost flow for POT's network
        simplex (optional dependency ``pot >= 0.9.7``; 3-5x faster than ``"highs"`` here).
    max_variables : int, default 2,000,000
        Refuse (:class:`otm.laws.OtmError`, before building) an LP with more variables.

    Returns
    -------
    LPResult
        ``value`` (:math:`\alpha^*`), ``plan`` (:class:`TransportPlan`, repaired and completed),
        ``n_variables``, ``n_constraints``, ``seconds``, ``backend``, ``folded``, ``dual_bound``.

    Raises
    ------
    OtmError
        Bad target, too large an LP, unknown backend, or the solver did not reach optimality.

    Examples
    --------
    >>> from otm.schemes import IID
    >>> res = solve_lp(IID([0.5, 0.3, 0.2], 2), [0.2, 0.3, 0.5], backend="highs")
    >>> round(res.value, 6), res.n_variables, res.n_constraints
    (0.86, 9, 9)
    >>> round(res.plan.acceptance, 6), round(res.dual_bound, 6)
    (0.86, 0.86)
    >>> law = res.plan.conditional([2, 0])  # output law given the drafts (2, 0)
    >>> law.shape, round(float(law.sum()), 12)
    ((3,), 1.0)
    >>> res.plan.output_law().round(12).tolist()  # the completed plan outputs the target
    [0.2, 0.3, 0.5]

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu. "SpecTr: Fast Speculative Decoding via
       Optimal Transport", NeurIPS 2023 (arXiv 2310.15141).
    .. [2] Hu, Zheng, Liu, Huang. "Towards Optimal Multi-draft Speculative Decoding",
       ICLR 2025 (arXiv 2502.18779).
    .. [3] Thomas, Pal. Global Resolution / Partial Resolution of multi-draft speculative
       sampling (max-flow view of the OTM LP); see the project's theory notes, section 6.5.
    """
    start = time.perf_counter()
    if backend not in BACKENDS:
        raise OtmError(f"unknown LP backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    target = check_target(scheme, target)
    rows = _build_rows(scheme, fold, int(max_variables))
    timings = {"rows": time.perf_counter() - start}
    solver = {"highs": _solve_highs, "cvxpy": _solve_cvxpy, "pot": _solve_pot}[backend]
    solver_value, x, u, v = solver(rows, target, timings)
    t = time.perf_counter()
    plan = TransportPlan.from_solution(rows, x, target, folded=fold)
    bound = _dual_bound(rows, target, u, v)
    timings["plan"] = time.perf_counter() - t
    return LPResult(
        value=plan.acceptance,
        plan=plan,
        n_variables=int(rows.tokens.size),
        n_constraints=int(rows.n + target.size),
        seconds=time.perf_counter() - start,
        backend=backend,
        folded=fold,
        dual_bound=bound,
        timings=timings,
        solver_value=solver_value,
    )
