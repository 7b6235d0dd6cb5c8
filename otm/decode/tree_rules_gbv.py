r"""GBV, greedy multi-path block verification (Thomas & Pal, arXiv 2602.16961), as a decoder tree rule.

The rule (its math, source and proof of exactness: :mod:`otm.tree_verifiers.gbv`): rank the tokens
at every node by :math:`p/q` (ties by token id), take the lexicographically largest of the K draft
rows, and run block verification (:class:`otm.decode.tree_rules.Block`) on it with the *skewed*
draft law :math:`\tilde q` (the law of the maximum of K i.i.d. rows) in place of q. K = 1 is
block verification. Exact for i.i.d. rows (scheme ``iid``); not for root tokens drawn without
replacement (the skewed law is that of i.i.d. rows), so registered for ``iid`` only.

The arithmetic is numpy float64 (:func:`otm.tree_verifiers.gbv.gbv_decision`); the rule draws its
one decision (the accepted length :math:`\tau`), the residual token and the bonus through the
decoder's door of chance, so the exact mode enumerates it.
"""

from __future__ import annotations

from ..tree_verifiers.gbv import gbv_decision
from .tree_rules import HostLaws, TreeRule, emit_block


class GBV(TreeRule):
    """Greedy multi-path block verification of the step's K i.i.d. draft rows (module docstring)."""

    name = "gbv"

    def walk(self, dec, tree, drafts, target_laws):
        if not tree.children[0]:  # no drafts this step: the target's own draw
            return [dec.bonus(tree, 0, target_laws)], []
        host = HostLaws(dec, tree, drafts, target_laws, draws=2)  # one read of the laws; tau and the last token
        K = int(tree.node_of.shape[0])  # the step's rows (on a delayed tree they branch at the shared path's end)
        path, tau_law, residuals = gbv_decision(tree, lambda n: host.target[n].copy(), lambda n: host.draft[n].copy(), K)
        tau = host.index(tau_law)
        return emit_block(dec, tree, path.nodes, tau, residuals, target_laws, "GBV")


__all__ = ["GBV"]
