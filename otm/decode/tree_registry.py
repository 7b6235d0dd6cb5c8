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
    refuted: str = ""  # not lossless: why, in one line (kept registered so the refutation can be reproduced)
    needs_models: bool = False  # made with the run's models and sampling (target_lm=, draft_lm=, sampling=)
    option: str = ""  # "NAME:VALUE" passes VALUE as this keyword (layer:kseq -> Layer(step="kseq"))
    no_delay: str = ""  # refuses a delayed tree (delay > 0): why, in one line

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
        TreeRuleSpec("spectr_gbv", ".tree_rules_spectr_gbv:SpectrGbv", ("iid", "without_replacement"),
                     summary="K draft blocks verified in turn with block verification (a reading of Lin et al., "
                             "arXiv 2604.25925)"),
        TreeRuleSpec("gbv", ".tree_rules_gbv:GBV", ("iid",),
                     summary="greedy multi-path block verification (Thomas & Pal, arXiv 2602.16961)"),
        TreeRuleSpec("hsd", ".tree_rules_hsd:Hsd", ("iid",), chain_only=True,
                     summary="hierarchical speculative decoding of one chain, as the paper states it (arXiv 2601.05724)",
                     refuted="its top level accepts the whole chain with min(1, p(X)/q(X)) uncapped by the earlier "
                             "prefix ratios: law error 0.015 at V = 2, L = 2 (docs/audit.md)"),
        TreeRuleSpec("hsd_code", ".tree_rules_hsd:HsdCode", ("iid",), chain_only=True,
                     summary="hierarchical speculative decoding of one chain, as its public code computes it",
                     refuted="the same law as hsd (docs/audit.md)"),
        TreeRuleSpec("tree_lp", ".tree_rules_tree_lp:shared_tree_lp", ("iid", "without_replacement"),
                     needs_models=True,
                     summary="the one-step tree LP's optimal plan (toy LMs only: the LP needs every law; "
                             "otm.analysis.tree_optimum)"),
        TreeRuleSpec("layer", ".tree_rules_layer:Layer", ("iid", "without_replacement"), option="step", summary="layer verification: the optimal single-step verifier lifted to the tree, layer by layer (Cha, Cho & Yun, AdaptFM @ ICML 2026; reconstructed from the abstract); other steps: Layer(step=...)"),
    )
}
"""Whole-tree rules by name, beside the token-level verifiers (:data:`otm.torch.VERIFIERS`)."""


def split_name(name: str) -> tuple[str, dict]:
    """``"layer:kseq"`` -> ``("layer", {"step": "kseq"})``; a plain name -> ``(name, {})``; a suffix on a rule that
    takes no option is left in the name (and then refused as unknown)."""
    base, sep, value = name.partition(":")
    spec = TREE_RULES.get(base)
    if sep and spec is not None and spec.option and value:
        return base, {spec.option: value}
    return name, {}


def refuted(name: str) -> str:
    """Why the registered rule ``name`` is not lossless ("" for a certified rule or an unknown name)."""
    spec = TREE_RULES.get(name)
    return spec.refuted if spec is not None else ""


def tree_rule_names(scheme: str) -> tuple[str, ...]:
    """Names of the whole-tree rules exact for ``scheme``, in registry order."""
    return tuple(name for name, spec in TREE_RULES.items() if scheme in spec.schemes)


__all__ = ["TREE_RULES", "TreeRuleSpec", "refuted", "split_name", "tree_rule_names"]
