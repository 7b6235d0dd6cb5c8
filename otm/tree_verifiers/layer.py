r"""Layer verification: a lossless single-step verifier lifted to a draft tree, numpy float64 arithmetic.

Source: Jaeyoung Cha, Hanseul Cho & Chulhee Yun, "Layer Verification Accelerates Speculative Tree
Decoding", AdaptFM workshop at ICML 2026 (abstract:
https://hanseuljo.github.io/publication/layer-verification). **Only the abstract could be read**: the
paper's algorithm box, its score formula, its theorem and its equation numbers were not retrievable
from here, so the rule below is *our reconstruction* from the abstract's description ("assigns scores
to each tree node according to a single-step verification rule, coordinating acceptance mass across
nodes within each layer; then sweeps the draft tree layer by layer, selecting the accepted endpoint and
sampling the corrected token"; lossless whenever the single-step rule is lossless; with an optimal
single-step rule near-optimal both for one step with several candidates and for a single chain).
What the abstract leaves open, and what was chosen, is listed at the end. The decoder's rule is
:class:`otm.decode.tree_rules_layer.Layer`.

**Setting.** A draft tree (k rows of length L merged into a prefix tree), the target's law
:math:`p_u` at every node u (one target call) and the draft law :math:`q_u` u's children were drawn
from. A *single-step verifier* V is any rule that, given a target law p, a draft law q and drafts
:math:`\bar x` drawn by the scheme, outputs one token whose law averaged over the drafts is exactly p;
:math:`\pi(\cdot \mid p, q, \bar x)` is its exact conditional output law (``otm.verifiers.<name>.law``).

**Scores (top-down, one layer at a time).** Every node u gets a weight :math:`w_u \in [0, 1]`,
:math:`w_{root} = 1`. At u, extend the vocabulary by one symbol :math:`\bot` ("no acceptance here")
that the draft never proposes, and run V's law on the *sub-probability* target

.. math::

    \tilde p_u = w_u\, p_u + (1 - w_u)\,\delta_\bot,\qquad \tilde q_u = q_u + 0 \cdot \delta_\bot,\qquad
    \pi_u = \pi(\cdot \mid \tilde p_u, \tilde q_u, \bar x_u),

:math:`\bar x_u` the tokens of the rows through u at the next depth (with multiplicity, row order).
With u's distinct children :math:`c_1, c_2, \dots` (first occurrence order), :math:`a_c = \pi_u(x_c)`
the acceptance mass V puts on child c and :math:`r_u = \pi_u(\text{undrafted tokens}) + \pi_u(\bot)`,

.. math::

    w_{c_i} = \gamma_{c_i} = \frac{a_{c_i}}{a_{c_i} + \sum_{j > i} a_{c_j} + r_u}
    \quad\Big(= \frac{a_{c_i}}{1 - \sum_{j<i} a_{c_j}}\Big),

the acceptance mass of :math:`c_i` given that no earlier sibling took it. A leaf (depth L) has no
drafts: V outputs :math:`\tilde p_u` itself.

**Why it is lossless** (by induction from the leaves; the same lemma as traversal verification's,
:class:`otm.decode.tree_rules.Traversal`, with any V in place of recursive rejection sampling). Let
:math:`S(u)` return either :math:`\bot` or a block continuation after u. Claim: for any weight w and
any number of rows through u, averaged over u's subtree, :math:`S(u)` returns :math:`\bot` with
probability :math:`1 - w` and otherwise a continuation whose first token follows :math:`p_u` and which
is a stopped target stream after it. Construction of :math:`S(u)`: run every child's :math:`S(c)`
(independent given u's drafts: disjoint rows); child c is *alive* if :math:`S(c) \ne \bot` (probability
:math:`w_c = \gamma_c` given the drafts, by induction). Enter the first alive child in order; if none is
alive, draw z from :math:`\pi_u` restricted to the undrafted tokens and :math:`\bot`, renormalised:
emit z and stop if z is a token, return :math:`\bot` if :math:`z = \bot`. Then, given the drafts,
:math:`P(\text{enter } c_i) = \gamma_{c_i} \prod_{j<i} (1 - \gamma_{c_j}) = a_{c_i}` and the rest has
probability :math:`1 - \sum a = r_u`, so the first symbol after u has law :math:`\pi_u`, and averaged
over the drafts :math:`\tilde p_u` (V is lossless): :math:`\bot` w.p. :math:`1 - w`, token x w.p.
:math:`w\,p_u(x)`. Given that c is entered, :math:`S(c)`'s output is distributed as given
":math:`S(c)` alive" (entering depends on c's subtree only through that event), a stopped target stream
after c by induction. At the root w = 1, so :math:`S(root)` never returns :math:`\bot` and its block
is a stopped target stream: the step is lossless. The proof needs of V only that it be lossless for the
scheme of the drafts at each node (``iid``: the m rows through u draw m i.i.d. tokens from
:math:`q_u`; ``without_replacement``: the root's k distinct tokens, then one row per node) and for any
target law, including one with mass on a token the draft never proposes (:math:`\bot`).

**The sweep (what the decoder does).** Given the tree, :math:`S(c)`'s alive probability is
:math:`\omega_c` (leaves: :math:`\omega = w`; otherwise
:math:`\omega_u = 1 - (1 - \rho_u)\prod_c (1 - \omega_c)`, :math:`\rho_u` the share of undrafted
tokens in :math:`r_u`). Conditioned on u being alive, the walk goes to child :math:`c_i` with
probability :math:`\omega_{c_i}\prod_{j<i}(1 - \omega_{c_j}) / \omega_u` or stops at u with probability
:math:`\rho_u \prod_c (1 - \omega_c)/\omega_u`, drawing the correction token from
:math:`\pi_u` restricted to the undrafted tokens; at a leaf it emits the target's own draw. One choice
per layer from the root down: the accepted endpoint, then the corrected token (:func:`layer_law` gives
the exact law of the block; the decoder draws the same choices through its door of chance).

**Special cases (checked in the tests).** On a chain (k = 1) with speculative sampling as V,
:math:`w_i = \min(1, w_{i-1} p(x_i)/q(x_i))` and the rule is block verification (Sun et al., ICLR 2025)
exactly. With one layer (L = 1) it is V. With recursive rejection sampling as V it is traversal
verification's law (Weng et al., NeurIPS 2025). Setting every :math:`w_c = 1` (and entering an alive
child with probability :math:`\gamma_c`) gives SpecTr's level-by-level walk with V.

**Not determined by the abstract; chosen here.** (1) The *score* of a node: taken as
:math:`\gamma_c` above, the V-acceptance mass of the child conditioned on the earlier siblings, so
that the tight choice (no discarded acceptance) is made; (2) how the mass of a rejected layer is
handed on: by V's own residual on the :math:`\bot`-extended target (the abstract says only that mass
is "coordinated within each layer"); (3) the order of siblings: first occurrence among the rows; (4)
for ``without_replacement``, which V is used: a without-replacement rule at the root, speculative
sampling below it (every deeper node has one row), as the decoder's level-by-level rules do. Whether
the paper's LV coincides with this rule is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..laws import OtmError
from ..verifiers import VERIFIERS

STEPS = {
    "iid": ("optimal", "kseq", "rrs", "speculative"),
    "without_replacement": ("optimal_embedded", "kseq_without_replacement", "rrs_without_replacement",
                            "optimal_without_replacement", "speculative"),
}
"""Single-step verifiers (names of :data:`otm.verifiers.VERIFIERS`) Layer may lift, per scheme, at the root."""

ALIASES = {"without_replacement": {"optimal": "optimal_embedded", "kseq": "kseq_without_replacement",
                                   "rrs": "rrs_without_replacement"}}
"""An i.i.d. rule's name under ``without_replacement`` means its without-replacement counterpart (as in
the decoder: ``optimal_embedded`` is the decoder's optimal-type rule for that scheme; the exact optimum
``optimal_without_replacement`` enumerates draft sets and fits small V only)."""


MEMO_FLOATS = 8_000_000
"""Most float64 entries (64 MB) the memo of :func:`layer_plan` keeps, then it starts afresh: thousands of
laws on toy vocabularies (the exact mode replays the same trees), a few dozen on a real one."""


def step_laws(step: str, scheme: str):
    """``(root law, deep law, resolved name)``: the exact conditional laws ``law(target, draft, drafts) -> [V]``
    of the single-step verifier ``step`` at the root and below it, for ``scheme``."""
    if scheme not in STEPS:
        raise OtmError(f"unknown scheme {scheme!r}: layer verification takes iid or without_replacement")
    name = ALIASES.get(scheme, {}).get(step, step)
    if name not in STEPS[scheme]:
        raise OtmError(f"layer verification cannot lift {step!r} for the {scheme} scheme: choose one of "
                       f"{', '.join(STEPS[scheme])}")
    root = VERIFIERS[name].module.law
    if scheme == "without_replacement":  # one row through every node below the root
        return root, VERIFIERS["speculative"].module.law, name
    return root, root, name


def _row(law) -> np.ndarray:
    return np.asarray(law, dtype=np.float64).reshape(-1)


@dataclass
class LayerPlan:
    r"""The scores of one tree (module docstring), float64 numpy, per draft-tree node.

    ``w``: the weight :math:`w_u`; ``kids``: distinct children in order; ``pi``: :math:`\pi_u` over
    V + 1 symbols (the last is :math:`\bot`; None at a leaf); ``omega``: the probability, given the
    tree, that u's subtree accepts at or below u.
    """

    tree: object
    w: list[float]
    kids: list[list[int]]
    pi: list[np.ndarray | None]
    omega: list[float]
    target: dict = field(default_factory=dict)  # node -> p_u (those read)

    def decision(self, u: int) -> np.ndarray:
        r"""Law of the next move at an alive node u with children: ``[child 0, child 1, ..., stop at u]``,
        :math:`\omega_{c_i}\prod_{j<i}(1-\omega_{c_j})` and :math:`\rho_u \prod_c (1 - \omega_c)`, normalised."""
        out = []
        dead = 1.0  # prod_{j < i} (1 - omega_{c_j})
        for c in self.kids[u]:
            out.append(dead * self.omega[c])
            dead *= 1.0 - self.omega[c]
        out.append(dead * self._rho(u))
        law = np.array(out)
        total = law.sum()
        if not total > 0:
            raise OtmError(f"layer verification reached node {u}, whose subtree cannot accept: report this law")
        return law / total

    def correction(self, u: int) -> np.ndarray:
        r"""Law of the corrected token when the walk stops at u: :math:`\pi_u` on the undrafted tokens, normalised."""
        pi = self.pi[u][:-1].copy()
        pi[[int(self.tree.tokens[c]) for c in self.kids[u]]] = 0.0
        total = pi.sum()
        if not total > 0:
            raise OtmError(f"layer verification stopped at node {u} with no undrafted mass: report this law")
        return pi / total

    def _rho(self, u: int) -> float:
        real, bottom = _undrafted(self.pi[u], [int(self.tree.tokens[c]) for c in self.kids[u]])
        rest = real + bottom
        return real / rest if rest > 0 else 0.0


def _undrafted(pi: np.ndarray, drafted: list[int]) -> tuple[float, float]:
    """``(mass of the undrafted tokens, mass of bottom)`` of a law over V + 1 symbols, summed entry by entry
    (not as 1 minus the drafted mass, which leaves rounding crumbs where there is no mass)."""
    real = pi[:-1].copy()
    real[drafted] = 0.0
    return float(real.sum()), float(pi[-1])


def extended_target(p: np.ndarray, w: float) -> np.ndarray:
    r""":math:`\tilde p = w\,p + (1 - w)\,\delta_\bot` over V + 1 symbols (:math:`\bot` last).

    >>> extended_target(np.array([0.5, 0.5]), 0.5).tolist()
    [0.25, 0.25, 0.5]
    """
    return np.append(w * p, 1.0 - w)


def sibling_weights(a: list[float], tail: float) -> list[float]:
    r"""The children's weights from their acceptance masses ``a`` (in order) and the rest ``tail``
    (undrafted tokens and :math:`\bot`): :math:`\gamma_i = a_i / (a_i + \sum_{j>i} a_j + \text{tail})`,
    the mass of child i given that no earlier sibling took it.

    >>> sibling_weights([0.25, 0.25], 0.5)
    [0.25, 0.3333333333333333]
    """
    out = []
    for i, ai in enumerate(a):
        rest = ai + sum(a[i + 1:]) + tail
        out.append(min(1.0, ai / rest) if rest > 0 else 0.0)
    return out


def layer_plan(tree, target_of, draft_of, root_law, deep_law, memo: dict | None = None) -> LayerPlan:
    r"""Weights, single-step laws and alive probabilities of every node of ``tree`` (module docstring).

    ``tree``: a :class:`otm.decode.tree.DraftTree` (``tokens``, ``parent``, ``depth``, ``node_of``,
    ``rows_through``, ``children``); ``target_of(node)`` / ``draft_of(node)``: the target's law at a node
    and the draft law its children were drawn from (anything :func:`numpy.asarray` reads);
    ``root_law`` / ``deep_law``: the single-step verifier's exact law at the root / below it; ``memo``: a
    dict keeping the single-step laws already computed (the exact mode replays the same trees).
    """
    n = len(tree.depth)
    tokens = [int(t) for t in tree.tokens]
    node_of = tree.node_of.tolist()
    w = [1.0] * n
    pi: list[np.ndarray | None] = [None] * n
    kids = [list(c) for c in tree.children]
    target = {}
    for u in range(n):  # breadth first: a parent's weight is set before its children are read
        if not kids[u]:
            continue
        p = target[u] = _row(target_of(u))
        q = _row(draft_of(u))
        depth = tree.depth[u]
        drafts = np.array([tokens[node_of[j][depth + 1]] for j in tree.rows_through[u]], dtype=np.int64)
        p_ext = extended_target(p, w[u])
        q_ext = np.append(q, 0.0)  # the draft never proposes "bottom"
        law = root_law if depth == getattr(tree, "delay", 0) else deep_law  # the k draws: root or branching node
        key = (id(law), p_ext.tobytes(), q_ext.tobytes(), drafts.tobytes())
        found = None if memo is None else memo.get(key)
        if found is None:
            found = np.asarray(law(p_ext, q_ext, drafts), dtype=np.float64)
            if memo is not None:
                if (len(memo) + 1) * found.size > MEMO_FLOATS:
                    memo.clear()
                memo[key] = found
        pi[u] = found
        a = [float(pi[u][tokens[c]]) for c in kids[u]]
        tail = sum(_undrafted(pi[u], [tokens[c] for c in kids[u]]))  # undrafted tokens and bottom
        for c, gamma in zip(kids[u], sibling_weights(a, tail)):
            w[c] = gamma
    omega = [0.0] * n
    plan = LayerPlan(tree, w, kids, pi, omega, target)
    for u in range(n - 1, -1, -1):  # leaves first
        if not kids[u]:
            omega[u] = w[u]
            continue
        dead = 1.0
        for c in kids[u]:
            dead *= 1.0 - omega[c]
        omega[u] = 1.0 - dead * (1.0 - plan._rho(u))
    return plan


def layer_law(tree, target_of, draft_of, root_law, deep_law) -> dict[tuple, float]:
    r"""Exact law of the block layer verification emits from one draft tree: ``{block: probability}``
    (the accepted path's tokens, then the corrected or bonus token). Runs the decoder's arithmetic
    (:func:`layer_plan`, :meth:`LayerPlan.decision`, :meth:`LayerPlan.correction`)."""
    plan = layer_plan(tree, target_of, draft_of, root_law, deep_law)
    out: dict[tuple, float] = {}

    def add(block, mass, law):
        for y in np.flatnonzero(law > 0).tolist():
            out[block + (y,)] = out.get(block + (y,), 0.0) + mass * float(law[y])

    stack = [(0, (), 1.0)]
    while stack:
        u, path, mass = stack.pop()
        if not plan.kids[u]:  # a leaf, or no drafts at all: the target's own draw
            p = _row(target_of(u))
            add(path, mass, p / p.sum())
            continue
        dec = plan.decision(u)
        for c, share in zip(plan.kids[u], dec[:-1]):
            if share > 0:
                stack.append((c, path + (int(tree.tokens[c]),), mass * float(share)))
        if dec[-1] > 0:
            add(path, mass * float(dec[-1]), plan.correction(u))
    return out


def level_by_level_law(tree, target_of, draft_of, root_law, deep_law) -> dict[tuple, float]:
    r"""Exact block law of SpecTr's level-by-level walk with the same single-step verifier (the decoder's
    :class:`otm.decode.tree_rules.LevelByLevel`), for comparison: at u emit :math:`y \sim \pi(\cdot \mid
    p_u, q_u, \bar x_u)`, go on to y's child if y was drafted, else stop; the target's draw at a leaf."""
    tokens = [int(t) for t in tree.tokens]
    node_of = tree.node_of.tolist()
    out: dict[tuple, float] = {}
    stack = [(0, (), 1.0)]
    while stack:
        u, path, mass = stack.pop()
        p = _row(target_of(u))
        kids = tree.children[u]
        if not kids:
            for y in np.flatnonzero(p > 0).tolist():
                out[path + (y,)] = out.get(path + (y,), 0.0) + mass * float(p[y] / p.sum())
            continue
        drafts = np.array([tokens[node_of[j][tree.depth[u] + 1]] for j in tree.rows_through[u]], dtype=np.int64)
        pi = np.asarray((root_law if tree.depth[u] == getattr(tree, "delay", 0) else deep_law)(p, _row(draft_of(u)), drafts), dtype=np.float64)
        child = {tokens[c]: c for c in kids}
        for y in np.flatnonzero(pi > 0).tolist():
            if y in child:
                stack.append((child[y], path + (y,), mass * float(pi[y])))
            else:
                out[path + (y,)] = out.get(path + (y,), 0.0) + mass * float(pi[y])
    return out


def tokens_per_call(target, draft, k: int, L: int, scheme: str, block_law_of) -> float:
    r"""Expected tokens of one step, :math:`E|B|`, over every ordered draft tuple of the step
    (:func:`otm.analysis.tree_optimum.draft_rows`), exact: ``target(prefix)``, ``draft(prefix)`` the laws
    after the context; ``block_law_of(tree, target_of, draft_of)`` the rule's block law given the tree
    (:func:`layer_law`, :func:`level_by_level_law` or :func:`otm.tree_verification.traversal_law`, bound)."""
    from ..analysis.tree_optimum import draft_rows
    from ..decode.tree import DraftTree

    total = 0.0
    for rows, pr in draft_rows(draft, k, L, scheme):
        tree = DraftTree.from_rows(rows, root_token=0)
        prefix = {0: ()}
        for n in range(1, tree.size):
            prefix[n] = prefix[int(tree.parent[n])] + (int(tree.tokens[n]),)
        law = block_law_of(tree, lambda n: target(prefix[n]), lambda n: draft(prefix[n]))
        total += pr * sum(len(b) * w for b, w in law.items())
    return total


__all__ = ["ALIASES", "MEMO_FLOATS", "STEPS", "LayerPlan", "extended_target", "layer_law", "layer_plan",
           "level_by_level_law", "sibling_weights", "step_laws", "tokens_per_call"]
