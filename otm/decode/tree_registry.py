"""The whole-tree rules the decoder knows by name: one record per rule, read by the decoder, the CLI and the bench.

A whole-tree rule (:class:`otm.decode.tree_rules.TreeRule`) sees the step's whole draft tree and the
target's laws on it (block, traversal, the published multi-path rules). Adding one is its module plus
one :class:`TreeRuleSpec` here; ``speculative_decode(verifier=NAME)``, ``otm decode --verifier``,
``otm bench-decode --verifiers`` and ``otm certify NAME --kind decoder`` then accept it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TreeRuleSpec:
    """One whole-tree rule: where its class is, the draft schemes it is exact for, whether it takes one chain.

    ``cls`` is ``"module:Class"`` (module relative to ``otm.decode``), imported when the rule is made, so
    that reading the registry (``otm --help``) imports no torch.
    """

    name: str
    cls: str
    schemes: tuple[str, ...]
    chain_only: bool = False  # True: one draft chain (k = 1), like block verification
    summary: str = ""

    def make(self, **options):
        """A fresh instance of the rule (``options``: its keyword arguments)."""
        module, _, attr = self.cls.partition(":")
        return getattr(importlib.import_module(module, __package__), attr)(**options)


TREE_RULES: dict[str, TreeRuleSpec] = {
    spec.name: spec
    for spec in (
        TreeRuleSpec("block", ".tree_rules:Block", ("iid",), chain_only=True,
                     summary="block verification of one chain (Sun et al., ICLR 2025)"),
        TreeRuleSpec("traversal", ".tree_rules:Traversal", ("iid", "without_replacement"),
                     summary="traversal verification, leaves first (Weng et al., NeurIPS 2025)"),
    )
}
"""Whole-tree rules by name, beside the token-level verifiers (:data:`otm.torch.VERIFIERS`)."""


def tree_rule_names(scheme: str) -> tuple[str, ...]:
    """Names of the whole-tree rules exact for ``scheme``, in registry order."""
    return tuple(name for name, spec in TREE_RULES.items() if scheme in spec.schemes)


__all__ = ["TREE_RULES", "TreeRuleSpec", "tree_rule_names"]
