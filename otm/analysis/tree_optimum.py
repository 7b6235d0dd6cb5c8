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


def _count_tuples(draft, k: int, L: int, scheme: str) -> int:
    q0 = draft(())
    roots = [int(x) for x in np.flatnonzero(q0 > 0)]
    conts = {x: sum(1 for _ in _paths(draft, (x,), L - 1)) for x in roots}
    if scheme == "iid":
        return sum(conts.values()) ** k
    kk = min(k, len(roots))
    return sum(int(np.prod([conts[x] for x in combo])) for combo in itertools.permutations(roots, kk))


def draft_rows(draft, k: int, L: int, scheme: str = "iid"):
    """``(rows, probability)`` for every ordered tuple of the k draft rows of one step (mass > 0).

    ``draft(prefix) -> [V]`` is the draft's processed law after the context and ``prefix``.
    ``iid``: k i.i.d. rows of length L. ``without_replacement``: the k root tokens by successive
    sampling without replacement (k cut to the support, as the decoder does; each draw renormalised
    by the mass of the tokens left, summed, not 1 minus the mass taken, which loses tiny masses),
    each row continued i.i.d. from the draft.
    """
    if scheme == "iid":
        rows = list(_paths(draft, (), L))
        for combo in itertools.product(rows, repeat=k):
            yield [r for r, _ in combo], float(np.prod([w for _, w in combo]))
        return
    q0 = draft(())
    roots = [int(x) for x in np.flatnonzero(q0 > 0)]
    conts = {x: list(_paths(draft, (x,), L - 1)) for x in roots}
    for combo in itertools.permutations(roots, min(k, len(roots))):
        w_root, left = 1.0, list(roots)
        for x in combo:  # successive sampling: q(x) / (mass of the tokens not drawn yet)
            w_root *= float(q0[x]) / float(q0[left].sum())
            left.remove(x)
        for tails in itertools.product(*(conts[x] for x in combo)):
            yield [(x,) + t for x, (t, _) in zip(combo, tails)], w_root * float(np.prod([w for _, w in tails]))


def tree_law(draft, k: int, L: int, scheme: str = "iid") -> dict[frozenset, float]:
    """Law of the node set (all non-root prefixes of the rows) of one step's draft tree
    (the ordered row tuples of :func:`draft_rows`, merged)."""
    out: dict[frozenset, float] = {}
    for rows, w in draft_rows(draft, k, L, scheme):
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


def solve_tree_lp(target, draft, k: int, L: int, scheme: str = "iid", *, max_trees: int = MAX_TREES,
                  max_variables: int = MAX_VARIABLES) -> TreeOptimum:
    """:func:`tree_optimum` on laws ``prefix -> [V]`` (float64) instead of models."""
    start = time.perf_counter()
    if scheme not in SCHEMES:
        raise OtmError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    for name, v in (("k", k), ("L", L)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise OtmError(f"{name} must be a whole number >= 1, got {v!r}")
    V = int(np.asarray(target(())).size)
    n_tuples = _count_tuples(draft, k, L, scheme)
    if n_tuples > max_trees:
        raise OtmError(f"the tree LP at V = {V}, k = {k}, L = {L} ({scheme}) would enumerate {n_tuples:,} draft "
                       f"tuples, more than max_trees = {max_trees:,}: lower V, k or L")
    law = tree_law(draft, k, L, scheme)
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
    cost = np.array(cost)
    value, y, x, A = _solve(cost, np.array(R), np.array(C), np.array(X), rhs, n_rows)
    plan: dict[tuple, float] = {}
    for b, w in zip(blocks, x):
        plan[b] = plan.get(b, 0.0) + max(float(w), 0.0)
    bound = _certified_bound(A, cost, rhs, y, np.arange(len(sets)), np.array(col_group))
    relax = transport_bound(law, target, L, pref)
    return TreeOptimum(value, bound, relax, V, k, L, scheme, len(sets), j, n_rows, time.perf_counter() - start,
                       plan)


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
                 max_trees: int = MAX_TREES, max_variables: int = MAX_VARIABLES) -> TreeOptimum:
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
    """
    from ..decode.toy import model_law

    return solve_tree_lp(model_law(target_lm, prompt, sampling), model_law(draft_lm, prompt, sampling), k, L, scheme,
                         max_trees=max_trees, max_variables=max_variables)


# -- the decoder's rules, exactly ----------------------------------------------------------


class _FirstStep(Exception):
    def __init__(self, tokens):
        self.tokens = list(tokens)


def rule_block_law(target_lm, draft_lm, prompt, k: int, L: int, verifier: str, scheme: str = "iid", sampling=None,
                   max_runs: int = 200_000) -> dict[tuple, float]:
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
                               sampling=sampling, max_new_tokens=L + 1, chance=door, on_tokens=stop,
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
                         sampling=None) -> float:
    """Expected tokens of the decoder's first step with ``verifier`` (exact: :func:`rule_block_law`)."""
    law = rule_block_law(target_lm, draft_lm, prompt, k, L, verifier, scheme, sampling)
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
}
"""The decoder's rules compared with the optimum, with the k each takes (None: any)."""


__all__ = ["MAX_TREES", "MAX_VARIABLES", "RULES", "TreeOptimum", "rule_block_law", "rule_tokens_per_call",
           "draft_rows", "solve_tree_lp", "transport_bound", "tree_law", "tree_optimum"]
