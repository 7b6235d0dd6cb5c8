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

``VERIFIERS[name].bind(target, scheme)`` returns a :class:`~otm.verifiers.base.BoundVerifier`
with ``law(drafts)`` and ``sample(drafts, rng)``; the modules also expose
``law(target, draft, drafts)`` and ``sample(target, draft, drafts, rng)`` directly.
``VERIFIERS[name].acceptance(target, draft, k)`` is the closed form or exact formula, with how it was computed.
Adding a rule: its module (law, sample, bind, and an ``acceptance``), one :class:`Verifier` line here,
and its torch twin in :mod:`otm.torch.verifiers` if ``torch=True``; the lists of the CLI, the decoder and
the tests derive from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from ..schemes import Scheme
from . import (greedy, kseq, kseq_without_replacement, lp_optimal, optimal, optimal_embedded, optimal_without_replacement, rrs,
               rrs_without_replacement, spechub, speculative)
from ..laws import OtmError
from .base import NOT_ACCEPTED, BoundVerifier, Outcome


@dataclass(frozen=True)
class Verifier:
    """One rule's record; everything that lists rules derives from :data:`VERIFIERS` (docs/architecture.md):
    ``otm acceptance``'s table, the decoder's lookup and the CLI's choices (``decode``), ``otm profile``'s
    ratios (``optimum_scheme``), the torch twins (``torch``: ``tests/test_verifiers.py`` checks that each
    exists in :data:`otm.torch.VERIFIERS` and that nothing else does) and the tests' parametrisation."""

    name: str
    module: ModuleType  # law(target, draft, drafts), sample(target, draft, drafts, rng), bind(target, scheme)
    schemes: tuple[str, ...]  # scheme names the rule is exact for ("*" = any)
    only_k1: bool = False
    torch: bool = False  # a batched twin of the same name in otm.torch.VERIFIERS
    decode: tuple[str, ...] = ()  # the decoder's schemes it runs with, level by level (otm.decode.decoder.VERIFIERS)
    closed_form: Callable | None = None  # (target, draft, k) -> (acceptance, how it was computed); None: enumeration only

    def applies(self, scheme: Scheme) -> bool:
        if self.only_k1:
            return scheme.k == 1 and scheme.draft is not None
        return "*" in self.schemes or scheme.name in self.schemes

    def bind(self, target, scheme: Scheme) -> BoundVerifier:
        return self.module.bind(target, scheme)

    @property
    def optimum_scheme(self) -> str:
        """The scheme whose alpha* the rule's acceptance is a ratio to (``iid`` for a rule of any scheme)."""
        return "iid" if "*" in self.schemes else self.schemes[0]

    def acceptance(self, target, draft, k: int) -> tuple[float, str]:
        """The rule's acceptance from its closed form or exact formula, and how it was computed; one-line
        OtmError for a rule that has none (``lp_optimal``: the LP) or whose formula does not reach this size."""
        if self.closed_form is None:
            raise OtmError(f"{self.name} has no closed form: its acceptance comes from enumeration or the LP")
        return self.closed_form(target, draft, k)


def _formula(fn: Callable, method: str, *, takes_k: bool = True) -> Callable:
    return lambda target, draft, k: (fn(target, draft, k) if takes_k else fn(target, draft), method)


def _rrs_without_replacement(target, draft, k: int) -> tuple[float, str]:
    est = rrs_without_replacement.acceptance(target, draft, k, rng=0)
    if est.method == "exact":
        return est.value, "exact sum over rejection paths"
    return est.value, f"Monte Carlo, {est.paths} paths, standard error {est.se:.1e}"


VERIFIERS: dict[str, Verifier] = {
    v.name: v
    for v in (
        Verifier("speculative", speculative, ("*",), only_k1=True, torch=True, decode=("iid", "without_replacement"),
                 closed_form=_formula(speculative.acceptance, "closed form sum min(target, draft)", takes_k=False)),
        Verifier("kseq", kseq, ("iid",), torch=True, decode=("iid",),
                 closed_form=_formula(kseq.acceptance, "closed form at rho* (SpecTr)")),
        Verifier("rrs", rrs, ("iid",), torch=True, decode=("iid",),
                 closed_form=_formula(rrs.acceptance, "closed form 1 - prod(1 - sum min(p_i, q))")),
        Verifier("rrs_without_replacement", rrs_without_replacement, ("without_replacement",), torch=True,
                 decode=("without_replacement",), closed_form=_rrs_without_replacement),
        Verifier("greedy", greedy, ("greedy",), torch=True,
                 closed_form=_formula(greedy.acceptance, "closed form (Hu et al.)")),
        Verifier("spechub", spechub, ("spechub",), torch=True,
                 closed_form=_formula(spechub.acceptance, "closed form (SpecHub)", takes_k=False)),
        Verifier("lp_optimal", lp_optimal, ("*",)),
        Verifier("optimal", optimal, ("iid",), torch=True, decode=("iid",),
                 closed_form=_formula(optimal.acceptance,
                                      "its own closed form sum min(x*, target): alpha* less its reported gap")),
        Verifier("optimal_without_replacement", optimal_without_replacement, ("without_replacement",),
                 closed_form=_formula(optimal_without_replacement.acceptance, "exact law by enumeration of the draft sets")),
        Verifier("optimal_embedded", optimal_embedded, ("without_replacement",), torch=True, decode=("without_replacement",),
                 closed_form=_formula(optimal_embedded.acceptance, "selection acceptance sum min(x_iid, target) (the iid "
                                      "rule's); membership is at least this")),
        Verifier("kseq_without_replacement", kseq_without_replacement, ("without_replacement",), torch=True,
                 decode=("without_replacement",),
                 closed_form=_formula(kseq_without_replacement.acceptance,
                                      "beta E[N_rho] at the root rho of E[N_rho] = rho (race quadrature)")),
    )
}


def decodable(scheme: str) -> tuple[str, ...]:
    """The token-level rules the decoder runs level by level with draft ``scheme`` (``iid``, ``without_replacement``)."""
    return tuple(v.name for v in VERIFIERS.values() if scheme in v.decode)


def applicable(scheme: Scheme) -> list[Verifier]:
    """The verifiers that are exact for ``scheme``, in the table's order."""
    return [v for v in VERIFIERS.values() if v.applies(scheme)]


__all__ = ["VERIFIERS", "Verifier", "applicable", "decodable", "Outcome", "BoundVerifier", "NOT_ACCEPTED"]
