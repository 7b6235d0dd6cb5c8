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

The arithmetic of both whole-tree rules is numpy float64, in the core (:mod:`otm.tree_verification`:
``block_law``, ``VerificationTree``, ``TraversalState``, ``traversal_law``); the rules here feed it
the decoder's laws and draw their decisions through the door of chance, and the exact law of a
rule's block given a tree is that same code.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..laws import OtmError, inverse_cdf
from ..tree_verification import TraversalState, VerificationTree, traversal_law
from ..tree_verification import block_law as _np_block_law


class TreeRule:
    """One step's verification of a whole draft tree.

    :meth:`walk` gets the step's context (:class:`~otm.decode.step_context.StepContext`: ``chance``, the door
    through which every random choice is drawn; ``node_draft_law(tree, node, drafts)``, ``bonus(tree, node,
    target_laws)``, ``read``, ``count`` / ``count_path``, ``scheme``, ``k``, ``committed``), the tree, the
    drafts and the target laws ``[N, V]`` at every node (node 0 the root), and returns ``(emitted tokens,
    accepted path nodes, depth 1 first)``. Nothing else of the decoder is reachable from a rule.
    """

    name = "tree rule"

    def walk(self, dec, tree, drafts, target_laws) -> tuple[list[int], list[int]]:
        raise NotImplementedError


class _Rows:
    """Rows ``[V]`` of an ``[N, V]`` float64 table made on first use (``rows[n]``, ``rows[[n1, n2]]``)."""

    def __init__(self, V: int, row_of):
        self.V, self.row_of, self.made = V, row_of, {}

    def _row(self, node: int) -> np.ndarray:
        if node not in self.made:
            self.made[node] = self.row_of(node)
        return self.made[node]

    def __getitem__(self, index):
        if isinstance(index, (list, tuple, np.ndarray)):
            return np.stack([self._row(int(n)) for n in index]) if len(index) else np.zeros((0, self.V))
        return self._row(int(index))


class HostLaws:
    """One step's laws on the host, for a whole-tree rule whose arithmetic is numpy float64, read back in ONE
    copy (``dec.read_array``: phase "laws"), and the rule's random decisions drawn on the host. On the CPU
    (``dec.device_walk`` false: a read costs nothing there) each row is copied when the rule first asks for it,
    and every decision is the door's own draw, as the rules always drew.

    ``target[n]``: the target's law at node n; ``draft[n]``: the law node n's children were drawn from (zeros
    at a node without children); float64 numpy ``[N, V]``. With a door that gives uniforms (the sampled run:
    :meth:`otm.decode.chance.Chance.uniforms`) the same copy brings ``draws`` uniforms drawn on the device by
    the door's generator, and :meth:`index` and :meth:`bonus` draw by inverse CDF on the host, one fresh
    uniform each: the law of the door's own draw (``otm.torch.sample_iid`` is the same inverse CDF), with no
    read; a rule that needs more than ``draws`` asks the door (one read each). Otherwise (the exact mode's door,
    which enumerates the choices) both ask the door.
    """

    def __init__(self, dec, tree, drafts, target_laws: torch.Tensor, draws: int):
        self.dec, self.tree, self.target_laws = dec, tree, target_laws
        n, V = target_laws.shape
        device = target_laws.device
        if not dec.device_walk:  # the CPU (or the exact mode): rows copied as the rule asks
            def host(law):
                return law.detach().to(device="cpu", dtype=torch.float64).reshape(-1).numpy()

            self.target = _Rows(V, lambda node: host(target_laws[node]))
            self.draft = _Rows(V, lambda node: host(dec.node_draft_law(tree, node, drafts)[0]) if tree.children[node]
                               else np.zeros(V))
            self.pool = None
            dec.host_laws = self
            return
        q = torch.zeros((n, V), dtype=torch.float64, device=device)  # [N, V]
        for node in range(n):
            if tree.children[node]:
                q[node] = dec.node_draft_law(tree, node, drafts)[0].to(device=device, dtype=torch.float64)
        u = dec.chance.uniforms(draws, device) if dec.device_walk else None
        parts = [target_laws.to(torch.float64).reshape(-1), q.reshape(-1)] + ([u] if u is not None else [])
        flat = dec.read_array(torch.cat(parts), "laws")  # the step's one read of its laws
        self.target = flat[: n * V].reshape(n, V)
        self.draft = flat[n * V : 2 * n * V].reshape(n, V)
        self.pool = None if u is None else list(flat[2 * n * V :])
        dec.host_laws = self  # the step's host laws, for the shared emission (emit_block)

    @contextlib.contextmanager
    def on_host(self):
        """Torch arithmetic on CPU tensors made from the host copies (``block_law``): no device is involved, so
        the host-read count (:mod:`otm.decode.host_reads`) pauses."""
        reads = self.dec.reads
        if reads is None:
            yield
            return
        reads.paused = True
        try:
            yield
        finally:
            reads.paused = False

    def index(self, law) -> int:
        """A draw from the finite law ``law [n]`` (numpy; need not be normalised)."""
        law = np.asarray(law, dtype=np.float64)
        if self.pool:
            return inverse_cdf(law, float(self.pool.pop()))
        return self.dec.chance.index(torch.from_numpy(np.ascontiguousarray(law)).to(self.target_laws.device)[None])

    def bonus(self, node: int) -> int:
        """The target's own draw at ``node`` (a leaf of the draft tree, or a node whose own law is emitted)."""
        if self.pool:
            return inverse_cdf(self.target[node], float(self.pool.pop()))
        return self.dec.bonus(self.tree, node, self.target_laws)


class LevelByLevel(TreeRule):
    """SpecTr's level-by-level walk with a token-level verifier (one at the root, one below it).

    With a door that keeps decisions on the device (``dec.chance.device_walk``: the sampled run) the walk
    is :meth:`device_walk`: every node with children is verified (one verifier call per verifier and
    number of drafts), every leaf gets its bonus draw (one call), the accepted path is followed on the
    device, and the step's outcome is read back once (``dec.read``: phase "accept"), so nothing in the
    walk waits for the device. Each node's decision uses its own randomness and only the nodes of the
    accepted path are used, so the output law is the node-by-node walk's (the decisions at nodes off the
    path are drawn and dropped); ``tests/test_decoder_syncs.py`` checks it exactly with the exact mode's
    door. Otherwise (the exact mode) the walk verifies node by node down the accepted path.
    """

    def __init__(self, root_verifier, deep_verifier, name: str):
        self.root_verifier, self.deep_verifier, self.name = root_verifier, deep_verifier, name

    def device_walk(self, dec, tree, drafts, target_laws):
        """The walk with its decisions on the device and one read of the outcome (class docstring)."""
        n, device = tree.size, target_laws.device
        token = torch.zeros(n, dtype=torch.int64, device=device)  # [N]: the token each node would emit
        groups: dict = {}  # (verifier's id, m) -> (verifier, the nodes with children it verifies with m drafts)
        for node in range(n):
            if tree.children[node]:
                verify = self.root_verifier if tree.depth[node] == tree.delay else self.deep_verifier
                groups.setdefault((id(verify), len(tree.rows_through[node])), (verify, []))[1].append(node)
        for verify, nodes in groups.values():
            q = torch.cat([dec.node_draft_law(tree, node, drafts) for node in nodes]).to(device)  # [B, V]
            d = torch.stack([drafts.rows[tree.rows_through[node], tree.depth[node]] for node in nodes])  # [B, m]
            token[nodes] = dec.chance.verify_batch(verify, target_laws[nodes], q, d.to(device))
        leaves = [node for node in range(n) if not tree.children[node]]
        token[leaves] = dec.chance.bonus_batch(target_laws[leaves])  # the target's own draw at each leaf
        # next[node] = the child whose token is the node's token, else -1 (a correction token, or a leaf)
        width = max(len(kids) for kids in tree.children)
        kid_token = torch.full((n, max(width, 1)), -1, dtype=torch.int64)  # [N, C]: host tables, one copy each
        kid_node = torch.zeros((n, max(width, 1)), dtype=torch.int64)
        for node, kids in enumerate(tree.children):
            kid_token[node, : len(kids)] = torch.tensor([tree.token_list[c] for c in kids], dtype=torch.int64)
            kid_node[node, : len(kids)] = torch.tensor(kids, dtype=torch.int64)
        match = kid_token.to(device) == token[:, None]  # [N, C]
        found = match.any(-1)
        first = match.to(torch.int64).argmax(-1, keepdim=True)  # [N, 1]: the first (only) matching child
        nxt = torch.where(found, kid_node.to(device).gather(1, first)[:, 0], -1)  # [N]
        walked = [torch.zeros(1, dtype=torch.int64, device=device)]  # node at each depth of the path, -1 past its end
        for _ in range(max(tree.depth)):
            here = walked[-1]  # [1] (a 0-dim index would be read back as a Python int)
            walked.append(torch.where(here >= 0, nxt.index_select(0, here.clamp(min=0)), -1))
        walked = torch.cat(walked)  # [D + 1]
        out = dec.read(torch.cat([walked, token[walked.clamp(min=0)]]))  # the step's one read
        depth = len(walked)
        accepted = sum(1 for v in out[1:depth] if v >= 0)
        path, emitted = out[1 : accepted + 1], out[depth : depth + accepted + 1]
        for i, node in enumerate([0] + path):  # a node with children was verified; its token was a child but at the end
            if tree.children[node]:
                dec.count(tree.depth[node], i < len(path))
        return emitted, path

    def walk(self, dec, tree, drafts, target_laws):
        if dec.device_walk:
            return self.device_walk(dec, tree, drafts, target_laws)
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
            # the k draws of the scheme: at the root, or at a delayed tree's branching node (depth tree.delay)
            verify = self.root_verifier if depth == tree.delay else self.deep_verifier
            y = dec.chance.verify(verify, p_node, q_node, tokens)
            emitted.append(y)
            child = next((c for c in kids if tree.token_list[c] == y), None)
            dec.count(depth, child is not None)
            if child is None:  # y is the correction token
                return emitted, path
            node = child
            path.append(node)


def block_law(targets: torch.Tensor, drafts: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Block verification's decision law and residuals (module docstring), as float64 tensors on the
    targets' device: the numpy arithmetic of :func:`otm.tree_verification.block_law` on the given laws.

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
    def host(x):
        return x.detach().to(device="cpu", dtype=torch.float64).numpy()

    tau, res = _np_block_law(host(targets), host(drafts), chain.detach().cpu().numpy())
    return torch.from_numpy(tau).to(targets.device), torch.from_numpy(res).to(targets.device)


def single_chain(tree, name: str) -> list[int]:
    """The nodes of a draft tree that is one chain (k = 1), root first; a tree is refused in one line."""
    nodes = [0]
    while tree.children[nodes[-1]]:
        kids = tree.children[nodes[-1]]
        if len(kids) != 1:
            raise OtmError(f"{name} verifies a single draft chain (k = 1): use a level-by-level verifier or traversal "
                           "for trees")
        nodes.append(kids[0])
    return nodes


def emit_block(dec, tree, nodes: list[int], tau: int, residuals, target_laws, name: str) -> tuple[list[int], list[int]]:
    """What a block rule emits once it has drawn ``tau`` on the path ``nodes`` (root first): the path's first
    ``tau`` tokens, then the target's own draw at the path's end (``tau`` = its length) or a token of
    ``residuals[tau]`` (``[V]`` laws, numpy or torch); the depths reached and accepted are counted as
    level by level would count them. Returns ``(emitted, accepted path nodes)``."""
    gamma = len(nodes) - 1
    dec.count_path(tau, limit=gamma)  # depths reached: 0..tau
    host = dec.host_laws  # the step's HostLaws, if the rule made one
    host = host if host is not None and host.tree is tree else None
    emitted = [tree.token_list[n] for n in nodes[1 : tau + 1]]
    if tau == gamma:
        emitted.append(host.bonus(nodes[-1]) if host is not None else dec.bonus(tree, nodes[-1], target_laws))
    else:
        row = residuals[tau]
        if isinstance(row, torch.Tensor):
            with host.on_host() if host is not None else contextlib.nullcontext():
                row = row.detach().to(device="cpu", dtype=torch.float64).numpy()
        if not row.sum() > 0:
            raise OtmError(f"{name} drew tau = {tau} whose residual has no mass: report this law")
        emitted.append(host.index(row) if host is not None else
                       dec.chance.index(torch.from_numpy(row).to(target_laws.device)[None]))
    return emitted, nodes[1 : tau + 1]


class Block(TreeRule):
    """Block verification of a single draft chain (k = 1); see the module docstring."""

    name = "block"

    def walk(self, dec, tree, drafts, target_laws):
        if not tree.children[0]:  # no drafts this step: the target's own draw
            return [dec.bonus(tree, 0, target_laws)], []
        nodes = single_chain(tree, "block verification")
        host = HostLaws(dec, tree, drafts, target_laws, draws=2)  # one read of the laws; tau and the last token
        chain = torch.tensor([tree.token_list[n] for n in nodes[1:]], dtype=torch.int64)  # [gamma]
        with host.on_host():  # block_law on CPU tensors made from the host copies
            tau_law, residuals = block_law(torch.from_numpy(host.target[nodes]), torch.from_numpy(host.draft[nodes[:-1]]),
                                           chain)
            tau_law = tau_law.numpy()
        tau = host.index(tau_law)
        return emit_block(dec, tree, nodes, tau, residuals, target_laws, "block verification")


# -- traversal verification ----------------------------------------------------------------------


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
        host = HostLaws(dec, tree, drafts, target_laws, draws=2 * tree.node_of.numel() + 2)  # >= one per leaf test, one more
        state = TraversalState(  # the arithmetic, float64 numpy (otm.tree_verification)
            vt, lambda n: host.target[n].copy(), lambda n: host.draft[n].copy(),
            root_without_replacement=dec.scheme == "without_replacement",
        )
        while True:
            v = state.first_leaf()
            if v == 0:
                break  # every branch was rejected: the root's (residual) law
            w = state.w[v]
            if w >= 1.0 or (w > 0.0 and host.index(np.array([1.0 - w, w])) == 1):
                break
            state.reject(v)
        path = [vt.node[a] for a in vt.path(v)]
        depth = len(path)
        dec.count_path(depth)
        emitted = [tree.token_list[n] for n in path]
        if state.touched[v]:
            emitted.append(host.index(state.p[v]))
        else:  # a leaf of the draft tree, a duplicate, or the root with its own law: the target's draw
            emitted.append(host.bonus(vt.node[v]))
        return emitted, path


__all__ = ["emit_block", "single_chain", "Block", "HostLaws", "LevelByLevel", "Traversal", "TraversalState", "TreeRule", "VerificationTree",
           "block_law", "traversal_law"]
