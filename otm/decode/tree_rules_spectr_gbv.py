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

import torch

from ..tree_verifiers.spectr_gbv import SpectrGbvState
from .tree_rules import TreeRule


class SpectrGbv(TreeRule):
    """SpecTr-GBV: K i.i.d. (or without-replacement) draft blocks verified in turn with block verification."""

    name = "spectr_gbv"

    def walk(self, dec, tree, drafts, target_laws):
        device = target_laws.device

        def host(law):
            return law.detach().to(device="cpu", dtype=torch.float64).numpy()

        state = SpectrGbvState(tree, lambda n: host(target_laws[n]), lambda n: host(dec.node_draft_law(tree, n, drafts)[0]),
                               root_without_replacement=dec.scheme == "without_replacement")
        L, shared = state.L, state.shared
        depths = len(dec.stats.verified_by_depth)

        def count(accepted: int) -> None:  # depths reached 0..accepted (as level by level would count them)
            for depth in range(min(accepted + 1, depths)):
                dec.stats.verified_by_depth[depth] += 1
            for depth in range(min(accepted, depths)):
                dec.stats.accepted_by_depth[depth] += 1

        for j, nodes in enumerate(state.rows):
            tau_law, emit = state.block(j)
            tau = dec.chance.index(torch.from_numpy(tau_law).to(device)[None])
            if tau == 0:  # the whole block is rejected: the branching node takes its residual, next row
                state.reject(j)
                continue
            count(state.delay + tau)
            path = shared + nodes[:tau]
            emitted = [state.tokens[n] for n in path]
            if tau == L:
                emitted.append(dec.bonus(tree, path[-1], target_laws))
            else:
                emitted.append(dec.chance.index(torch.from_numpy(emit[tau]).to(device)[None]))
            return emitted, path
        # every row rejected: the branching node, else a node of the shared path above it (a delayed tree)
        tau_law, emit = state.shared_block()
        tau = dec.chance.index(torch.from_numpy(tau_law).to(device)[None]) if state.delay else 0
        count(tau)
        path = shared[:tau]
        emitted = [state.tokens[n] for n in path]
        if emit[tau] is None:  # untouched: the target's own draw there
            emitted.append(dec.bonus(tree, path[-1] if path else 0, target_laws))
        else:
            emitted.append(dec.chance.index(torch.from_numpy(emit[tau]).to(device)[None]))
        return emitted, path

__all__ = ["SpectrGbv"]
