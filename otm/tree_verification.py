r"""Whole-tree verification in numpy: block verification of a chain and traversal verification of a tree.

The decoder's tree rules (:mod:`otm.decode.tree_rules`, torch side) run this code on the target's
and the draft's laws at the tree's nodes; the exact law of what a rule emits from one draft tree is
computed by the same code here (:func:`block_law`, :func:`traversal_law`), float64 throughout. The
math, the sources and the proofs of exactness are in :mod:`otm.decode.tree_rules` (``Block``,
``Traversal``); this module is the arithmetic.

A *tree* here is any object with ``tokens`` (token of each node, node 0 the root), ``node_of``
(``[k, L + 1]``: the node of row j at depth t; numpy or torch) and ``rows_through`` (per node, the
rows whose draws at the node are its children's, in increasing order: on a delayed tree's shared path
row 0 alone), such as :class:`otm.decode.tree.DraftTree`; a tree's ``delay`` (default 0) is the depth of
the node where the rows branch (where ``root_without_replacement`` applies).

>>> import numpy as np
>>> tau, res = block_law(np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([[0.9, 0.1]]), np.array([0]))
>>> tau.tolist(), res[0].tolist()   # accept X_1 = 0 w.p. 0.5/0.9, else the residual (0, 1)
([0.4444444444444444, 0.5555555555555556], [0.0, 1.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .laws import OtmError


def _row(law) -> np.ndarray:
    """A law as a float64 numpy vector (numpy arrays, lists, CPU torch tensors)."""
    return np.asarray(law, dtype=np.float64).reshape(-1)


def block_law(targets, drafts, chain) -> tuple[np.ndarray, np.ndarray]:
    r"""Block verification's decision law and residuals (Sun et al., ICLR 2025; :class:`otm.decode.tree_rules.Block`).

    Parameters
    ----------
    targets : ``[gamma + 1, V]`` the target laws :math:`P_1..P_{\gamma+1}` (root, then each chain node).
    drafts : ``[gamma, V]`` the draft laws :math:`Q_1..Q_\gamma` the chain tokens were drawn from.
    chain : ``[gamma]`` the drafted tokens :math:`X_1..X_\gamma`.

    Returns
    -------
    (tau_law ``[gamma + 1]``, residuals ``[gamma + 1, V]``), float64: :math:`P(\tau = i)`, and the law
    of the token emitted after :math:`X_{\le i}` (row :math:`\gamma` is :math:`P_{\gamma+1}`), each row
    normalised; a row whose :math:`\tau` has probability 0 may have no mass (never drawn).
    """
    P = np.asarray(targets, dtype=np.float64)
    Q = np.asarray(drafts, dtype=np.float64)
    chain = np.asarray(chain, dtype=np.int64).reshape(-1)
    gamma = chain.size
    if P.ndim != 2 or Q.ndim != 2 or P.shape[0] != gamma + 1 or Q.shape[0] != gamma or gamma < 1:
        raise OtmError(f"block verification needs gamma + 1 target laws and gamma draft laws for a chain of "
                       f"{gamma}, got {P.shape[0] if P.ndim else 0} and {Q.shape[0] if Q.ndim else 0}")
    idx = np.arange(gamma)
    ratio = P[idx, chain] / Q[idx, chain]  # Q_i(X_i) > 0: X_i was drawn from Q_i
    p = np.ones(gamma + 1)
    for i in range(gamma):
        p[i + 1] = min(1.0, p[i] * ratio[i])  # p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i))
    res = np.maximum(p[:gamma, None] * P[:gamma] - Q, 0.0)  # (p_i P_{i+1} - Q_{i+1})_+, i = 0..gamma-1
    R = res.sum(-1)
    h = np.empty(gamma + 1)
    h[0] = 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        inner = R[1:] / (R[1:] + (1.0 - p[1:gamma]))  # this order keeps h <= 1 in floating point
    h[1:gamma] = np.where(R[1:] > 0, inner, 0.0)
    h[gamma] = p[gamma]
    after = np.append(np.cumprod((1.0 - h)[::-1])[::-1][1:], 1.0)  # prod_{j > i} (1 - h_j)
    tau_law = h * after
    mass = res.sum(-1, keepdims=True)
    rows = np.divide(res, mass, out=res.copy(), where=mass > 0)
    return tau_law, np.vstack([rows, P[gamma : gamma + 1]])


@dataclass
class VerificationTree:
    """The tree traversal verification walks: one vnode per draw of the draft tree.

    vnode 0 is the root; every other vnode is one draw at its parent (a token drawn from the
    parent's draft law) and names the draft-tree node of its prefix (``node``: where its target law
    sits). The children of a vnode are the draws of the rows through it, in row order. The first draw
    of a token carries the merged subtree of every row that drew that token; a later draw of the same
    token (a *duplicate*, possible with i.i.d. rows) is a leaf of its own.

    >>> from otm.decode.tree import DraftTree
    >>> vt = VerificationTree.from_tree(DraftTree.from_rows([[3, 1], [3, 2], [4, 1]], root_token=0))
    >>> vt.token, vt.parent, vt.node
    ([0, 3, 3, 4, 1, 2, 1], [-1, 0, 0, 0, 1, 1, 3], [0, 1, 1, 2, 3, 4, 5])
    >>> vt.children[0], vt.children[2]   # the second draw of 3 at the root is a leaf
    ([1, 2, 3], [])
    """

    node: list[int]  # draft-tree node of each vnode
    parent: list[int]  # parent vnode, -1 for the root
    token: list[int]
    depth: list[int]
    children: list[list[int]]  # in row order
    delay: int = 0  # depth of the vnode where the k rows branch (the root; deeper on a delayed tree)

    @classmethod
    def from_tree(cls, tree) -> "VerificationTree":
        tokens = [int(t) for t in tree.tokens]
        node, parent, token, depth, children = [0], [-1], [tokens[0]], [0], [[]]
        node_of = tree.node_of.tolist()  # [k, L + 1]
        L = int(tree.node_of.shape[1]) - 1
        order = [0]  # vnodes to expand, breadth first
        for v in order:
            if depth[v] == L:
                continue
            first: set[int] = set()
            for j in tree.rows_through[node[v]]:
                child = node_of[j][depth[v] + 1]
                vid = len(node)
                node.append(child)
                parent.append(v)
                token.append(tokens[child])
                depth.append(depth[v] + 1)
                children.append([])
                children[v].append(vid)
                if child not in first:  # the first draw of this token carries the merged subtree
                    first.add(child)
                    order.append(vid)
        return cls(node, parent, token, depth, children, int(getattr(tree, "delay", 0)))

    def path(self, v: int) -> list[int]:
        """vnodes from depth 1 down to ``v`` (empty for the root)."""
        out = []
        while v > 0:
            out.append(v)
            v = self.parent[v]
        return out[::-1]


class TraversalState:
    r"""The state of one traversal: per vnode a weight :math:`w`, a target law :math:`\tilde p`
    (the node's target law, replaced by its residual as its children are rejected) and the draft
    law :math:`\tilde q` its children were drawn from (the root's loses each rejected token when the
    root's drafts are without replacement). float64 numpy.

    ``target_of(node)`` and ``draft_of(node)`` give a draft-tree node's target law and the draft law
    its children were drawn from (anything :func:`numpy.asarray` reads, e.g. a CPU tensor).
    """

    def __init__(self, vt: VerificationTree, target_of, draft_of, *, root_without_replacement: bool):
        self.vt, self.target_of, self.draft_of = vt, target_of, draft_of
        self.root_without_replacement = root_without_replacement
        self.p: dict[int, np.ndarray] = {}  # vnode -> its current target law
        self.q: dict[int, np.ndarray] = {}  # vnode -> draft law of its children
        self.w = [1.0] * len(vt.node)
        self.alive = [list(c) for c in vt.children]
        self.touched = [False] * len(vt.node)  # whether p was replaced by a residual
        self.weigh(0)

    def law_p(self, v: int) -> np.ndarray:
        law = self.p.get(v)
        if law is None:
            law = self.p[v] = _row(self.target_of(self.vt.node[v]))
        return law

    def law_q(self, v: int) -> np.ndarray:
        law = self.q.get(v)
        if law is None:
            law = self.q[v] = _row(self.draft_of(self.vt.node[v]))
        return law

    def weigh(self, top: int) -> None:
        r"""Weights of the live vnodes below ``top``: :math:`w_c = \min(1, w_u \tilde p_u(x_c) / \tilde q_u(x_c))`."""
        stack = [top]
        while stack:
            u = stack.pop()
            kids = self.alive[u]
            if not kids:
                continue
            p, q = self.law_p(u), self.law_q(u)
            tokens = [self.vt.token[c] for c in kids]
            for c, a, b in zip(kids, (self.w[u] * p[tokens]).tolist(), q[tokens].tolist()):
                self.w[c] = min(1.0, a / b) if b > 0 else 0.0
            stack.extend(kids)

    def first_leaf(self) -> int:
        """The first live leaf in depth-first order (children in row order); the root when alone."""
        v = 0
        while self.alive[v]:
            v = self.alive[v][0]
        return v

    def reject(self, c: int) -> None:
        r"""Remove leaf ``c``; its parent u takes the residual
        :math:`\tilde p_u \leftarrow \mathrm{norm}((w_u \tilde p_u - \tilde q_u)_+)`,
        :math:`w_u \leftarrow R / (R + 1 - w_u)` (:math:`R` the residual's mass; 0 when :math:`R = 0`),
        then the weights below u are recomputed."""
        u = self.vt.parent[c]
        self.alive[u].remove(c)
        p, q, w = self.law_p(u), self.law_q(u), self.w[u]
        res = np.maximum(w * p - q, 0.0)
        R = float(res.sum())
        if R > 0:
            self.w[u] = R / (R + (1.0 - w))  # this order keeps w <= 1 in floating point
            self.p[u] = res / R
            self.touched[u] = True
        else:
            self.w[u] = 0.0
        if self.vt.depth[u] == self.vt.delay and self.root_without_replacement:  # next draw there: not this token
            q = q.copy()
            q[self.vt.token[c]] = 0.0
            rest = float(q.sum())
            self.q[u] = q / rest if rest > 0 else q
        self.weigh(u)


def traversal_law(tree, target_of, draft_of, *, root_without_replacement: bool = False) -> dict[tuple, float]:
    r"""Exact law of the block traversal verification emits from one draft tree: ``{block: probability}``.

    ``block`` = the accepted path's tokens and the token drawn after it. The rule's only random
    choices are the accept tests of successive leaves, and the state after a rejection does not
    depend on anything random, so the law is one pass: the leaf tried at step i is accepted with
    probability :math:`h_i` (its weight; 1 for the root), reached with probability
    :math:`\prod_{j < i}(1 - h_j)`. Runs the same :class:`TraversalState` as the decoder's rule.
    """
    vt = VerificationTree.from_tree(tree)
    state = TraversalState(vt, target_of, draft_of, root_without_replacement=root_without_replacement)
    law: dict[tuple, float] = {}
    reach = 1.0
    while True:
        v = state.first_leaf()
        h = 1.0 if v == 0 else state.w[v]
        if h > 0:
            path = tuple(vt.token[a] for a in vt.path(v))
            final = state.law_p(v)
            for y in np.flatnonzero(final > 0).tolist():
                law[path + (y,)] = law.get(path + (y,), 0.0) + reach * h * float(final[y])
        if v == 0 or h >= 1.0:
            return law
        reach *= 1.0 - h
        state.reject(v)


__all__ = ["TraversalState", "VerificationTree", "block_law", "traversal_law"]
