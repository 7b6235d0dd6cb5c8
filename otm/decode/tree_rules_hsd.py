r"""Hierarchical speculative decoding (HSD; Zhou et al., arXiv 2601.05724) as a decoder tree rule, one chain.

Two rules, one per source (their arithmetic, numpy float64: :mod:`otm.tree_verifiers.hsd`):

* :class:`Hsd` (``hsd``): the rule as the paper describes it. Backward scan over the chain
  :math:`X_1..X_\gamma`: keep the whole chain with :math:`\min(1, p(X_{1:\gamma}) / q(X_{1:\gamma}))`;
  else keep level :math:`t = \gamma - 1, \dots, 0` with :math:`D^+_t / \max(D^+_t, D^-_t)`, the branch
  divergences of the children of :math:`X_{1:t}` under the *capped* joint target
  :math:`p(X_{1:t}) / \max(1, r_1..r_t)` against the joint draft; resample the token after the kept
  prefix from the branch's normalised excess.
* :class:`HsdCode` (``hsd_code``): the public code's arithmetic and conventions
  (``transformers/generation/utils.py:_speculative_sampling`` with ``backward=True``): the same rule
  with the code's handling of a level whose branch laws agree exactly (0/0: kept, and a NaN residual,
  on which the code's ``torch.multinomial`` fails; here an :class:`~otm.laws.OtmError`).

On one chain both are block verification (:class:`otm.decode.tree_rules.Block`) at every level but
the top, where they keep the chain with the uncapped joint ratio instead of BV's capped weight; they
are therefore not lossless (the decoder's exact mode and the one-chain LP refute them: see
``docs/audit.md`` and ``tests/test_tree_rules_hsd.py``). Registered so the refutation can be reproduced:
``otm certify hsd --kind decoder -k 1 --length 2``.

The decoder draws the kept level :math:`\tau` from its law in one choice (the same law as the
independent coins), then the token after it, both through the door of chance, as :class:`Block` does.
"""

from __future__ import annotations

import numpy as np
import torch

from ..laws import OtmError
from ..tree_verifiers.hsd import hsd_code_law, hsd_law
from .tree_rules import HostLaws, TreeRule, emit_block, single_chain


class _ChainRule(TreeRule):
    """A rule on a single draft chain (k = 1) given by its law of the kept level and its residuals."""

    def law(self, targets: torch.Tensor, drafts: torch.Tensor, chain: torch.Tensor):
        """``(tau_law [gamma + 1], residuals [gamma + 1, V], unusable rows [gamma + 1] bool)`` as numpy."""
        raise NotImplementedError

    def walk(self, dec, tree, drafts, target_laws):
        if not tree.children[0]:  # no drafts this step: the target's own draw
            return [dec.bonus(tree, 0, target_laws)], []
        nodes = single_chain(tree, self.name)
        host = HostLaws(dec, tree, drafts, target_laws, draws=2)  # one read of the laws; tau and the last token
        chain = np.array([tree.token_list[n] for n in nodes[1:]], dtype=np.int64)  # [gamma]
        tau_law, residuals, unusable = self.law(host.target[nodes], host.draft[nodes[:-1]], chain)
        tau = host.index(tau_law)
        if tau < len(nodes) - 1 and unusable[tau]:
            raise OtmError(f"{self.name}: the public code would draw the token after level {tau} from a NaN law "
                           "(its branch laws agree there exactly): torch.multinomial fails on it")
        return emit_block(dec, tree, nodes, tau, residuals, target_laws, self.name)


class Hsd(_ChainRule):
    """HSD as the paper describes it (module docstring; :func:`otm.tree_verifiers.hsd.hsd_law`)."""

    name = "hsd"

    def __init__(self, top: str = "joint"):
        self.top = top

    def law(self, targets, drafts, chain):
        tau, res = hsd_law(targets, drafts, chain, top=self.top)
        return tau, res, [False] * len(tau)


class HsdCode(_ChainRule):
    """HSD as the public code computes it (module docstring; :func:`otm.tree_verifiers.hsd.hsd_code_law`)."""

    name = "hsd_code"

    def law(self, targets, drafts, chain):
        return hsd_code_law(targets, drafts, chain)


__all__ = ["Hsd", "HsdCode"]
