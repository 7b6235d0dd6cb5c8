r"""SpecTr-GBV in the decoder (Lin, Sheng, Cai & Zhou, arXiv 2604.25925): the K draft rows of a step,
each verified in turn with block verification from the root's current residual.

The rule, its reading of the paper (only the abstract could be read) and its proof of exactness are
in :mod:`otm.tree_verifiers.spectr_gbv`; the arithmetic is that module's :class:`SpectrGbvState`
(numpy float64), and :func:`~otm.tree_verifiers.spectr_gbv.spectr_gbv_law` is the exact law of the
block it emits given the rows. Here the decisions are drawn through the decoder's door of chance:
per row one choice of :math:`\tau_j` from its law (as :class:`otm.decode.tree_rules.Block` does),
then the residual token or the target's draw at the leaf; after K rejected rows, the root's residual
(or the target's own draw at the root if no row was tried).

Exact for i.i.d. rows and for root tokens drawn without replacement (the root's draft law loses each
rejected row's first token), and on delayed trees (the rows branch at the shared path's end, which plays
the root's part; if every row is rejected, block verification of the shared path from there up): checked
by the decoder's exact mode on toy LMs (``tests/test_tree_rules_spectr_gbv.py``,
``tests/test_delayed_trees.py``). With K = 1 it is block verification.
"""

from __future__ import annotations

from ..tree_verifiers.spectr_gbv import SpectrGbvState
from .tree_rules import HostLaws, TreeRule


class SpectrGbv(TreeRule):
    """SpecTr-GBV: K i.i.d. (or without-replacement) draft blocks verified in turn with block verification."""

    name = "spectr_gbv"

    def walk(self, dec, tree, drafts, target_laws):
        host = HostLaws(dec, tree, drafts, target_laws, draws=int(tree.node_of.shape[0]) + 2)  # one per row, one more
        state = SpectrGbvState(tree, lambda n: host.target[n].copy(), lambda n: host.draft[n].copy(),
                               root_without_replacement=dec.scheme == "without_replacement")
        L, shared = state.L, state.shared
        for j, nodes in enumerate(state.rows):
            tau_law, emit = state.block(j)
            tau = host.index(tau_law)
            if tau == 0:  # the whole block is rejected: the branching node takes its residual, next row
                state.reject(j)
                continue
            dec.count_path(state.delay + tau)
            path = shared + nodes[:tau]
            emitted = [state.tokens[n] for n in path]
            if tau == L:
                emitted.append(host.bonus(path[-1]))
            else:
                emitted.append(host.index(emit[tau]))
            return emitted, path
        # every row rejected: the branching node, else a node of the shared path above it (a delayed tree)
        tau_law, emit = state.shared_block()
        tau = host.index(tau_law) if state.delay else 0
        dec.count_path(tau)
        path = shared[:tau]
        emitted = [state.tokens[n] for n in path]
        if emit[tau] is None:  # untouched: the target's own draw there
            emitted.append(host.bonus(path[-1] if path else 0))
        else:
            emitted.append(host.index(emit[tau]))
        return emitted, path

__all__ = ["SpectrGbv"]
