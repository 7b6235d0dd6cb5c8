r"""The exact optimum of one decoding step over a draft tree, for toy LMs (an LP solved by HiGHS).

Setting: a fixed context c, a target LM with processed next-token law :math:`p(\cdot\mid c, s)`
and a draft LM with :math:`q(\cdot\mid c, s)`. One step of the decoder draws a draft tree T (k rows
of length L from q: i.i.d. rows, or the k root tokens without replacement and i.i.d.
continuations), makes one target call that scores every node, and emits a block
:math:`B = (b_1..b_m)`: a path :math:`b_1..b_{m-1}` of T (``m - 1 <= L``) and one more token. The next
step starts afresh from :math:`c + B`. Tokens per target call = :math:`\mathbb E|B|`.

**What a verifier may do.** See T and both laws (at every node, on and off the tree: the
context is fixed, so the laws are known), use any private randomness, and output B. Write
:math:`g(b) = P(B = b)` and :math:`G(s) = P(B \succeq s)` (B starts with s).

**When a step is lossless.** A step that emits B and then restarts from :math:`c + B` (every later
step lossless) produces a stream with the target's law iff B is the target's stream stopped at a
randomised stopping time, that is iff, for every sequence s with :math:`|s| \le L` and token x,

.. math::

    G(x) = p(x \mid c) \ (s = \varnothing), \qquad G(s x) = p(x \mid c, s)\,\big(G(s) - g(s)\big),

(among the runs whose block goes beyond s, the next token follows the target). Sufficiency: the
stream's token after any prefix s follows :math:`p(\cdot\mid c,s)`, whether it comes from B
(this equation) or from a fresh step after :math:`B = s` (induction). Necessity: take the stream's
law of :math:`s x`, subtract the part produced by later steps (the target's, by induction).

**The LP** (:func:`tree_optimum`). Variables :math:`\pi(S, b) \ge 0` for every node set S of a
draft tree (the set of its paths; the order and multiplicity of the rows cannot help, see below)
and every block b whose first :math:`|b| - 1` tokens are a node of S (the root included), with
:math:`p(b) > 0`:

.. math::

    \max \sum_{S, b} |b|\,\pi(S, b) \quad\text{s.t.}\quad \sum_b \pi(S, b) = \mu(S),\qquad
    g(b) = \sum_S \pi(S, b) \text{ satisfies the lossless equations above},

with :math:`\mu` the law of the node set. Any lossless verifier gives a feasible :math:`\pi`
(:math:`\pi(S, b) = P(S_T = S, B = b)`), and any feasible :math:`\pi` is a lossless verifier
(given S, emit b with probability :math:`\pi(S, b)/\mu(S)`), so the LP's value is the largest
expected number of tokens per target call of any lossless verifier of this step. A verifier
that also looks at the rows' order or multiplicities (a finer T) gives, aggregated over the T of
each S, a feasible :math:`\pi` of the same value, since the constraints see only S and g.

**Why not a plain optimal transport.** The coupling of T with the target's sequence
:math:`Y_{1..L+1}` maximising :math:`1 + \text{longest tree-path prefix of } Y` is a *relaxation*
(:attr:`TreeOptimum.transport_bound`): the coupling may choose the tree from tokens of Y beyond
the first divergence, which are then thrown away, and the emitted prefix is then not a stopped
target stream. Example (V = 2, uniform i.i.d. target): emit :math:`Y_1` alone when
:math:`Y_2 = 0` and :math:`Y_1 Y_2` otherwise; the stream's second token is 1 with probability
3/4. The LP above adds exactly the missing constraint (the stopping must not look ahead). On
k = 1 it reproduces block verification (Sun et al., ICLR 2025), which is optimal for a chain.

**Limits.** One step from one fixed context: the optimum of a whole decode (several steps,
where a step may prefer a shorter block that leaves a context with better drafts) can differ;
the draft tree's law is fixed (drafting is not optimised); the cost counted is target calls, not
draft calls or time. Tree enumeration grows like :math:`V^{kL}`: V <= 4, k <= 2, L <= 2 (and
V = 3, k = 2, L = 3; V = 4, k = 3, L = 2) fit; ``max_trees`` and ``max_variables`` refuse larger
cases in one line.

:func:`rule_tokens_per_call` computes the same quantity exactly for the decoder's own rules
(``speculative``, ``block``, ``kseq``, ``rrs``, ``rrs_without_replacement``) by enumerating every
random choice of the first step of the real decoder (its exact-mode door,
:class:`otm.decode.chance.Enumerated`). No rule may exceed :func:`tree_optimum`'s value.

:func:`solve_tree_plan` (:func:`tree_plan` for models) returns an optimal plan itself, polished to
float64 rounding, as the law of the block given the node set: the verifier
:class:`otm.decode.tree_rules_tree_lp.TreeLP` draws from it in the decoder, reaching the optimum.

The decoder-facing functions import ``otm.decode`` (torch) inside, so this module stays in the core.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from ..laws import OtmError

MAX_TREES = 1_000_000
"""Default largest number of ordered draft tuples :func:`tree_optimum` enumerates."""

MAX_VARIABLES = 500_000
"""Default largest number of LP variables :math:`\\pi(S, b)` :func:`tree_optimum` builds."""

SCHEMES = ("iid", "without_replacement")


@dataclass
class TreeOptimum:
    """Result of :func:`tree_optimum` (expected tokens per target call of one step)."""

    value: float
    """The LP optimum: the largest expected tokens per target call of a lossless verifier."""
    dual_bound: float
    """Objective of a dual-feasible point built from HiGHS' duals (an upper bound on ``value``)."""
    transport_bound: float
    """The plain optimal-transport relaxation (tree vs target sequence, may look ahead): >= ``value``."""
    V: int
    k: int
    L: int
    scheme: str
    trees: int
    """Distinct node sets of the draft tree with positive probability."""
    variables: int
    constraints: int
    seconds: float
    block_law: dict
    """``{block: g(block)}`` of the optimal plan (a lossless block law, up to the solver's tolerance)."""
    delay: int = 0
    """A delayed tree's shared path (0: k rows from the root)."""


# -- laws ----------------------------------------------------------------------------------


def _paths(law, prefix: tuple, depth: int):
    """``(sequence, probability)`` for every continuation of ``prefix`` of ``depth`` tokens with mass > 0."""
    if depth == 0:
        yield (), 1.0
        return
    p = law(prefix)
    for x in np.flatnonzero(p > 0):
        for rest, w in _paths(law, prefix + (int(x),), depth - 1):
            yield (int(x),) + rest, float(p[x]) * w


def _node_set(rows) -> frozenset:
    return frozenset(row[:t] for row in rows for t in range(1, len(row) + 1))


def _count_tuples(draft, k: int, L: int, scheme: str, delay: int = 0) -> int:
    total = 0
    for path, _ in _paths(draft, (), delay):  # the shared path of a delayed tree (one, empty, when delay = 0)
        q0 = draft(path)
        roots = [int(x) for x in np.flatnonzero(q0 > 0)]
        conts = {x: sum(1 for _ in _paths(draft, path + (x,), L - delay - 1)) for x in roots}
        if scheme == "iid":
            total += sum(conts.values()) ** k
        else:
            kk = min(k, len(roots))
            total += sum(int(np.prod([conts[x] for x in combo])) for combo in itertools.permutations(roots, kk))
    return total


def _check_delay(L: int, delay: int) -> None:
    if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay < L:
        raise OtmError(f"delay must be a whole number with 0 <= delay < L = {L} (a delayed tree's shared path), "
                       f"got {delay!r}")


def draft_rows(draft, k: int, L: int, scheme: str = "iid", delay: int = 0):
    """``(rows, probability)`` for every ordered tuple of the k draft rows of one step (mass > 0).

    ``draft(prefix) -> [V]`` is the draft's processed law after the context and ``prefix``.
    ``iid``: k i.i.d. rows of length L. ``without_replacement``: the k root tokens by successive
    sampling without replacement (k cut to the support, as the decoder does; each draw renormalised
    by the mass of the tokens left, summed, not 1 minus the mass taken, which loses tiny masses),
    each row continued i.i.d. from the draft. ``delay`` > 0 (a delayed tree, DDTE): one shared path of
    ``delay`` tokens drawn once from the draft, then the k rows of either scheme branch from its end.
    """
    _check_delay(L, delay)
    for path, w_path in _paths(draft, (), delay):
        for tails, w in _branch_rows(draft, path, k, L - delay, scheme):
            yield [path + t for t in tails], w_path * w


def _branch_rows(draft, prefix: tuple, k: int, L: int, scheme: str):
    """``(rows, probability)`` of k rows of length L drawn after ``prefix`` (:func:`draft_rows` from a node)."""
    if scheme == "iid":
        rows = list(_paths(draft, prefix, L))
        for combo in itertools.product(rows, repeat=k):
            yield [r for r, _ in combo], float(np.prod([w for _, w in combo]))
        return
    q0 = draft(prefix)
    roots = [int(x) for x in np.flatnonzero(q0 > 0)]
    conts = {x: list(_paths(draft, prefix + (x,), L - 1)) for x in roots}
    for combo in itertools.permutations(roots, min(k, len(roots))):
        w_root, left = 1.0, list(roots)
        for x in combo:  # successive sampling: q(x) / (mass of the tokens not drawn yet)
            w_root *= float(q0[x]) / float(q0[left].sum())
            left.remove(x)
        for tails in itertools.product(*(conts[x] for x in combo)):
            yield [(x,) + t for x, (t, _) in zip(combo, tails)], w_root * float(np.prod([w for _, w in tails]))


def tree_law(draft, k: int, L: int, scheme: str = "iid", delay: int = 0) -> dict[frozenset, float]:
    """Law of the node set (all non-root prefixes of the rows) of one step's draft tree
    (the ordered row tuples of :func:`draft_rows`, merged)."""
    out: dict[frozenset, float] = {}
    for rows, w in draft_rows(draft, k, L, scheme, delay):
        key = _node_set(rows)
        out[key] = out.get(key, 0.0) + w
    return out


# -- the LP --------------------------------------------------------------------------------


def _solve(cost, rows, cols, vals, rhs, n_rows):
    """``max cost . x`` s.t. ``A x = rhs``, ``x >= 0`` with HiGHS: (value, row duals for the max, solution)."""
    import highspy
    import scipy.sparse as sp

    from ..lp import HIGHS_OPTIONS, new_highs

    n = cost.size
    A = sp.csc_matrix((vals, (rows, cols)), shape=(n_rows, n))
    A.sum_duplicates()
    h = new_highs()
    h.setOptionValue("output_flag", False)
    for name, value in HIGHS_OPTIONS.items():
        h.setOptionValue(name, value)
    inf = highspy.kHighsInf
    status = h.passModel(
        n, n_rows, int(A.nnz), int(highspy.MatrixFormat.kColwise), int(highspy.ObjSense.kMaximize), 0.0,
        np.ascontiguousarray(cost, dtype=np.float64), np.zeros(n), np.full(n, inf),
        np.ascontiguousarray(rhs, dtype=np.float64), np.ascontiguousarray(rhs, dtype=np.float64),
        A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64), np.zeros(n, dtype=np.int32),
    )
    if status != highspy.HighsStatus.kOk:
        raise OtmError(f"HiGHS refused the tree LP ({status})")
    h.run()
    for name, value in (("presolve", "off"), ("solver", "ipm")):  # second and third chances
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            break
        h.setOptionValue(name, value)
        h.clearSolver()
        h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise OtmError(f"HiGHS did not solve the tree LP (status {h.modelStatusToString(h.getModelStatus())})")
    sol = h.getSolution()
    y = np.asarray(sol.row_dual, dtype=np.float64) if sol.dual_valid else np.zeros(n_rows)
    return float(h.getInfo().objective_function_value), y, np.asarray(sol.col_value), A


def _certified_bound(A, cost, rhs, y, group_rows: np.ndarray, col_group: np.ndarray) -> float:
    r"""Upper bound ``rhs . y'`` at a dual-feasible ``y'`` (``A^T y' >= cost``) built from ``y``.

    Every column has exactly one 1 in the rows ``group_rows`` (its node set's marginal row), so the
    duals of those rows can be raised to ``max_j (cost_j - (A^T y)_j)`` over their columns; both
    signs of HiGHS' duals are tried (weak duality holds for any y), the smaller bound is kept.
    """
    best = np.inf
    for sign in (1.0, -1.0):
        z = sign * y.copy()
        z[group_rows] = 0.0
        slack = cost - A.T @ z  # [n]
        need = np.full(group_rows.size, -np.inf)
        np.maximum.at(need, col_group, slack)
        z[group_rows] = need
        best = min(best, float(rhs @ z))
    return best


def _prefix_probs(target, L: int) -> dict[tuple, float]:
    """Target probability of every sequence of length 0..L+1 with positive mass."""
    out = {(): 1.0}
    frontier = [()]
    for _ in range(L + 1):
        nxt = []
        for s in frontier:
            p = target(s)
            for x in np.flatnonzero(p > 0):
                t = s + (int(x),)
                out[t] = out[s] * float(p[x])
                nxt.append(t)
        frontier = nxt
    return out


@dataclass
class _TreeLP:
    """The tree LP of :func:`solve_tree_lp` in coordinates: ``max cost . x`` s.t. ``A x = rhs``, ``x >= 0``."""

    V: int
    law: dict  # node set -> mu(S)
    sets: list  # the node sets, in row order (row i is the marginal of sets[i])
    pref: dict  # target probability of every sequence of length 0..L+1
    cost: np.ndarray  # [n]: |b| of each column
    R: list  # the matrix in triplets (row, column, value)
    C: list
    X: list
    rhs: np.ndarray  # [n_rows]
    col_group: list  # [n]: the node set (row) of each column
    blocks: list  # [n]: the block b of each column


def _build_tree_lp(target, draft, k: int, L: int, scheme: str, max_trees: int, max_variables: int,
                   delay: int = 0) -> _TreeLP:
    """Enumerate the node sets and write the LP of :func:`solve_tree_lp` (its docstring), refusing large cases."""
    if scheme not in SCHEMES:
        raise OtmError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    for name, v in (("k", k), ("L", L)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OtmError(f"{name} must be a whole number >= 1, got {v!r}")
    _check_delay(L, delay)
    V = int(np.asarray(target(())).size)
    n_tuples = _count_tuples(draft, k, L, scheme, delay)
    if n_tuples > max_trees:
        raise OtmError(f"the tree LP at V = {V}, k = {k}, L = {L} ({scheme}) would enumerate {n_tuples:,} draft "
                       f"tuples, more than max_trees = {max_trees:,}: lower V, k or L")
    law = tree_law(draft, k, L, scheme, delay)
    pref = _prefix_probs(target, L)
    sets = list(law)
    n_vars = sum(sum(int((target(s) > 0).sum()) for s in [(), *S]) for S in sets)
    if n_vars > max_variables:
        raise OtmError(f"the tree LP at V = {V}, k = {k}, L = {L} ({scheme}) has {n_vars:,} variables, more than "
                       f"max_variables = {max_variables:,}: lower V, k or L")
    # constraint rows: one per node set, then one per (s, x) with p(s x) > 0 and |s| <= L
    # the rows (s, x) over x sum to 0 for every s != () and the root rows to the marginal rows' total
    # (both laws sum to 1): drop one of each group (the largest x), so no row is implied by others
    last = {s: int(np.flatnonzero(target(s) > 0)[-1]) for s in pref if len(s) <= L}
    kept = [t for t in pref if 1 <= len(t) <= L + 1 and t[-1] != last[t[:-1]]]
    flow = {t: len(sets) + i for i, t in enumerate(kept)}
    n_rows = len(sets) + len(flow)
    rhs = np.zeros(n_rows)
    rhs[: len(sets)] = [law[S] for S in sets]
    for t, r in flow.items():
        if len(t) == 1:
            rhs[r] = pref[t]
    R, C, X, cost, col_group, blocks = [], [], [], [], [], []
    j = 0
    for i, S in enumerate(sets):
        for s in [(), *sorted(S, key=lambda t: (len(t), t))]:
            if s not in pref:
                continue
            for x in np.flatnonzero(target(s) > 0):
                b = s + (int(x),)
                R.append(i), C.append(j), X.append(1.0)  # marginal of S
                for d in range(1, len(b) + 1):  # G(b[:d]) - p(b_d | b[:d-1]) * sum_x' G(b[:d-1] x') = 0
                    head = b[: d - 1]
                    if d == 1:
                        if b[:1] in flow:
                            R.append(flow[b[:1]]), C.append(j), X.append(1.0)
                        continue
                    ph = target(head)
                    for z in np.flatnonzero(ph > 0):
                        if head + (int(z),) not in flow:
                            continue
                        R.append(flow[head + (int(z),)]), C.append(j)
                        X.append((1.0 if int(z) == b[d - 1] else 0.0) - float(ph[z]))
                cost.append(float(len(b)))
                col_group.append(i)
                blocks.append(b)
                j += 1
    return _TreeLP(V, law, sets, pref, np.array(cost), R, C, X, rhs, col_group, blocks)


def solve_tree_lp(target, draft, k: int, L: int, scheme: str = "iid", *, max_trees: int = MAX_TREES,
                  max_variables: int = MAX_VARIABLES, delay: int = 0) -> TreeOptimum:
    """:func:`tree_optimum` on laws ``prefix -> [V]`` (float64) instead of models."""
    start = time.perf_counter()
    lp = _build_tree_lp(target, draft, k, L, scheme, max_trees, max_variables, delay)
    sets, cost, n_rows = lp.sets, lp.cost, lp.rhs.size
    value, y, x, A = _solve(cost, np.array(lp.R), np.array(lp.C), np.array(lp.X), lp.rhs, n_rows)
    plan: dict[tuple, float] = {}
    for b, w in zip(lp.blocks, x):
        plan[b] = plan.get(b, 0.0) + max(float(w), 0.0)
    bound = _certified_bound(A, cost, lp.rhs, y, np.arange(len(sets)), np.array(lp.col_group))
    relax = transport_bound(lp.law, target, L, lp.pref)
    return TreeOptimum(value, bound, relax, lp.V, k, L, scheme, len(sets), cost.size, n_rows,
                       time.perf_counter() - start, plan, delay)


@dataclass
class TreePlan:
    r"""An optimal plan of the tree LP (:func:`solve_tree_plan`): the lossless verifier that reaches the optimum.

    Given the step's node set S, emit the block b with probability ``conditional[S]``'s weight of b,
    that is :math:`\pi(S, b) / \mu(S)`.
    """

    value: float
    r"""Expected tokens per target call of the plan as returned (after polishing): :math:`\sum |b|\,\pi(S, b)`."""
    solver_value: float
    """HiGHS' objective (the LP optimum :attr:`TreeOptimum.value`); ``value`` differs by the polish only."""
    V: int
    k: int
    L: int
    scheme: str
    tree_law: dict
    """``{node set S: mu(S)}``: the law of the step's node set (:func:`tree_law`)."""
    conditional: dict
    """``{S: (blocks, weights [n])}``: the blocks the plan may emit given S and their probabilities (sum 1, > 0)."""
    residual: float
    r"""Largest violation of the LP's equality rows by the plan, written in conditional form
    (:math:`\sum_b \pi(S,b)/\mu(S) = 1` and the lossless equations): float64 rounding, <= ``PLAN_TOLERANCE``."""
    seconds: float
    delay: int = 0
    """A delayed tree's shared path (0: k rows from the root)."""

    @property
    def block_law(self) -> dict:
        r"""``{b: g(b)}``, :math:`g(b) = \sum_S \mu(S)\,\pi(S, b)/\mu(S)` (the law of the emitted block)."""
        g: dict[tuple, float] = {}
        for S, (blocks, w) in self.conditional.items():
            for b, x in zip(blocks, w):
                g[b] = g.get(b, 0.0) + self.tree_law[S] * float(x)
        return g


PLAN_TOLERANCE = 1e-13
"""Largest violation of the LP's rows (conditional form) :func:`solve_tree_plan` accepts after polishing."""

SEED_GAP = 1e-6
"""A node set whose conditional plan from HiGHS sums further than this from 1 is restarted from the root draw."""


def _conditional_rows(lp: _TreeLP):
    r"""``(M, b, col_mu)``: the LP's rows in the conditional variables :math:`r = \pi / \mu(S)`, ``M r = b``.

    Columns scaled by their node set's mass; the node-set rows divided by it (:math:`\sum_b r(S, b) = 1`).
    """
    import scipy.sparse as sp

    n_sets, n = len(lp.sets), lp.cost.size
    mu = np.array([lp.law[S] for S in lp.sets])
    col_mu = mu[np.asarray(lp.col_group)]  # [n]
    rows, cols, vals = np.asarray(lp.R), np.asarray(lp.C), np.asarray(lp.X, dtype=np.float64)
    vals = vals * col_mu[cols]  # column scaling: pi = mu(S) r
    vals = np.where(rows < n_sets, vals / mu[np.minimum(rows, n_sets - 1)], vals)  # node-set rows: sum_b r = 1
    M = sp.csc_matrix((vals, (rows, cols)), shape=(lp.rhs.size, n))
    M.sum_duplicates()
    b = lp.rhs.copy()
    b[:n_sets] = 1.0
    return M, b, col_mu


def _polish(lp: _TreeLP, x: np.ndarray, rounds: int = 4) -> tuple[np.ndarray, float]:
    r"""HiGHS' vertex made feasible to float64 rounding: ``(r, residual)``, :math:`r = \pi / \mu(S)`.

    HiGHS meets the rows to its tolerance (1e-9), too loose for a verifier whose law must be the
    target's to 1e-12. In the conditional variables r (columns scaled by their node set's mass,
    the node-set rows divided by it: :math:`\sum_b r(S, b) = 1`), the columns HiGHS left at a
    nonzero value are corrected by the least-norm step that meets every row (``lstsq`` on the
    dense submatrix); a value pushed below 0 is set to 0 and dropped, and the step repeated. A node
    set HiGHS left (nearly) empty (its mass below the solver's tolerance) first gets the target's
    own draw at the root (:data:`SEED_GAP`).
    """
    M, b, col_mu = _conditional_rows(lp)
    n_sets = len(lp.sets)
    r = np.asarray(x, dtype=np.float64) / col_mu
    group = np.asarray(lp.col_group)
    # a node set of tiny mass (HiGHS' tolerances let it emit almost nothing, e.g. mu(S) = 6e-14) is given
    # the target's own draw at the root, a lossless conditional law on its own; the step below
    # moves the other columns by about mu(S) to meet the rows again
    off = np.flatnonzero(np.abs(np.bincount(group, weights=r, minlength=n_sets) - 1.0) > SEED_GAP)
    for i in off:
        mine = group == i
        r[mine] = 0.0
        for j in np.flatnonzero(mine):
            if len(lp.blocks[j]) == 1:
                r[j] = lp.pref[lp.blocks[j]]
    support = r != 0.0  # HiGHS returns its nonbasic columns at exactly 0
    r[~support] = 0.0
    for _ in range(rounds):
        dense = M[:, np.flatnonzero(support)].toarray()  # [rows, |support|]
        step = np.linalg.lstsq(dense, b - dense @ r[support], rcond=None)[0]
        r[support] += step
        negative = support & (r < 0.0)
        if negative.any():
            r[negative] = 0.0
            support &= ~negative
            continue
        if float(np.abs(M @ r - b).max()) <= PLAN_TOLERANCE / 10:
            break
    return r, float(np.abs(M @ r - b).max())


def solve_tree_plan(target, draft, k: int, L: int, scheme: str = "iid", *, max_trees: int = MAX_TREES,
                    max_variables: int = MAX_VARIABLES, polish: bool = True, delay: int = 0) -> TreePlan:
    r"""An optimal plan :math:`\pi(S, b)` of the tree LP (:func:`solve_tree_lp`) on laws ``prefix -> [V]``.

    The LP is the one :func:`solve_tree_lp` solves (same enumeration, same HiGHS call); its vertex
    is then polished (:func:`_polish`) so that the plan meets the LP's rows to float64 rounding
    (``residual <= PLAN_TOLERANCE``, else a one-line OtmError), and returned as the law of the block
    given the node set: the verifier :class:`otm.decode.tree_rules_tree_lp.TreeLP` draws from it.
    ``polish=False`` returns HiGHS' vertex as it is (negative entries set to 0, no check), which meets
    the rows only to the solver's tolerance: kept to show what the polish is for.

    >>> from otm.decode.toy import ToyLM, model_law
    >>> t, d = model_law(ToyLM(3, seed=0), [0, 2]), model_law(ToyLM(3, seed=1), [0, 2])
    >>> plan = solve_tree_plan(t, d, 2, 1)
    >>> abs(plan.value - solve_tree_lp(t, d, 2, 1).value) < 1e-9, plan.residual < 1e-13
    (True, True)
    """
    start = time.perf_counter()
    lp = _build_tree_lp(target, draft, k, L, scheme, max_trees, max_variables, delay)
    value, _, x, _ = _solve(lp.cost, np.array(lp.R), np.array(lp.C), np.array(lp.X), lp.rhs, lp.rhs.size)
    if polish:
        r, residual = _polish(lp, x)
    else:
        M, b, col_mu = _conditional_rows(lp)
        r = np.maximum(np.asarray(x, dtype=np.float64), 0.0) / col_mu
        residual = float(np.abs(M @ r - b).max())
    if polish and (residual > PLAN_TOLERANCE or not (r >= 0.0).all()):
        raise OtmError(f"the tree LP's plan at k = {k}, L = {L} ({scheme}) meets its rows only to {residual:.2g} after "
                       f"polishing (need {PLAN_TOLERANCE:g}): report these laws")
    conditional: dict = {}
    for j in np.flatnonzero(r > 0.0):
        conditional.setdefault(lp.sets[lp.col_group[j]], []).append((lp.blocks[j], float(r[j])))
    out = {}
    for S, pairs in conditional.items():
        w = np.array([x for _, x in pairs])
        out[S] = (tuple(b for b, _ in pairs), w / w.sum())
    if polish and len(out) != len(lp.sets):
        raise OtmError(f"the tree LP's plan at k = {k}, L = {L} ({scheme}) emits nothing for some node set: report "
                       "these laws")
    plan_value = float(sum(lp.law[S] * sum(len(b) * x for b, x in zip(bs, w)) for S, (bs, w) in out.items()))
    return TreePlan(plan_value, value, lp.V, k, L, scheme, dict(lp.law), out, residual, time.perf_counter() - start,
                    delay)


def tree_plan(target_lm, draft_lm, prompt, k: int, L: int, scheme: str = "iid", sampling=None, *,
              max_trees: int = MAX_TREES, max_variables: int = MAX_VARIABLES) -> TreePlan:
    """:func:`solve_tree_plan` for two causal LMs after ``prompt`` (laws by :func:`otm.decode.toy.model_law`,
    processed by ``sampling``), as :func:`tree_optimum` is for :func:`solve_tree_lp`."""
    from ..decode.toy import model_law

    return solve_tree_plan(model_law(target_lm, prompt, sampling), model_law(draft_lm, prompt, sampling), k, L, scheme,
                           max_trees=max_trees, max_variables=max_variables)


def transport_bound(law: dict[frozenset, float], target, L: int, pref: dict | None = None) -> float:
    r"""The plain OT relaxation: :math:`\max_{\pi \in \Pi(\mu, p_{1..L})} E[1 + \text{longest path prefix of } Y]`.

    It lets the tree depend on target tokens the step never emits, so it can exceed every lossless
    verifier (module docstring); kept to show the gap.
    """
    pref = _prefix_probs(target, L) if pref is None else pref
    ys = [t for t in pref if len(t) == L]
    sets = list(law)
    n, m = len(sets), len(ys)
    cost = np.empty(n * m)
    for i, S in enumerate(sets):
        for jy, yv in enumerate(ys):
            a = 0
            while a < L and yv[: a + 1] in S:
                a += 1
            cost[i * m + jy] = 1.0 + a
    cols = np.arange(n * m)
    rows = np.concatenate([np.repeat(np.arange(n), m), n + np.tile(np.arange(m), n)])
    rhs = np.concatenate([[law[S] for S in sets], [pref[yv] for yv in ys]])
    value, _, _, _ = _solve(cost, rows, np.concatenate([cols, cols]), np.ones(2 * n * m), rhs, n + m)
    return value


def tree_optimum(target_lm, draft_lm, prompt, k: int, L: int, scheme: str = "iid", sampling=None, *,
                 max_trees: int = MAX_TREES, max_variables: int = MAX_VARIABLES, delay: int = 0) -> TreeOptimum:
    """The largest expected tokens per target call of any lossless verifier of one step (module docstring).

    Parameters
    ----------
    target_lm, draft_lm : causal LMs (e.g. :class:`otm.decode.toy.ToyLM`); laws by
        :func:`otm.decode.toy.model_law` (float64, processed by ``sampling``).
    prompt : the fixed context (list of token ids).
    k, L : rows and depth of the draft tree.
    scheme : ``"iid"`` or ``"without_replacement"`` (root tokens distinct, k cut to the support).
    sampling : :class:`otm.decode.Sampling` for both models (default temperature 1).
    max_trees, max_variables : refuse (one-line OtmError) larger enumerations or LPs.
    delay : a delayed tree (DDTE): one shared path of ``delay`` draft tokens, then the k rows branch from its
        end (the scheme applies there); ``0 <= delay < L``, the LP itself is unchanged (only the tree's law).
    """
    from ..decode.toy import model_law

    return solve_tree_lp(model_law(target_lm, prompt, sampling), model_law(draft_lm, prompt, sampling), k, L, scheme,
                         max_trees=max_trees, max_variables=max_variables, delay=delay)


# -- the decoder's rules, exactly ----------------------------------------------------------


class _FirstStep(Exception):
    def __init__(self, tokens):
        self.tokens = list(tokens)


def rule_block_law(target_lm, draft_lm, prompt, k: int, L: int, verifier: str, scheme: str = "iid", sampling=None,
                   max_runs: int = 200_000, delay: int = 0) -> dict[tuple, float]:
    """Exact law of the block the real decoder emits in its first step (depth L: ``max_new_tokens = L + 1``).

    Every random choice of :func:`otm.decode.decoder.speculative_decode` goes through an
    :class:`otm.decode.chance.Enumerated` door (as in :func:`otm.decode.exact_mode.exact_decode`);
    the run is stopped when the first step hands its tokens to ``on_tokens``, so the enumeration
    covers exactly the first step's choices (draft tokens, verification outcomes, bonus).
    """
    import torch

    from ..decode.chance import Enumerated
    from ..decode.decoder import speculative_decode

    def stop(tokens):
        raise _FirstStep(tokens)

    law: dict[tuple, float] = {}
    stack: list[tuple] = [()]
    memo: dict = {}
    runs = 0
    while stack:
        forced = stack.pop()
        door = Enumerated(forced, memo)
        try:
            speculative_decode(target_lm, draft_lm, prompt, k=k, length=L, verifier=verifier, scheme=scheme,
                               delay=delay, sampling=sampling, max_new_tokens=L + 1, chance=door, on_tokens=stop,
                               law_dtype=torch.float64)
            raise RuntimeError("the decoder finished without emitting a step")
        except _FirstStep as done:
            block = tuple(done.tokens)
        runs += 1
        for i in range(len(forced), len(door.taken)):
            stack.extend(tuple(door.taken[:i]) + (alt,) for alt in range(door.sizes[i] - 1, 0, -1))
        if runs + len(stack) > max_runs:
            raise OtmError(f"the first step has more than max_runs = {max_runs:,} runs: lower V, k or L")
        law[block] = law.get(block, 0.0) + door.probability
    return law


def rule_tokens_per_call(target_lm, draft_lm, prompt, k: int, L: int, verifier: str, scheme: str = "iid",
                         sampling=None, delay: int = 0) -> float:
    """Expected tokens of the decoder's first step with ``verifier`` (exact: :func:`rule_block_law`; ``delay``: a
    delayed tree, as :func:`tree_optimum`)."""
    law = rule_block_law(target_lm, draft_lm, prompt, k, L, verifier, scheme, sampling, delay=delay)
    return float(sum(len(b) * w for b, w in law.items()))


RULES = {
    ("speculative", "iid"): 1,  # rule, scheme: None = any k, else the only k
    ("block", "iid"): 1,
    ("kseq", "iid"): None,
    ("rrs", "iid"): None,
    ("rrs_without_replacement", "without_replacement"): None,
    ("optimal", "iid"): None,
    ("traversal", "iid"): None,
    ("traversal", "without_replacement"): None,
    ("layer", "iid"): None,
    ("layer", "without_replacement"): None,
    ("spectr_gbv", "iid"): None,
    ("spectr_gbv", "without_replacement"): None,
    ("gbv", "iid"): None,
    ("hsd", "iid"): 1,
    ("hsd_code", "iid"): 1,
}
"""The decoder's rules compared with the optimum, with the k each takes (None: any)."""


__all__ = ["MAX_TREES", "MAX_VARIABLES", "PLAN_TOLERANCE", "RULES", "TreeOptimum", "TreePlan", "rule_block_law",
           "rule_tokens_per_call", "draft_rows", "solve_tree_lp", "solve_tree_plan", "transport_bound", "tree_law",
           "tree_optimum", "tree_plan"]
