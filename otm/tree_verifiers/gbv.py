r"""Greedy multi-path block verification (GBV), numpy float64 arithmetic.

Source: Rahul Thomas & Arka Pal, "Greedy Multi-Path Block Verification for Faster Decoding in
Speculative Sampling", arXiv 2602.16961 (2026), and the authors' public reference code (the
``gbv_verify`` / ``compute_skew`` methods of their ``TreeVerifier``), read to understand it, not
copied. The decoder's rule is :class:`otm.decode.tree_rules_gbv.GBV`.

**Setting.** K i.i.d. draft rows :math:`X^{(1)}..X^{(K)}` of length L from the draft LM q, merged
into a prefix tree; the target's law :math:`p(\cdot\mid s)` is known at every node s (one target
call).

**The rule.**

1. *Order.* At every node s the tokens are ranked by the ratio
   :math:`r_s(x) = p(x \mid s) / q(x \mid s)` (increasing, unclipped; ties broken by token id, and a
   token of zero draft mass, which no row can hold and which carries no CDF mass, placed at the top).
   The order on paths is the
   lexicographic order these rankings induce.
2. *Selection.* The chosen path :math:`X^\star` is the largest of the K rows in that order: walk
   down from the root, at each node to the child of highest rank. It is a function of the tree's
   set of rows.
3. *Skewed draft.* :math:`X^\star` is the maximum of K i.i.d. rows, so with :math:`F_t(s)` the
   probability that one row's depth-t prefix is :math:`\le s` in the order,
   :math:`P(X^\star_{\le t} \le s) = F_t(s)^K`. Its conditional law at a node s of depth t, with
   :math:`A = F_t(s) - q(s)` (the rows' mass strictly below s), :math:`x = q(s)` (the prefix's
   draft probability), :math:`y(v) = x\,\sum_{u < v} q(u \mid s)` and :math:`z(v) = x\,q(v \mid s)`:

   .. math::

       \tilde q(v \mid s) = \frac{(A + y + z)^K - (A + y)^K}{(A + x)^K - A^K}
       = q(v \mid s)\,\frac{S_K(A + y + z,\ A + y)}{S_K(A + x,\ A)},\qquad
       S_K(a, b) = \sum_{i=0}^{K-1} a^i b^{K-1-i},

   the second form by :math:`a^K - b^K = (a - b) S_K(a, b)`: a sum of non-negative terms, no
   cancellation (the paper's reference code divides by :math:`\max(A, 10^{-8})` instead; here every
   term is scaled by :math:`A + x`, which cannot underflow). At the root :math:`A = 0, x = 1` and
   :math:`\tilde q(v) = F(v)^K - F(v^-)^K`. The prefix masses follow the path:
   :math:`A' = A + y(v),\ x' = z(v)` at the child v.
4. *Verification.* Block verification (Sun et al., ICLR 2025; :func:`otm.tree_verification.block_law`)
   of the single chain :math:`X^\star` with :math:`\tilde q` in place of q.

**Why it is lossless.** Block verification is lossless for any chain drawn autoregressively from
the laws it is given, and only the chain and its own uniforms enter its decision; :math:`X^\star`
follows :math:`\tilde q` exactly (step 3), whatever the other rows are. Any fixed order works for
exactness; the ratio order is the paper's greedy choice for efficiency. K = 1 is block
verification. The formula of step 3 is the law of the maximum of K *i.i.d.* rows: with the root
tokens drawn without replacement the maximum has another law and the rule is not exact
(``tests/test_tree_rules_gbv.py`` measures the error).

**Ties.** Selection and :math:`\tilde q` must use one and the same total order. Ordering the
children by a different key than the CDF (e.g. the clipped ratio :math:`\min(1, p/q)`, which ties
every token with :math:`p \ge q`, broken by the children's order of appearance) changes the law of
the selected path but not :math:`\tilde q`: lossy (a planted bug in the tests).

>>> import numpy as np
>>> rank = ratio_rank(np.array([0.5, 0.3, 0.2]), np.array([0.25, 0.25, 0.5]))
>>> rank.tolist()   # ratios 2, 1.2, 0.4: token 2 lowest, token 0 highest
[2, 1, 0]
>>> skewed_law(np.array([0.25, 0.25, 0.5]), rank, below=0.0, at=1.0, K=2).round(4).tolist()
[0.4375, 0.3125, 0.25]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..laws import OtmError
from ..tree_verification import block_law


def _row(law) -> np.ndarray:
    return np.asarray(law, dtype=np.float64).reshape(-1)


def ratio_rank(target, draft) -> np.ndarray:
    r"""Rank of every token in GBV's order at a node (0 = lowest): increasing :math:`p/q`, ties by
    token id; tokens with :math:`q = 0` (never drafted, no CDF mass) at the top, by id.

    Parameters
    ----------
    target, draft : ``[V]`` the target's law and the draft law the node's children were drawn from.
    """
    p, q = _row(target), _row(draft)
    if p.shape != q.shape:
        raise OtmError(f"GBV needs target and draft laws of one size, got {p.size} and {q.size}")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / q, np.inf)  # [V]
    order = np.lexsort((np.arange(p.size), ratio))  # increasing ratio, then token id
    rank = np.empty(p.size, dtype=np.int64)
    rank[order] = np.arange(p.size)
    return rank


def _power_sum(a, b, K: int):
    """:math:`S_K(a, b) = \\sum_{i<K} a^i b^{K-1-i}` (elementwise, a, b >= 0)."""
    return sum(a**i * b ** (K - 1 - i) for i in range(K))


def skewed_law(draft, rank, *, below: float, at: float, K: int) -> np.ndarray:
    r"""GBV's skewed draft law at a node (module docstring, step 3): the law of the next token of the
    maximum of K i.i.d. rows, given that the maximum passes through this node.

    Parameters
    ----------
    draft : ``[V]`` q(.|s), the draft law of the node's children.
    rank : ``[V]`` the node's token order (:func:`ratio_rank`).
    below : A, one row's probability of a prefix (of this depth) strictly below s in the order.
    at : x = q(s), one row's probability of the prefix s (> 0).
    K : number of i.i.d. rows.
    """
    q = _row(draft)
    if not at > 0:
        raise OtmError(f"GBV's skewed law needs a node of positive draft mass, got q(s) = {at!r}")
    if K < 1:
        raise OtmError(f"GBV needs K >= 1 draft rows, got {K}")
    order = np.argsort(rank)
    cdf_below = np.empty_like(q)
    cdf_below[order] = np.concatenate([[0.0], np.cumsum(q[order])[:-1]])  # sum of q over tokens ranked below
    top = below + at  # F(s): every ratio below is <= 1 after scaling by it
    lo = (below + at * cdf_below) / top  # (A + y) / (A + x)
    hi = (below + at * (cdf_below + q)) / top  # (A + y + z) / (A + x)
    law = q * _power_sum(hi, lo, K) / _power_sum(1.0, below / top, K)
    return law / law.sum()


def pick_child(children, tokens, rank, target, draft) -> int:
    """The child of highest rank (the order of :func:`ratio_rank`, the one the skewed law uses).

    ``target`` and ``draft`` (the node's laws) are not needed by this order; a rule that ranks the
    children by another key (e.g. the clipped ratio) must rank the skewed law's CDF by that same key.
    """
    return max(children, key=lambda c: rank[tokens[c]])


@dataclass
class GBVPath:
    """The path GBV selects in a tree, and what block verification of it needs."""

    nodes: list[int]  # tree nodes, root first (gamma + 1 of them)
    chain: np.ndarray  # [gamma] tokens of the path, depth 1 first
    skewed: np.ndarray  # [gamma, V] the skewed draft law at each path node but the last
    mass_below: list[float]  # A at each path node (one row's mass strictly below its prefix)
    mass_at: list[float]  # x = q(prefix) at each path node


def select_path(tree, target_of, draft_of, K: int, *, rank_of=None) -> GBVPath:
    """GBV's steps 1-3 on a draft tree: the chosen path and its skewed draft laws.

    ``tree``: a :class:`otm.decode.tree.DraftTree` (``tokens``, ``children``, ``delay``: on a delayed tree the
    shared path is one draw per node, its draft law q, and the K rows branch at its end); ``target_of(node)`` and
    ``draft_of(node)``: the node's target law and the draft law its children were drawn from (``[V]``,
    anything :func:`numpy.asarray` reads). ``rank_of(target, draft)`` (default :func:`ratio_rank`): the
    token order, the same for the selection and for the skewed law.
    """
    rank_of = ratio_rank if rank_of is None else rank_of
    tokens = [int(t) for t in tree.tokens]
    delay = int(getattr(tree, "delay", 0))  # a delayed tree: one draw per node of the shared path, K rows from its end
    node, nodes, chain, skewed, below, at = 0, [0], [], [], [0.0], [1.0]
    while tree.children[node]:
        p, q = _row(target_of(node)), _row(draft_of(node))
        rank = rank_of(p, q)
        if len(chain) == delay:  # the K i.i.d. rows start here: their maximum's masses start afresh
            below[-1], at[-1] = 0.0, 1.0
        skewed.append(skewed_law(q, rank, below=below[-1], at=at[-1], K=K if len(chain) >= delay else 1))
        child = pick_child(tree.children[node], tokens, rank, p, q)
        v = tokens[child]
        if not q[v] > 0:
            raise OtmError(f"GBV: the draft tree holds token {v}, of zero draft mass at its parent: the drafts do "
                           "not come from the draft laws given")
        below.append(below[-1] + at[-1] * float(q[rank < rank[v]].sum()))
        at.append(at[-1] * float(q[v]))
        nodes.append(child)
        chain.append(v)
        node = child
    V = _row(target_of(0)).size
    return GBVPath(nodes, np.array(chain, dtype=np.int64), np.array(skewed).reshape(len(chain), V), below, at)


def gbv_decision(tree, target_of, draft_of, K: int, **kw) -> tuple[GBVPath, np.ndarray, np.ndarray]:
    """``(path, tau_law [gamma + 1], residuals [gamma + 1, V])``: the selected path and block verification's
    decision law on it with the skewed draft laws (:func:`otm.tree_verification.block_law`)."""
    path = select_path(tree, target_of, draft_of, K, **kw)
    if not path.chain.size:
        raise OtmError("GBV needs a draft tree with at least one row of length >= 1")
    targets = np.array([_row(target_of(n)) for n in path.nodes])  # [gamma + 1, V]
    tau_law, residuals = block_law(targets, path.skewed, path.chain)
    return path, tau_law, residuals


def gbv_law(tree, target_of, draft_of, K: int, **kw) -> dict[tuple, float]:
    r"""Exact law of the block GBV emits from one draft tree: ``{block: probability}``.

    ``block`` = the accepted prefix :math:`X^\star_{\le\tau}` of the selected path and the token
    after it (the target's own draw at the path's end, else the block residual). The selection is
    deterministic given the tree, so the law is block verification's on the selected path.
    """
    path, tau_law, residuals = gbv_decision(tree, target_of, draft_of, K, **kw)
    law: dict[tuple, float] = {}
    for tau, w in enumerate(tau_law.tolist()):
        if w <= 0:
            continue
        if not residuals[tau].sum() > 0:  # the residual's mass is below float64's resolution (as the decoder says)
            raise OtmError(f"GBV: tau = {tau} has probability {w:.3g} but its residual has no mass in float64 "
                           "(a skewed draft law within rounding of the target's): report this law")
        head = tuple(int(t) for t in path.chain[:tau])
        for y in np.flatnonzero(residuals[tau] > 0).tolist():
            law[head + (y,)] = law.get(head + (y,), 0.0) + w * float(residuals[tau, y])
    return law


__all__ = ["GBVPath", "gbv_decision", "gbv_law", "pick_child", "ratio_rank", "select_path", "skewed_law"]
