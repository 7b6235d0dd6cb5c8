r"""SpecTr-GBV (Lin, Sheng, Cai & Zhou, arXiv 2604.25925, "SpecTr-GBV: Multi-Draft Block Verification
Accelerating Speculative Decoding"): K draft blocks verified in turn with block verification, numpy float64.

**What could be read of the paper.** Only its abstract (and second-hand summaries) could be read here:
the stored copies of the arXiv page stop after the abstract and the first lines of the introduction.
The abstract says: multi-draft speculative decoding (SpecTr) and greedy block verification (GBV, i.e.
block verification of Sun et al., ICLR 2025) unified in one framework; "the verification step as an
optimal transport problem over draft and target token blocks"; "SpecTr-GBV achieves the optimal
expected acceptance length physically attainable within the framework of i.i.d. draft generation,
and this bound improves as the number of drafts increases". Its algorithm box, theorem and closed
form are NOT read; this module implements the rule as the project's notes describe it ("K i.i.d.
draft blocks verified in turn with block verification", ``shared/reference/peers.md``) and the two
closed forms that the notes' paraphrase "E[tau] = sum over prefixes of p(y)(1 - (1 - min(1,
q/p))^K)" can mean (:func:`closed_form_accepted`). What is missing and what was chosen is listed in
the project doc (``/work/notes/spectr_gbv.md`` -> ``docs/audit.md``).

**The rule** (our reading). The step's K draft rows :math:`x^{(j)}_{1..L}` (i.i.d. from the draft, or
with the root tokens without replacement), the target laws :math:`P(\cdot\mid s)` and draft laws
:math:`Q(\cdot\mid s)` at every prefix s. The root keeps a state: a law :math:`\tilde p` (first
:math:`P(\cdot\mid\varnothing)`), a weight :math:`w_0` (first 1) and the law :math:`\tilde q` the next
row's first token was drawn from (:math:`Q(\cdot\mid\varnothing)`; without replacement, renormalised
without the tokens already tried). For j = 1..K, block verification of row j from that state:

.. math::

    w_1 = \min\Big(1, w_0 \frac{\tilde p(x_1)}{\tilde q(x_1)}\Big),\quad
    w_i = \min\Big(1, w_{i-1} \frac{P(x_i \mid x_{<i})}{Q(x_i \mid x_{<i})}\Big),\quad
    R_i = \sum_y \big(w_i P(y\mid x_{\le i}) - Q(y \mid x_{\le i})\big)_+,

    h_L = w_L,\qquad h_i = \frac{R_i}{R_i + 1 - w_i}\ (1 \le i < L;\ 0 \text{ if } R_i = 0),\qquad
    P(\tau_j = i) = h_i \prod_{i < l \le L} (1 - h_l),\quad P(\tau_j = 0) = \prod_{1 \le l \le L} (1 - h_l).

If :math:`\tau_j = L` emit :math:`x_{1..L}` and the target's draw at the leaf; if
:math:`1 \le \tau_j < L` emit :math:`x_{1..\tau_j}` and a draw from
:math:`\mathrm{norm}\big((w_{\tau_j} P(\cdot \mid x_{\le\tau_j}) - Q(\cdot\mid x_{\le\tau_j}))_+\big)`; if
:math:`\tau_j = 0` the block is rejected and the root takes its residual,

.. math::

    R_0 = \sum_y (w_0 \tilde p(y) - \tilde q(y))_+,\qquad \tilde p \leftarrow \mathrm{norm}\big((w_0\tilde p - \tilde q)_+\big),
    \qquad w_0 \leftarrow \frac{R_0}{R_0 + 1 - w_0}

(:math:`w_0` stays 1 when it starts at 1; unchanged law and :math:`w_0 = 0` if :math:`R_0 = 0`, an
event of probability 0), and the next block is tried. When all K are rejected, emit a draw from
:math:`\tilde p`. K = 1 is block verification (:func:`otm.tree_verification.block_law`, tested).

**Exactness.** Each row is its own chain from the root: the draws at the root are K i.i.d. draws
from :math:`\tilde q` (or successive draws without replacement), each owning one continuation drawn
from the draft. This is traversal verification (:class:`otm.decode.tree_rules.Traversal`) on the
forest of the K rows instead of the merged tree; its lemma (a vnode with weight w whose children are
i.i.d. draws from :math:`\tilde q`, each with a subtree of the same kind, is accepted at or below with
probability exactly w, and then emits the target's stream) holds for any ownership of subtrees that
depends on nothing but the draws, and a single drawn continuation per root draw is such an
ownership. Testing the chain of row j from the top down (the leaf with :math:`h_L = w_L`, then each
parent with its updated weight :math:`R_i/(R_i + 1 - w_i)`) is block verification's
:math:`\tau = \max\{i : \eta_i \le h_i\}`. The root level is then recursive rejection sampling with
(i.i.d.) or without replacement, both exact. Checked by the decoder's exact mode
(``tests/test_tree_rules_spectr_gbv.py``).

**Delayed trees** (one shared path :math:`s_1..s_{L_1}`, then the K rows from its end; DDTE): the
branching node :math:`s_{L_1}` plays the root's part, starting from its block weight
:math:`w_{L_1} = \min(1, w_{L_1 - 1} P(s_{L_1})/Q(s_{L_1}))` along the shared path; if every row is
rejected, the shared path is block-verified from the branching node up
(:meth:`SpectrGbvState.shared_block`). The same lemma (shared nodes have one child, the branching node
the K rows) makes it exact; checked by the exact mode (``tests/test_delayed_trees.py``).

>>> import numpy as np
>>> from otm.decode.tree import DraftTree
>>> tree = DraftTree.from_rows([[0], [1]], root_token=0)          # K = 2 rows of length 1
>>> P = {0: np.array([0.5, 0.5]), 1: np.array([0.5, 0.5]), 2: np.array([0.5, 0.5])}
>>> Q = {0: np.array([0.9, 0.1])}
>>> law = spectr_gbv_law(tree, lambda n: P[n], lambda n: Q[n])
>>> {b: round(float(w), 4) for b, w in sorted(law.items())}   # row 1 accepted w.p. 5/9, else row 2 (ratio 5)
{(0, 0): 0.2778, (0, 1): 0.2778, (1, 0): 0.2222, (1, 1): 0.2222}
"""

from __future__ import annotations

import numpy as np

from ..laws import OtmError


def _row(law) -> np.ndarray:
    """A law as a float64 numpy vector (numpy arrays, lists, CPU torch tensors)."""
    return np.asarray(law, dtype=np.float64).reshape(-1)


class SpectrGbvState:
    r"""The state of one SpecTr-GBV step (module docstring): the root's law :math:`\tilde p`, weight
    :math:`w_0` and draft law :math:`\tilde q`, and the K rows of the draft tree as node chains.

    ``tree``: anything with ``tokens``, ``node_of`` (``[K, L + 1]``) such as
    :class:`otm.decode.tree.DraftTree`. ``target_of(node)`` / ``draft_of(node)``: a node's target law and
    the draft law its children were drawn from (anything :func:`numpy.asarray` reads).
    """

    def __init__(self, tree, target_of, draft_of, *, root_without_replacement: bool = False):
        self.tokens = [int(t) for t in tree.tokens]
        node_of = np.asarray(tree.node_of.tolist() if hasattr(tree.node_of, "tolist") else tree.node_of, dtype=np.int64)
        if node_of.ndim != 2 or node_of.shape[0] < 1 or node_of.shape[1] < 2:
            raise OtmError("SpecTr-GBV needs at least one draft row of length >= 1: draft before verifying")
        delay = int(getattr(tree, "delay", 0) or 0)
        if not 0 <= delay <= node_of.shape[1] - 1:
            raise OtmError(f"a delayed tree's shared path is longer than its rows: delay {delay} with rows of length "
                           f"{node_of.shape[1] - 1}; use a delay up to the length")
        self.delay = delay
        self.shared = [int(n) for n in node_of[0, 1:delay + 1]]  # a delayed tree's shared path s_1..s_L1
        self.base = self.shared[-1] if delay else 0  # where the K rows branch: the root, or the shared path's end
        self.L = node_of.shape[1] - 1 - delay
        # per row: its nodes below the branching node (none when the step's tree was cut to its shared path)
        self.rows = [list(map(int, r[delay + 1:])) for r in node_of] if self.L else []
        self.target_of, self.draft_of = target_of, draft_of
        self.root_without_replacement = root_without_replacement
        self._p: dict[int, np.ndarray] = {}
        self._q: dict[int, np.ndarray] = {}
        # block verification's weights along the shared path: w_0 = 1, w_i = min(1, w_{i-1} P(s_i)/Q(s_i))
        self.shared_w = [1.0]
        parent = 0
        for n in self.shared:
            x, b = self.tokens[n], float(self.Q(parent)[self.tokens[n]])
            self.shared_w.append(min(1.0, self.shared_w[-1] * float(self.P(parent)[x]) / b) if b > 0 else 0.0)
            parent = n
        self.p0 = self.P(self.base).copy()  # the branching node's law, replaced by its residual after each rejected block
        # the law the next row's first token was drawn from (none at a leaf: its children were never drawn)
        self.q0 = self.Q(self.base).copy() if self.L else None
        self.w0 = self.shared_w[-1]
        self.touched = False  # whether p0 is a residual (else the final draw is the target's own)

    def P(self, node: int) -> np.ndarray:
        law = self._p.get(node)
        if law is None:
            law = self._p[node] = _row(self.target_of(node))
        return law

    def Q(self, node: int) -> np.ndarray:
        law = self._q.get(node)
        if law is None:
            law = self._q[node] = _row(self.draft_of(node))
        return law

    def weights(self, j: int) -> np.ndarray:
        r"""``[L + 1]``: :math:`w_0, w_1..w_L` of row j from the current root state."""
        nodes = self.rows[j]
        w = np.empty(self.L + 1)
        w[0] = self.w0
        p_prev, q_prev = self.p0, self.q0
        for i, n in enumerate(nodes, start=1):
            x = self.tokens[n]
            b = float(q_prev[x])
            w[i] = min(1.0, w[i - 1] * float(p_prev[x]) / b) if b > 0 else 0.0
            if i < self.L:  # the leaf's children were never drawn: no draft law there
                p_prev, q_prev = self.P(n), self.Q(n)
        return w

    def block(self, j: int) -> tuple[np.ndarray, list]:
        r"""Block verification of row j: (``tau_law [L + 1]``, ``emit``) where ``emit[i]`` is the law of
        the token emitted after :math:`x_{\le i}` for :math:`1 \le i < L` (normalised residual), None
        for i = L (the target's draw at the leaf) and for i = 0 (the block is rejected: :meth:`reject`)."""
        L, nodes = self.L, self.rows[j]
        w = self.weights(j)
        h = np.zeros(L + 1)
        emit: list = [None] * (L + 1)
        h[L] = w[L]
        for i in range(1, L):
            res = np.maximum(w[i] * self.P(nodes[i - 1]) - self.Q(nodes[i - 1]), 0.0)
            R = float(res.sum())
            if R > 0:
                h[i] = R / (R + (1.0 - w[i]))  # this order keeps h <= 1 in floating point
                emit[i] = res / R
        tau = np.empty(L + 1)
        above = 1.0  # prod_{l > i} (1 - h_l)
        for i in range(L, 0, -1):
            tau[i] = h[i] * above
            above *= 1.0 - h[i]
        tau[0] = above
        return tau, emit

    def reject(self, j: int) -> None:
        r"""Row j's block was rejected (:math:`\tau_j = 0`): the root takes its residual
        :math:`\mathrm{norm}((w_0 \tilde p - \tilde q)_+)`, :math:`w_0 \leftarrow R_0/(R_0 + 1 - w_0)`;
        without replacement the root's draft law also loses row j's first token."""
        res = np.maximum(self.w0 * self.p0 - self.q0, 0.0)
        R = float(res.sum())
        if R > 0:
            self.w0 = R / (R + (1.0 - self.w0))
            self.p0 = res / R
            self.touched = True
        else:
            self.w0 = 0.0
        if self.root_without_replacement:
            q = self.q0.copy()
            q[self.tokens[self.rows[j][0]]] = 0.0
            rest = float(q.sum())
            self.q0 = q / rest if rest > 0 else q


    def shared_block(self) -> tuple[np.ndarray, list]:
        r"""After every row was rejected: block verification of the shared path :math:`s_1..s_{L_1}` from the
        branching node up, as (``tau_law [L1 + 1]``, ``emit``). The branching node :math:`s_{L_1}` is accepted
        with its weight after the rejected rows, :math:`h_{L_1} = w_0`, and then emits a draw from its law
        :math:`\tilde p` (``emit[L1]`` None: the target's own draw there, when no row touched it); a shared
        node :math:`s_i` above it with :math:`h_i = R_i/(R_i + 1 - w_i)` and its residual; ``tau = 0``: the
        root's residual (None: the target's own draw at the root, reached with probability 0). Without a
        delay this is the root alone: ``([1.0], [p0 or None])``."""
        L1 = self.delay
        h = np.zeros(L1 + 1)
        emit: list = [None] * (L1 + 1)
        h[L1] = self.w0 if L1 else 1.0
        emit[L1] = self.p0 if self.touched else None
        nodes = [0] + self.shared
        for i in range(0, L1):
            res = np.maximum(self.shared_w[i] * self.P(nodes[i]) - self.Q(nodes[i]), 0.0)
            R = float(res.sum())
            if R > 0:
                if i:
                    h[i] = R / (R + (1.0 - self.shared_w[i]))
                emit[i] = res / R
        tau = np.empty(L1 + 1)
        above = 1.0
        for i in range(L1, 0, -1):
            tau[i] = h[i] * above
            above *= 1.0 - h[i]
        tau[0] = above
        return tau, emit


def spectr_gbv_law(tree, target_of, draft_of, *, root_without_replacement: bool = False) -> dict[tuple, float]:
    r"""Exact law of the block SpecTr-GBV emits given the draft rows: ``{block: probability}``.

    ``block`` = the accepted tokens of one row and the token drawn after them. The rule's random
    choices are each block's :math:`\tau_j` and the emitted token; the root's state after a rejected
    block depends on nothing random, so the law is one pass over the rows, with the same
    :class:`SpectrGbvState` the decoder's rule runs.
    """
    state = SpectrGbvState(tree, target_of, draft_of, root_without_replacement=root_without_replacement)
    law: dict[tuple, float] = {}

    def add(prefix: tuple, weight: float, final: np.ndarray) -> None:
        for y in np.flatnonzero(final > 0).tolist():
            law[prefix + (y,)] = law.get(prefix + (y,), 0.0) + weight * float(final[y])

    shared = tuple(state.tokens[n] for n in state.shared)
    reach = 1.0
    for j, nodes in enumerate(state.rows):
        tau, emit = state.block(j)
        tokens = shared + tuple(state.tokens[n] for n in nodes)
        for i in range(1, state.L + 1):
            if tau[i] > 0:
                add(tokens[:state.delay + i], reach * tau[i], state.P(nodes[-1]) if i == state.L else emit[i])
        reach *= tau[0]
        if reach <= 0:
            return law
        state.reject(j)
    tau, emit = state.shared_block()
    nodes = [0] + state.shared
    for i in range(state.delay + 1):
        if tau[i] > 0:
            add(shared[:i], reach * tau[i], emit[i] if emit[i] is not None else state.P(nodes[i]))
    return law


# -- the closed forms (candidates for the paper's E[tau]) ------------------------------------------------


def _prefix_laws(target, draft, L: int):
    """``(sequence, p(sequence), q(sequence))`` for every sequence of length 1..L with p + q > 0."""
    stack = [((), 1.0, 1.0)]
    while stack:
        s, ps, qs = stack.pop()
        if len(s) == L:
            continue
        pt, qt = _row(target(s)), _row(draft(s))
        for x in np.flatnonzero((pt > 0) | (qt > 0)).tolist():
            item = (s + (x,), ps * float(pt[x]), qs * float(qt[x]))
            yield item
            stack.append(item)


def closed_form_accepted(target, draft, K: int, L: int, ratio: str = "running") -> float:
    r"""Candidate closed forms of SpecTr-GBV's expected number of accepted draft tokens :math:`E[\tau]`
    (tokens per target call = 1 + this), of the type the project's notes quote for the paper,
    :math:`\sum_{i=1}^{L}\sum_{y_{1:i}} p(y_{1:i})\big(1 - (1 - r(y_{1:i}))^K\big)`:

    * ``ratio="prefix"``: :math:`r(y_{1:i}) = \min\big(1, q(y_{1:i})/p(y_{1:i})\big)` with the joint
      prefix probabilities (the literal reading). At K = 1 it is
      :math:`\sum_i\sum_y \min(p(y_{1:i}), q(y_{1:i}))`, the prefix-wise maximal coupling.
    * ``ratio="running"``: :math:`r(y_{1:i}) = \min_{l \le i}\min\big(1, q(y_{1:l})/p(y_{1:l})\big)`,
      the running minimum: at K = 1 this is block verification's expected accepted length
      (Sun et al., ICLR 2025), so it is the reading that reduces to GBV.

    ``target(prefix)``, ``draft(prefix)``: the processed laws ``[V]`` after the context and ``prefix``.
    """
    if ratio not in ("prefix", "running"):
        raise OtmError(f"unknown ratio {ratio!r}: choose 'prefix' or 'running'")
    if isinstance(K, bool) or not isinstance(K, int) or K < 1 or isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise OtmError(f"K and L must be whole numbers >= 1, got K = {K!r}, L = {L!r}")
    total = 0.0
    run: dict[tuple, float] = {(): 1.0}
    for s, ps, qs in sorted(_prefix_laws(target, draft, L), key=lambda t: len(t[0])):
        r = 1.0 if ps <= 0 else min(1.0, qs / ps)
        if ratio == "running":
            r = min(r, run[s[:-1]])
            run[s] = r
        total += ps * (1.0 - (1.0 - r) ** K)
    return total


def closed_form_table(target, draft, K: int, L: int) -> dict[str, float]:
    """Both candidate closed forms in tokens per target call (1 + E[tau]): ``{"prefix": .., "running": ..}``."""
    return {r: 1.0 + closed_form_accepted(target, draft, K, L, r) for r in ("prefix", "running")}


__all__ = ["SpectrGbvState", "closed_form_accepted", "closed_form_table", "spectr_gbv_law"]
