r"""Tree verification rules: what the decoder emits from one draft tree and the target's laws on it.

A *tree rule* sees the whole draft tree of one step, the target's law at every node (one target
pass) and the draft law each node's children were drawn from, and returns the emitted tokens and
the accepted path. Every random choice goes through the decoder's door of chance
(:mod:`otm.decode.chance`), so the decoder's exact mode enumerates a tree rule like any other.

* :class:`LevelByLevel`: SpecTr's walk (Sun et al., NeurIPS 2023, Theorem 2) with a token-level
  verifier at each node: verify the children of the current node, emit the verifier's token y,
  move to y's node if y is a child, else stop; at a leaf emit the target's own draw.
* :class:`Block`: block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami & Suresh,
  "Block Verification Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444) of a single
  draft chain (k = 1). With the chain :math:`X_1..X_\gamma`, the target laws
  :math:`P_i = p(\cdot \mid c, X_{<i})` (:math:`i = 1..\gamma+1`) and the draft laws
  :math:`Q_i = q(\cdot \mid c, X_{<i})` the chain was drawn from,

  .. math::

      p_0 = 1,\qquad p_i = \min\Big(1,\ p_{i-1} \frac{P_i(X_i)}{Q_i(X_i)}\Big),\qquad
      R_i = \sum_x \big(p_i P_{i+1}(x) - Q_{i+1}(x)\big)_+,\\
      h_0 = 1,\quad h_i = \frac{R_i}{R_i + 1 - p_i}\ (1 \le i < \gamma;\ 0 \text{ when } R_i = 0),\quad h_\gamma = p_\gamma,

  independent :math:`\eta_i \sim U(0, 1)` and :math:`\tau = \max\{i : \eta_i \le h_i\}`, so
  :math:`P(\tau = i) = h_i \prod_{j > i} (1 - h_j)`; emit :math:`X_1..X_\tau` and then
  :math:`y \sim P_{\gamma+1}` if :math:`\tau = \gamma`, else
  :math:`y \sim \mathrm{norm}\big((p_\tau P_{\tau+1} - Q_{\tau+1})_+\big)`. The decoder draws
  :math:`\tau` from its law directly (one choice instead of :math:`\gamma` uniforms: the same law).
  It is lossless and, among rules that see only the on-path probabilities, maximises the expected
  number of tokens per target call; on a chain it is never worse than token-by-token
  verification. The exact law of the emitted block is :func:`block_law`; the decoder's exact mode
  checks the whole decoder with it against the target's law of the token stream
  (``tests/test_tree_rules.py``).
* :class:`Traversal`: traversal verification (Weng, Hu, Chen, Liu, Mei, Qiu, Tian & Shi,
  "Traversal Verification for Speculative Tree Decoding", NeurIPS 2025, arXiv 2505.12398): the
  tree is verified from the leaves up, the first leaf in depth-first order first, so a rejected
  branch hands its mass back to its parent and the next branch is tried with the parent's
  residual; on a chain it is block verification. See :class:`Traversal` for the rule, the tree it
  runs on (duplicate draws) and the proof of exactness for both draft schemes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..laws import OtmError
from .tree import DraftTree


class TreeRule:
    """One step's verification of a whole draft tree.

    :meth:`walk` gets the decoder (for ``node_draft_law(tree, node, drafts)``, ``bonus(tree, node,
    target_laws)``, ``chance`` and ``stats``), the tree, the drafts and the target laws ``[N, V]`` at
    every node (node 0 the root), and returns ``(emitted tokens, accepted path nodes, depth 1 first)``.
    """

    name = "tree rule"

    def walk(self, dec, tree, drafts, target_laws) -> tuple[list[int], list[int]]:
        raise NotImplementedError


class LevelByLevel(TreeRule):
    """SpecTr's level-by-level walk with a token-level verifier (one at the root, one below it)."""

    def __init__(self, root_verifier, deep_verifier, name: str):
        self.root_verifier, self.deep_verifier, self.name = root_verifier, deep_verifier, name

    def walk(self, dec, tree, drafts, target_laws):
        node, emitted, path = 0, [], []
        while True:
            kids = tree.children[node]
            if not kids:  # a leaf (or no drafts at all): the target's own draw (bonus token)
                emitted.append(dec.bonus(tree, node, target_laws))
                return emitted, path
            p_node = target_laws[node : node + 1]  # [1, V]
            depth = tree.depth[node]
            tokens = drafts.rows[tree.rows_through[node], depth][None]  # [1, m]: the children's tokens with multiplicity
            q_node = dec.node_draft_law(tree, node, drafts).to(p_node.device)  # [1, V]
            verify = self.root_verifier if depth == 0 else self.deep_verifier
            y = dec.chance.verify(verify, p_node, q_node, tokens)
            emitted.append(y)
            dec.stats.verified_by_depth[depth] += 1
            child = next((c for c in kids if int(tree.tokens[c]) == y), None)
            if child is None:  # y is the correction token
                return emitted, path
            dec.stats.accepted_by_depth[depth] += 1
            node = child
            path.append(node)


def block_law(targets: torch.Tensor, drafts: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Block verification's decision law and residuals (module docstring).

    Parameters
    ----------
    targets : ``[gamma + 1, V]`` the target laws :math:`P_1..P_{\gamma+1}` (root, then each chain node).
    drafts : ``[gamma, V]`` the draft laws :math:`Q_1..Q_\gamma` the chain tokens were drawn from.
    chain : ``[gamma]`` int64, the drafted tokens :math:`X_1..X_\gamma`.

    Returns
    -------
    (tau_law ``[gamma + 1]``, residuals ``[gamma + 1, V]``): :math:`P(\tau = i)`, and the law of the
    token emitted after :math:`X_{\le i}` (row :math:`\gamma` is :math:`P_{\gamma+1}`), each row
    normalised; a row whose :math:`\tau` has probability 0 may have no mass (never drawn).

    >>> t = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    >>> tau, res = block_law(t, torch.tensor([[0.9, 0.1]], dtype=torch.float64), torch.tensor([0]))
    >>> tau.tolist(), res[0].tolist()   # accept X_1 = 0 w.p. 0.5/0.9, else the residual (0, 1)
    ([0.4444444444444444, 0.5555555555555556], [0.0, 1.0])
    """
    gamma = chain.numel()
    if targets.shape[0] != gamma + 1 or drafts.shape[0] != gamma or gamma < 1:
        raise OtmError(f"block verification needs gamma + 1 target laws and gamma draft laws for a chain of "
                       f"{gamma}, got {targets.shape[0]} and {drafts.shape[0]}")
    dt = torch.promote_types(targets.dtype, torch.float32)
    P, Q = targets.to(dt), drafts.to(dt).to(targets.device)
    idx = torch.arange(gamma, device=P.device)
    ratio = P[idx, chain] / Q[idx, chain]  # [gamma]: Q_i(X_i) > 0, X_i was drawn from Q_i
    p = [torch.ones((), dtype=dt, device=P.device)]
    for i in range(gamma):
        p.append(torch.clamp(p[-1] * ratio[i], max=1.0))  # p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i))
    p = torch.stack(p)  # [gamma + 1]
    res = torch.clamp(p[:gamma, None] * P[:gamma] - Q, min=0.0)  # [gamma, V]: (p_i P_{i+1} - Q_{i+1})_+, i = 0..gamma-1
    R = res.sum(-1)  # [gamma]
    h = torch.empty(gamma + 1, dtype=dt, device=P.device)
    h[0] = 1.0
    inner = R[1:] / (R[1:] + (1.0 - p[1:gamma]))  # i = 1..gamma-1; the order keeps h <= 1 in floating point
    h[1:gamma] = torch.where(R[1:] > 0, inner, torch.zeros_like(inner))
    h[gamma] = p[gamma]
    survive = torch.cumprod(torch.flip(1.0 - h, [0]), 0)  # survive[j] = prod of (1 - h) over the last j + 1 entries
    after = torch.cat([torch.flip(survive, [0])[1:], torch.ones(1, dtype=dt, device=P.device)])  # prod_{j > i} (1 - h_j)
    tau_law = h * after  # [gamma + 1]
    mass = res.sum(-1, keepdim=True)
    rows = torch.where(mass > 0, res / torch.where(mass > 0, mass, torch.ones_like(mass)), res)
    residuals = torch.cat([rows, P[gamma : gamma + 1]])  # [gamma + 1, V]
    return tau_law, residuals


class Block(TreeRule):
    """Block verification of a single draft chain (k = 1); see the module docstring."""

    name = "block"

    def walk(self, dec, tree, drafts, target_laws):
        if not tree.children[0]:  # no drafts this step: the target's own draw
            return [dec.bonus(tree, 0, target_laws)], []
        chain_nodes = [0]
        while tree.children[chain_nodes[-1]]:
            kids = tree.children[chain_nodes[-1]]
            if len(kids) != 1:
                raise OtmError("block verification takes a single draft chain (k = 1): use a level-by-level "
                               "verifier for trees")
            chain_nodes.append(kids[0])
        gamma = len(chain_nodes) - 1
        chain = torch.tensor([int(tree.tokens[n]) for n in chain_nodes[1:]], device=target_laws.device)  # [gamma]
        q = torch.cat([dec.node_draft_law(tree, n, drafts).to(target_laws.device) for n in chain_nodes[:-1]])  # [gamma, V]
        tau_law, residuals = block_law(target_laws[chain_nodes], q, chain)
        tau = dec.chance.index(tau_law[None])
        for depth in range(min(tau + 1, gamma)):  # depths reached: 0..tau (as level by level would count them)
            dec.stats.verified_by_depth[depth] += 1
        for depth in range(tau):
            dec.stats.accepted_by_depth[depth] += 1
        emitted = chain[:tau].tolist()
        if tau == gamma:
            emitted.append(dec.bonus(tree, chain_nodes[-1], target_laws))
        else:
            if not bool(residuals[tau].sum() > 0):
                raise OtmError(f"block verification drew tau = {tau} whose residual has no mass: report this law")
            emitted.append(dec.chance.index(residuals[tau : tau + 1]))
        return emitted, chain_nodes[1 : tau + 1]


# -- traversal verification ----------------------------------------------------------------------


@dataclass
class VerificationTree:
    """The tree traversal verification walks: one vnode per draw of the draft tree.

    vnode 0 is the root; every other vnode is one draw at its parent (a token drawn from the
    parent's draft law) and names the :class:`~otm.decode.tree.DraftTree` node of its prefix
    (``node``: where its target law sits in the target pass). The children of a vnode are the draws
    of the rows through it, in row order. The first draw of a token carries the merged subtree of
    every row that drew that token; a later draw of the same token (a *duplicate*, possible with
    i.i.d. rows) is a leaf of its own (see :class:`Traversal` for why this is exact).

    >>> from otm.decode.tree import DraftTree
    >>> vt = VerificationTree.from_tree(DraftTree.from_rows([[3, 1], [3, 2], [4, 1]], root_token=0))
    >>> vt.token, vt.parent, vt.node
    ([0, 3, 3, 4, 1, 2, 1], [-1, 0, 0, 0, 1, 1, 3], [0, 1, 1, 2, 3, 4, 5])
    >>> vt.children[0], vt.children[2]   # the second draw of 3 at the root is a leaf
    ([1, 2, 3], [])
    """

    node: list[int]  # DraftTree node of each vnode
    parent: list[int]  # parent vnode, -1 for the root
    token: list[int]
    depth: list[int]
    children: list[list[int]]  # in row order

    @classmethod
    def from_tree(cls, tree: DraftTree) -> "VerificationTree":
        node, parent, token, depth, children = [0], [-1], [int(tree.tokens[0])], [0], [[]]
        node_of = tree.node_of.tolist()  # [k, L + 1]
        L = tree.node_of.shape[1] - 1
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
                token.append(int(tree.tokens[child]))
                depth.append(depth[v] + 1)
                children.append([])
                children[v].append(vid)
                if child not in first:  # the first draw of this token carries the merged subtree
                    first.add(child)
                    order.append(vid)
        return cls(node, parent, token, depth, children)

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
    root's drafts are without replacement). Decisions in float64.

    ``target_of(node) -> [V]`` and ``draft_of(node) -> [V]`` give a DraftTree node's target law and
    the draft law its children were drawn from.
    """

    def __init__(self, vt: VerificationTree, target_of, draft_of, *, root_without_replacement: bool):
        self.vt, self.target_of, self.draft_of = vt, target_of, draft_of
        self.root_without_replacement = root_without_replacement
        self.p: dict[int, torch.Tensor] = {}  # vnode -> residual target law, once its first child is rejected
        self.q: dict[int, torch.Tensor] = {}  # vnode -> draft law of its children
        self.w = [1.0] * len(vt.node)
        self.alive = [list(c) for c in vt.children]
        self.touched = [False] * len(vt.node)  # whether p was replaced by a residual
        self.weigh(0)

    def law_p(self, v: int) -> torch.Tensor:
        law = self.p.get(v)
        if law is None:
            law = self.p[v] = self.target_of(self.vt.node[v]).to(torch.float64)
        return law

    def law_q(self, v: int) -> torch.Tensor:
        law = self.q.get(v)
        if law is None:
            law = self.q[v] = self.draft_of(self.vt.node[v]).to(torch.float64)
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
            tokens = torch.tensor([self.vt.token[c] for c in kids], device=p.device)
            num, den = (self.w[u] * p[tokens]).tolist(), q[tokens].tolist()
            for c, a, b in zip(kids, num, den):
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
        res = torch.clamp(w * p - q, min=0.0)
        R = float(res.sum())
        if R > 0:
            self.w[u] = R / (R + (1.0 - w))  # this order keeps w <= 1 in floating point
            self.p[u] = res / R
            self.touched[u] = True
        else:
            self.w[u] = 0.0
        if u == 0 and self.root_without_replacement:  # the next root draw excludes the rejected token
            q = q.clone()
            q[self.vt.token[c]] = 0.0
            rest = float(q.sum())
            self.q[u] = q / rest if rest > 0 else q
        self.weigh(u)


def traversal_law(tree: DraftTree, target_of, draft_of, *, root_without_replacement: bool = False
                  ) -> dict[tuple, float]:
    r"""Exact law of the block traversal verification emits from one draft tree: ``{block: probability}``.

    ``block`` = the accepted path's tokens and the token drawn after it. The rule's only random
    choices are the accept tests of successive leaves, and the state after a rejection does not
    depend on anything random, so the law is one pass: the leaf tried at step i is accepted with
    probability :math:`h_i` (its weight; 1 for the root), reached with probability
    :math:`\prod_{j < i}(1 - h_j)`. Runs the same :class:`TraversalState` as the decoder.
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
            for y in torch.nonzero(final > 0).flatten().tolist():
                law[path + (y,)] = law.get(path + (y,), 0.0) + reach * h * float(final[y])
        if v == 0 or h >= 1.0:
            return law
        reach *= 1.0 - h
        state.reject(v)


class Traversal(TreeRule):
    r"""Traversal verification (Weng et al., NeurIPS 2025, arXiv 2505.12398), for i.i.d. rows and
    for rows whose root tokens are drawn without replacement.

    **The rule** (the paper's Algorithm 1, on the :class:`VerificationTree`). Every vnode c (a draw
    of token :math:`x_c` at its parent u) has a weight, :math:`w_{root} = 1` and
    :math:`w_c = \min\big(1, w_u\,\tilde p_u(x_c) / \tilde q_u(x_c)\big)`, where
    :math:`\tilde p_u` starts as the target's law at u and :math:`\tilde q_u` is the draft law u's
    children were drawn from. Repeat: take the first leaf c in depth-first order (children in row
    order). Accept it with probability :math:`w_c` (the root, once alone, always): emit the tokens of
    its path and then a token from :math:`\tilde p_c`. Else delete c and update its parent:

    .. math::

        \tilde p_u \leftarrow \frac{(w_u \tilde p_u - \tilde q_u)_+}{R},\qquad
        w_u \leftarrow \frac{R}{R + 1 - w_u},\qquad R = \sum_x (w_u \tilde p_u - \tilde q_u)_+(x),

    (:math:`w_u \leftarrow 0` when R = 0); at a root drafted without replacement also
    :math:`\tilde q_u \leftarrow \mathrm{norm}(\tilde q_u \text{ without } x_c)`; then recompute the
    weights below u. A node whose children are all gone is a leaf and is tested with its updated
    weight, its accepted token drawn from its residual. On a chain this is block verification
    (:class:`Block`; same law, tested).

    **Exactness** (every emitted token follows the target given the tokens before it). Lemma, by
    induction from the leaves: for a vnode c with weight w and any number n >= 0 of children that
    are i.i.d. draws from :math:`\tilde q_c` (each with a subtree of the same kind), the traversal
    of c's subtree accepts at or below c with probability exactly w, averaged over the children,
    and, given that, emits after c a stream with the target's law (first token
    :math:`\sim \tilde p_c`). Induction step: the first child y is accepted at or below with
    probability :math:`\sum_y \tilde q_c(y) w_y = \sum_y \min(\tilde q_c, w \tilde p_c) = w - R`,
    emitting y w.p. :math:`\min(\tilde q_c(y), w\tilde p_c(y))`; after a rejection (probability
    :math:`1 - w + R`) the state :math:`(R/(R + 1 - w), \mathrm{norm}(w\tilde p_c - \tilde q_c)_+)`
    holds the rest of the mass, :math:`w - R + (1 - w + R) R/(R + 1 - w) = w`, and the token law
    adds up to :math:`w \tilde p_c` as in recursive rejection sampling. The acceptance probability w
    does not depend on n. So the draws at a node may own their subtrees in any way that depends
    only on the node's drawn tokens: with i.i.d. rows, the first draw of each token owns the merged
    subtree of every row that drew it and a later duplicate owns none (a leaf); at the node level
    the rule is then recursive rejection sampling with replacement on i.i.d. draws, each draw
    accepted with its own weight, which is exact (SpecTr; Yang et al. 2024). With the root's drafts
    without replacement (k distinct tokens by successive sampling, then single continuations) the
    root level is recursive rejection sampling without replacement (Jeon et al. 2024), hence the
    :math:`\tilde q` update there. Checked exactly by the decoder's exact mode on toy LMs for both
    schemes (``tests/test_tree_rules.py``).

    **What the paper's tree is not.** Verifying the decoder's merged prefix tree directly, each
    distinct token once with every duplicate dropped, is *not* exact with i.i.d. rows: the subtree
    sizes then depend on the other draws (a planted bug in the tests, TV up to about 1e-2 on toy
    LMs). The duplicate leaves keep the node level a true sequence of i.i.d. draws; they are
    almost never accepted (a rejected token has no residual mass) but each one advances the
    residual.
    """

    name = "traversal"

    def walk(self, dec, tree, drafts, target_laws):
        vt = VerificationTree.from_tree(tree)
        state = TraversalState(
            vt, lambda n: target_laws[n], lambda n: dec.node_draft_law(tree, n, drafts)[0],
            root_without_replacement=dec.scheme == "without_replacement",
        )
        while True:
            v = state.first_leaf()
            if v == 0:
                break  # every branch was rejected: the root's (residual) law
            w = state.w[v]
            if w >= 1.0 or (w > 0.0 and dec.chance.index(torch.tensor([[1.0 - w, w]], dtype=torch.float64)) == 1):
                break
            state.reject(v)
        path = [vt.node[a] for a in vt.path(v)]
        depth = len(path)
        for d in range(min(depth + 1, len(dec.stats.verified_by_depth))):
            dec.stats.verified_by_depth[d] += 1
        for d in range(depth):
            dec.stats.accepted_by_depth[d] += 1
        emitted = [int(tree.tokens[n]) for n in path]
        if state.touched[v]:
            emitted.append(dec.chance.index(state.p[v][None]))
        else:  # a leaf of the draft tree, a duplicate, or the root with its own law: the target's draw
            emitted.append(dec.bonus(tree, vt.node[v], target_laws))
        return emitted, path


TREE_RULES = {"block": Block, "traversal": Traversal}
"""Whole-tree rules by name, beside the token-level verifiers (:data:`otm.decode.decoder.VERIFIERS`)."""
