r"""The draft tree: k draft sequences merged into a prefix tree, and its attention mask.

Node 0 is the *root*: the last committed token, whose target output is the law of the first
new token. Every other node is a distinct draft prefix :math:`(x_1..x_t)` (depth t); nodes are
numbered breadth first (depth by depth, in order of first occurrence over the rows), so a
parent always precedes its children. Row j of the k draft sequences passes through node
``node_of[j, t]`` at depth t.

One target forward scores every node (SpecTr §2.3; SpecInfer's
tree attention). The input is the chain of *pending* tokens (committed tokens not yet in the
cache; its last one is the root) followed by the non-root nodes. Node i sits at position
``root_position + depth[i]`` and attends to the whole cache, to the pending chain, and to its
ancestors and itself, so its output equals the output of a plain forward of its own branch.

The mask follows transformers' convention for a prepared 4D mask (``masking_utils``: a 4D
``attention_mask`` is used as is): shape ``[1, 1, q_len, kv_len]`` with ``kv_len = past +
q_len``, additive, 0.0 where a query may attend and the dtype's most negative finite value
where it may not (eager attention adds it to the scores; SDPA takes a float mask as additive).

>>> tree = DraftTree.from_rows([[3, 1], [3, 2], [4, 1]], root_token=0)
>>> tree.tokens.tolist(), tree.parent.tolist(), tree.depth
([0, 3, 4, 1, 2, 1], [-1, 0, 0, 1, 1, 2], [0, 1, 1, 2, 2, 2])
>>> tree.node_of.tolist()
[[0, 1, 3], [0, 1, 4], [0, 2, 5]]
>>> tree.rows_through[1], tree.children[0]
([0, 1], [1, 2])

A *delayed* tree (DDTE, Thomas et al., arXiv 2602.16994; ``delay`` = L1 > 0): the k rows share their
first L1 tokens, drawn ONCE (one draft per depth), and branch at the shared path's end, where the k
draws are made. ``rows_through`` lists the rows whose draws at a node are its children's draws, with
multiplicity: on the shared path (depth < L1, the root included) that is row 0 alone, so every rule
that reads the drafts at a node from ``rows_through`` sees the one draw made there; from depth L1 on,
every row through the node (as without a delay).

>>> tree = DraftTree.from_rows([[5, 3, 1], [5, 3, 2], [5, 3, 1]], root_token=0, delay=2)
>>> tree.rows_through[:4], tree.children[2], tree.node_of[:, 2].tolist()
([[0], [0], [0, 1, 2], [0, 2]], [3, 4], [2, 2, 2])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .host_reads import host_born


@dataclass
class DraftTree:
    """Prefix tree of k draft rows of length L (plus the root)."""

    tokens: torch.Tensor  # [N] int64: token of each node (node 0: the root, the last committed token)
    parent: torch.Tensor  # [N] int64: parent node, -1 for the root
    depth: list[int]  # [N]: 0 for the root
    node_of: torch.Tensor  # [k, L + 1] int64: node of row j at depth t
    rows_through: list[list[int]]  # per node: the rows through it whose draws there are its children's, increasing
    # (every row through the node; on a delayed tree's shared path row 0 alone: module docstring)
    children: list[list[int]]  # per node: distinct children, in node order
    delay: int = 0  # the shared path's length (a delayed tree, module docstring): the depth where the k rows branch
    token_list: list[int] | None = None  # ``tokens`` as host ints (read without touching a tensor: no device sync)
    parent_list: list[int] | None = None  # ``parent`` as host ints

    def __post_init__(self):
        if self.token_list is None:
            self.token_list = [int(t) for t in self.tokens.tolist()]
        if self.parent_list is None:
            self.parent_list = [int(t) for t in self.parent.tolist()]

    @classmethod
    def from_rows(cls, rows, root_token: int, delay: int = 0) -> "DraftTree":
        """Merge draft rows ``[k, L]`` (token ids, list or tensor) into a prefix tree; with ``delay`` > 0 the rows
        share their first ``delay`` tokens (one draw each: ``rows_through`` is row 0 there)."""
        rows = rows.tolist() if isinstance(rows, torch.Tensor) else [list(r) for r in rows]
        k, L = len(rows), len(rows[0])
        if not 0 <= delay <= L or any(r[:delay] != rows[0][:delay] for r in rows):
            raise ValueError(f"a tree with delay {delay} needs rows of length >= {delay} sharing their first "
                             f"{delay} tokens")
        tokens, parent, depth = [int(root_token)], [-1], [0]
        rows_through: list[list[int]] = [list(range(k)) if delay == 0 else [0]]
        children: list[list[int]] = [[]]
        node_of = [[0] * (L + 1) for _ in range(k)]
        for t in range(1, L + 1):  # breadth first: all of depth t before depth t + 1
            index: dict[tuple[int, int], int] = {}
            for j in range(k):
                key = (node_of[j][t - 1], int(rows[j][t - 1]))
                node = index.get(key)
                if node is None:
                    node = index[key] = len(tokens)
                    tokens.append(key[1])
                    parent.append(key[0])
                    depth.append(t)
                    rows_through.append([])
                    children.append([])
                    children[key[0]].append(node)
                if t >= delay or j == 0:  # a shared node holds the one draw made there (row 0's)
                    rows_through[node].append(j)
                node_of[j][t] = node
        return cls(
            tokens=host_born(torch.tensor(tokens, dtype=torch.int64)),
            parent=host_born(torch.tensor(parent, dtype=torch.int64)),
            depth=depth,
            node_of=host_born(torch.tensor(node_of, dtype=torch.int64)),
            rows_through=rows_through,
            children=children,
            delay=int(delay),
            token_list=tokens,
            parent_list=parent,
        )

    @classmethod
    def root_only(cls, root_token: int) -> "DraftTree":
        """The tree of a step without drafts (autoregressive step: only the root)."""
        return cls(
            tokens=host_born(torch.tensor([int(root_token)], dtype=torch.int64)),
            parent=host_born(torch.tensor([-1], dtype=torch.int64)),
            depth=[0],
            node_of=host_born(torch.zeros((0, 1), dtype=torch.int64)),
            rows_through=[[]],
            children=[[]],
            token_list=[int(root_token)],
            parent_list=[-1],
        )

    @property
    def size(self) -> int:
        return len(self.depth)

    def ancestors(self) -> torch.Tensor:
        """``[N, N]`` bool: ``a[i, j]`` iff node j is node i or one of its ancestors."""
        n = self.size
        anc = torch.eye(n, dtype=torch.bool)
        parent = self.parent_list
        for i in range(1, n):  # parents precede children
            anc[i] |= anc[parent[i]]
        return anc


def tree_inputs(tree: DraftTree, pending: list[int], past: int, *, dtype: torch.dtype, device) -> tuple:
    """``(input_ids [1, q], position_ids [1, q], attention_mask [1, 1, q, past + q])`` of one tree forward.

    ``pending`` are the committed tokens not in the cache (``pending[-1]`` is the root token
    ``tree.tokens[0]``); ``past`` is the cache length. ``q = len(pending) + N - 1``. Output
    row ``len(pending) - 1 + i`` of the forward is node i's.
    """
    n_pending = len(pending)
    if n_pending < 1 or tree.token_list[0] != int(pending[-1]):
        raise ValueError("the last pending token must be the root of the tree")
    n_nodes = tree.size - 1
    q = n_pending + n_nodes
    ids = torch.tensor(list(pending) + tree.token_list[1:], dtype=torch.int64, device=device)[None]  # [1, q]
    depth = torch.tensor(tree.depth[1:], dtype=torch.int64)
    positions = torch.cat([past + torch.arange(n_pending), past + n_pending - 1 + depth])[None].to(device)  # [1, q]
    allowed = torch.zeros((q, past + q), dtype=torch.bool)  # [q, kv]
    allowed[:, :past] = True  # the cache: committed context
    allowed[:n_pending, past : past + n_pending] = torch.ones(n_pending, n_pending, dtype=torch.bool).tril()  # causal chain
    allowed[n_pending:, past : past + n_pending] = True  # nodes see the whole pending chain (root included)
    allowed[n_pending:, past + n_pending :] = tree.ancestors()[1:, 1:]  # nodes see their drafted ancestors and themselves
    mask = torch.zeros((q, past + q), dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return ids, positions, mask[None, None].to(device)  # [1, 1, q, past + q]
