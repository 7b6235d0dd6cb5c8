"""Verifiers (draft-selection rules): one small module per rule.

=========================== ============================== ===================================
name                        scheme(s)                      source
=========================== ============================== ===================================
``speculative``             any, k = 1                     Leviathan et al. 2023; Chen et al. 2023
``kseq``                    ``iid``                        SpecTr (Sun et al., NeurIPS 2023)
``rrs``                     ``iid``                        SpecInfer (Miao et al., ASPLOS 2024)
``rrs_without_replacement`` ``without_replacement``        MCSD (Yang et al.); RSD (Jeon et al.)
``greedy``                  ``greedy``                     Hu et al., ICLR 2025
``spechub``                 ``spechub`` (k = 2)            Sun et al., EMNLP 2024
``lp_optimal``              any (small V)                  the OTM LP plan
``optimal``                 ``iid``, any V                 Khisti et al. ICLR 2025 form; Fujishige's
                                                           lexicographically optimal base (reports its gap)
``optimal_without_replacement`` ``without_replacement``,   the same form; layered Luce choice reaching the
                            small V (enumerated sets)      lexicographically optimal base (reports its gap)
``optimal_embedded``        ``without_replacement``,       ``optimal`` run on the iid draws embedded in the
                            any V                          drafts (walk of repeats): acceptance >= alpha*_iid
``kseq_without_replacement`` ``without_replacement``,      K-SEQ's test over the iid arrivals embedded in
                            any V                          the drafts, to the k-th distinct one (derived
                                                           here): acceptance >= alpha*_wor / 2, >= K-SEQ
=========================== ============================== ===================================

``VERIFIERS[name].bind(target, scheme)`` returns a :class:`~otm.verifiers.base.Bound`
with ``law(drafts)`` and ``sample(drafts, rng)``; the modules also expose
``law(target, draft, drafts)`` and ``sample(target, draft, drafts, rng)`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from ..schemes import Scheme
from . import (greedy, kseq, kseq_without_replacement, lp_optimal, optimal, optimal_embedded, optimal_without_replacement, rrs,
               rrs_without_replacement, spechub, speculative)
from .base import NOT_ACCEPTED, Bound, Outcome


@dataclass(frozen=True)
class Verifier:
    name: str
    module: ModuleType
    schemes: tuple[str, ...]  # scheme names the rule is exact for ("*" = any)
    only_k1: bool = False

    def applies(self, scheme: Scheme) -> bool:
        if self.only_k1:
            return scheme.k == 1 and scheme.draft is not None
        return "*" in self.schemes or scheme.name in self.schemes

    def bind(self, target, scheme: Scheme) -> Bound:
        return self.module.bind(target, scheme)


VERIFIERS: dict[str, Verifier] = {
    v.name: v
    for v in (
        Verifier("speculative", speculative, ("*",), only_k1=True),
        Verifier("kseq", kseq, ("iid",)),
        Verifier("rrs", rrs, ("iid",)),
        Verifier("rrs_without_replacement", rrs_without_replacement, ("without_replacement",)),
        Verifier("greedy", greedy, ("greedy",)),
        Verifier("spechub", spechub, ("spechub",)),
        Verifier("lp_optimal", lp_optimal, ("*",)),
        Verifier("optimal", optimal, ("iid",)),
        Verifier("optimal_without_replacement", optimal_without_replacement, ("without_replacement",)),
        Verifier("optimal_embedded", optimal_embedded, ("without_replacement",)),
        Verifier("kseq_without_replacement", kseq_without_replacement, ("without_replacement",)),
    )
}


def applicable(scheme: Scheme) -> list[Verifier]:
    """The verifiers that are exact for ``scheme``, in the table's order."""
    return [v for v in VERIFIERS.values() if v.applies(scheme)]


__all__ = ["VERIFIERS", "Verifier", "applicable", "Outcome", "Bound", "NOT_ACCEPTED"]
