"""What ``otm profile`` returns (:class:`Profile`: a row per k, the decode checks) and its JSON form, with the
names of how each number is computed (:data:`METHODS`, :data:`MODEL`) and which scheme each verifier's
ratio refers to (:data:`SCHEME_OF`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ...verifiers import VERIFIERS
from .statistics import Stat, predicted_block_efficiency

SCHEME_OF = {v.name: v.optimum_scheme for v in VERIFIERS.values()}
"""The draft scheme each verifier is exact for (its ratio is to alpha* of that scheme): the registry's."""

DECODABLE = ("kseq", "rrs", "rrs_without_replacement", "kseq_without_replacement")
"""Verifiers for k >= 2 that ``otm profile``'s decode check offers (a subset of the decoder's,
:func:`otm.verifiers.decodable`; checked by tests/test_verifiers.py); k = 1 runs ``speculative``."""

METHODS = {
    "alpha*": "closed form, otm.optimum.optimal_acceptance (sorted-prefix min cut; exponential-race quadrature "
              "for without_replacement at k >= 3; greedy: Hu et al.'s closed form)",
    "speculative": "closed form sum min(target, draft)",
    "kseq": "closed form at rho* (SpecTr)",
    "rrs": "closed form 1 - prod(1 - sum min(p_i, q))",
    "greedy": "closed form (Hu et al.; equals alpha* of the greedy scheme)",
    "optimal": "its own closed form sum min(x*, target) (otm.verifiers.optimal: alpha* less its reported gap)",
    "rrs_without_replacement": "exact rejection-path sum where it fits, else unbiased Monte Carlo with its standard error",
    "kseq_without_replacement": "beta E[N_rho] at the root of E[N_rho] = rho (exponential-race quadrature; exact)",
}
"""How each number is computed (printed with the results)."""

MODEL = ("1 + sum_{d=1..L} prod_{j<=d} a_j (expected tokens of one step: accepted prefix + 1 correction or bonus "
         "token); predicted: a_j = the verifier's mean depth-1 acceptance at every depth (optimistic)")
"""The block-efficiency model, stated in every output."""


@dataclass
class VerifierRow:
    name: str
    scheme: str
    acceptance: Stat
    ratio: Stat
    method: str
    mc_se: float | None = None  # standard error of the mean from Monte Carlo (rrs_without_replacement)
    decodable: bool = False
    predicted_block_efficiency: Stat | None = None


@dataclass
class KRow:
    k: int
    alpha: dict[str, Stat]  # scheme -> alpha*
    verifiers: dict[str, VerifierRow]
    skipped: dict[str, str]
    best: str  # the decodable verifier with the highest mean acceptance
    ceiling_scheme: str
    ceiling_block_efficiency: float  # the optimistic model at the best scheme's mean alpha*


@dataclass
class Check:
    """The short real decode of one k (all check prompts together)."""

    k: int
    length: int
    verifier: str
    scheme: str
    prompts: int
    new_tokens: int
    target_calls: int
    accepted_by_depth: list[int]
    verified_by_depth: list[int]
    seconds: float

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    @property
    def acceptance_by_depth(self) -> list[float]:
        return [a / v if v else float("nan") for a, v in zip(self.accepted_by_depth, self.verified_by_depth)]

    @property
    def depth_formula(self) -> float:
        """The block-efficiency formula fed with the measured per-depth acceptances."""
        return predicted_block_efficiency(self.acceptance_by_depth, self.length)


@dataclass
class Profile:
    conditions: dict
    rows: list[KRow]
    checks: list[Check]
    positions: dict = field(default_factory=dict, repr=False)  # k -> per prompt -> per position dicts
    laws: list = field(default_factory=list, repr=False)  # per prompt: (target [N, V], draft [N, V]) float64

    def row(self, k: int) -> KRow:
        return next(r for r in self.rows if r.k == k)

    def check(self, k: int) -> Check | None:
        return next((c for c in self.checks if c.k == k), None)

    def to_json(self) -> dict:
        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {str(a): clean(b) for a, b in x.items()}
            if isinstance(x, (list, tuple)):
                return [clean(b) for b in x]
            return x

        rows = []
        for r in self.rows:
            rows.append({
                "k": r.k, "alpha_star": {s: asdict(v) for s, v in r.alpha.items()},
                "verifiers": {n: {**asdict(v), "acceptance": asdict(v.acceptance), "ratio": asdict(v.ratio)}
                              for n, v in r.verifiers.items()},
                "skipped": r.skipped, "best_verifier": r.best,
                "ceiling": {"scheme": r.ceiling_scheme, "block_efficiency": r.ceiling_block_efficiency},
            })
        L = self.conditions["length"]
        block = []
        for r in self.rows:
            c = self.check(r.k)
            best = r.verifiers[r.best]
            block.append({
                "k": r.k, "length": L, "verifier": r.best,
                "predicted": asdict(best.predicted_block_efficiency),
                "ceiling": r.ceiling_block_efficiency,
                "measured": None if c is None else c.block_efficiency,
                "depth_formula_with_measured": None if c is None else c.depth_formula,
            })
        by_depth = [{"k": c.k, "length": c.length, "verifier": c.verifier, "scheme": c.scheme,
                     "acceptance": c.acceptance_by_depth, "accepted": c.accepted_by_depth,
                     "verified": c.verified_by_depth, "new_tokens": c.new_tokens, "target_calls": c.target_calls,
                     "block_efficiency": c.block_efficiency, "seconds": c.seconds} for c in self.checks]
        return clean({"conditions": self.conditions, "rows": rows, "by_depth": by_depth, "block_efficiency": block})

