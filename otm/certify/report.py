"""What a certification returns: one :class:`Case` per checked instance and a :class:`Report`.

A *case* is one instance a rule was checked on: a (target, draft) pair with a scheme and k for a
token-level rule, or a toy language-model pair for a decoder. Exact checks fill ``law_error``
(largest |output law - target|); statistical checks fill ``pvalue`` and the estimated ``tv``. Every
case carries the rule's acceptance P(output in drafts) with an interval (exact: a point) and the
scheme's optimum alpha*; an acceptance above alpha* beyond the interval proves the rule invalid.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

VERDICTS = ("certified", "refuted")


def _short(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        return f"{x:.3g}"
    return str(x)


def law_text(law) -> str:
    """A law as the comma-separated text the CLI reads back (``repr`` precision: round trip)."""
    return ",".join(repr(float(x)) for x in np.asarray(law, dtype=np.float64))


@dataclass
class Case:
    """One checked instance and its outcome."""

    name: str  # bank family and size, e.g. "zeros V=4", or "hypothesis (shrunk)"
    scheme: str
    k: int
    target: np.ndarray | None = None  # [V] (token-level rules)
    draft: np.ndarray | None = None  # [V]
    setting: dict = field(default_factory=dict)  # decoder cases: toy models, T, L, sampling ...
    passed: bool = True
    reason: str = ""  # why it failed, one line
    law_error: float | None = None  # exact checks: max_y |out(y) - target(y)|
    tv: float | None = None  # total variation distance to the target (exact, or of the empirical law)
    pvalue: float | None = None  # statistical checks
    draws: int = 0  # statistical checks: samples drawn
    acceptance: float | None = None  # P(output in drafts): exact, or the estimate
    acceptance_ci: tuple[float, float] | None = None  # 95% interval (exact: the point twice)
    optimum: float | None = None  # alpha* of the scheme on this case

    @property
    def ratio(self) -> float | None:
        if self.acceptance is None or not self.optimum:
            return None
        return self.acceptance / self.optimum

    def to_dict(self) -> dict:
        d = {
            "name": self.name, "scheme": self.scheme, "k": self.k, "passed": self.passed, "reason": self.reason,
            "law_error": self.law_error, "tv": self.tv, "pvalue": self.pvalue, "draws": self.draws,
            "acceptance": self.acceptance,
            "acceptance_ci": list(self.acceptance_ci) if self.acceptance_ci is not None else None,
            "optimum": self.optimum, "ratio": self.ratio,
        }
        if self.target is not None:
            d["target"] = [float(x) for x in self.target]
            d["draft"] = [float(x) for x in self.draft]
        if self.setting:
            d["setting"] = self.setting
        return {key: (None if isinstance(v, float) and math.isnan(v) else v) for key, v in d.items()}


@dataclass
class Report:
    """The outcome of :func:`otm.certify.certify`.

    ``certified`` is True when every case passed; ``worst`` is the failing case (the smallest
    counterexample found) or, when all passed, the case closest to failing; ``command`` is a
    one-line shell command that re-checks ``worst`` alone.
    """

    rule: str
    kind: str
    scheme: str
    k: int
    certified: bool
    cases: list[Case]
    worst: Case | None
    method: str  # what was run, in words (enumeration, draws, level, power)
    alpha: float | None = None  # family-wise level of the statistical tests
    detectable_tv: float | None = None  # TV detected with power >= 0.99 on every case
    seconds: float = 0.0
    command: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return VERDICTS[0] if self.certified else VERDICTS[1]

    @property
    def exit_code(self) -> int:
        """0 certified, 1 refuted (the CLI's exit status)."""
        return 0 if self.certified else 1

    def to_dict(self) -> dict:
        return {
            "rule": self.rule, "kind": self.kind, "scheme": self.scheme, "k": self.k, "verdict": self.verdict,
            "certified": self.certified, "method": self.method, "alpha": self.alpha,
            "detectable_tv": self.detectable_tv, "seconds": round(self.seconds, 3), "command": self.command,
            "worst": self.worst.to_dict() if self.worst is not None else None,
            "cases": [c.to_dict() for c in self.cases], "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def __str__(self) -> str:
        lines = [
            f"{self.rule}: {self.verdict.upper()} ({self.kind} rule, scheme {self.scheme}, k = {self.k}; "
            f"{len(self.cases)} cases, {self.seconds:.1f} s)",
            f"  method: {self.method}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        header = f"  {'case':<28}{'law error':>11}{'TV':>9}{'p-value':>10}{'acceptance':>12}{'alpha*':>9}{'ratio':>8}  verdict"
        lines += ["", header]
        for c in self.cases:
            acc = _short(c.acceptance)
            lines.append(
                f"  {c.name[:27]:<28}{_short(c.law_error):>11}{_short(c.tv):>9}{_short(c.pvalue):>10}{acc:>12}"
                f"{_short(c.optimum):>9}{_short(c.ratio):>8}  {'ok' if c.passed else 'FAIL: ' + c.reason}"
            )
        w = self.worst
        if w is not None:
            lines += ["", f"  {'counterexample' if not self.certified else 'closest case'}: {w.name}"]
            if w.target is not None:
                lines.append(f"    target {law_text(w.target)}")
                lines.append(f"    draft  {law_text(w.draft)}")
            if w.setting:
                lines.append(f"    setting {w.setting}")
            if w.acceptance_ci is not None:
                lo, hi = w.acceptance_ci
                lines.append(f"    acceptance {_short(w.acceptance)} (95% interval {lo:.4g} .. {hi:.4g}), "
                             f"alpha* {_short(w.optimum)}")
            if not w.passed:
                lines.append(f"    why: {w.reason}")
        if self.command:
            lines.append(f"  reproduce: {self.command}")
        return "\n".join(lines)
