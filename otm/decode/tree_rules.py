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
"""

from __future__ import annotations

import torch

from ..laws import OtmError


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


TREE_RULES = {"block": Block}
"""Whole-tree rules by name, beside the token-level verifiers (:data:`otm.decode.decoder.VERIFIERS`)."""
