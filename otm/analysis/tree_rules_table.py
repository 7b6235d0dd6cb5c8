r"""Every decoder rule's tokens per target call next to the tree LP's ceiling, on toy cases.

For each toy case (a :class:`ToyCase`: ToyLM target and draft, prompt, k, L, scheme, sampling) and
each rule the decoder knows for that scheme and k (read from :data:`otm.decode.decoder.VERIFIERS`
when called, so the whole-tree rules registered in :mod:`otm.decode.tree_registry` after this module
was written appear too), :func:`tree_rules_table` gives

* ``tokens_per_call``: the exact expected number of tokens of the decoder's first step with the
  rule (:func:`otm.analysis.tree_optimum.rule_tokens_per_call`: every random choice of the real
  decoder enumerated);
* ``lp``: the tree LP's value (:func:`otm.analysis.tree_optimum.tree_optimum`), the most tokens per
  call of any lossless verifier of that step: every rule's ceiling;
* ``ratio`` = tokens_per_call / lp, and a note when a rule exceeds the LP (then it is not lossless:
  ``docs/tree_optimum.md``) or could not run.

With ``tree_lp=True`` a row ``tree_lp`` is added: the decoder with
:class:`otm.decode.tree_rules_tree_lp.TreeLP` (the LP's own plan as the verifier), whose exact value
must equal ``lp`` (a check of the whole chain: LP, plan, decoder).

>>> rows = tree_rules_table([ToyCase(V=3, k=1, L=1)], rules=("speculative", "block"))
>>> [(r.rule, round(r.ratio, 12)) for r in rows]
[('speculative', 1.0), ('block', 1.0), ('tree_lp', 1.0)]

Command (prints the markdown table of :data:`DEFAULT_CASES`)::

    OMP_NUM_THREADS=1 .venv/bin/python -m otm.analysis.tree_rules_table
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..laws import OtmError
from .tree_optimum import rule_tokens_per_call, tree_optimum

EXCESS_TOLERANCE = 1e-9
"""A rule whose tokens per call exceed the LP's value by more than this is flagged (not lossless)."""


@dataclass(frozen=True)
class ToyCase:
    """One toy step: ``ToyLM(V, seeds[0])`` target, ``ToyLM(V, seeds[1])`` draft, after ``prompt``."""

    V: int
    k: int
    L: int
    scheme: str = "iid"
    seeds: tuple = (0, 1)
    prompt: tuple = (0, 2)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def models(self):
        from ..decode.toy import ToyLM

        return ToyLM(self.V, seed=self.seeds[0]), ToyLM(self.V, seed=self.seeds[1])

    def sampling(self):
        from ..decode.sampling import Sampling

        return Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def label(self) -> str:
        s = f"T={self.temperature:g}" + (f" top-k {self.top_k}" if self.top_k else "") + (
            f" top-p {self.top_p:g}" if self.top_p < 1 else "")
        return f"V={self.V} k={self.k} L={self.L} {self.scheme} seeds {self.seeds[0]}/{self.seeds[1]} {s}"


DEFAULT_CASES = tuple(
    ToyCase(V, k, L, scheme, seeds=(2 * s, 2 * s + 1))
    for V in (3, 4) for k, L in ((1, 2), (2, 1), (2, 2)) for scheme in ("iid", "without_replacement")
    if not (k == 1 and scheme == "without_replacement") for s in (0, 1)
)
"""The cases ``python -m otm.analysis.tree_rules_table`` runs (V 3 and 4, chains and k = 2 trees, two seeds)."""


@dataclass
class TableRow:
    """One rule on one case."""

    case: ToyCase
    rule: str
    tokens_per_call: float | None  # None: the rule could not run (see note)
    lp: float
    seconds: float
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return None if self.tokens_per_call is None else self.tokens_per_call / self.lp


def rules_for(scheme: str, k: int) -> tuple[str, ...]:
    """The decoder's rules for a scheme and k: its :data:`~otm.decode.decoder.VERIFIERS` (token-level and
    registered whole-tree rules), less those that take one chain when k > 1."""
    from ..decode.decoder import VERIFIERS
    from ..decode.tree_registry import TREE_RULES

    if scheme not in VERIFIERS:
        raise OtmError(f"unknown scheme {scheme!r}: choose one of {', '.join(VERIFIERS)}")
    one_chain = {"speculative"} | {name for name, spec in TREE_RULES.items() if spec.chain_only}
    return tuple(name for name in VERIFIERS[scheme] if k == 1 or name not in one_chain)


def tree_rules_table(cases, rules=None, *, tree_lp: bool = True) -> list[TableRow]:
    """Each rule's exact tokens per target call of the first step, beside the tree LP's (module docstring).

    Parameters
    ----------
    cases : iterable of :class:`ToyCase`.
    rules : names to run (each only where the decoder takes it for the case's scheme and k); default
        every rule of :func:`rules_for`.
    tree_lp : add the row of :class:`otm.decode.tree_rules_tree_lp.TreeLP` (equal to the LP by construction).

    Returns
    -------
    list of :class:`TableRow`, case by case, rules in registry order (``tree_lp`` last). A rule that
    raises :class:`otm.laws.OtmError` gets ``tokens_per_call = None`` and the message as its note.
    """
    out: list[TableRow] = []
    for case in cases:
        if not isinstance(case, ToyCase):
            raise OtmError(f"cases must be ToyCase records, got {type(case).__name__}")
        target, draft = case.models()
        sampling, prompt = case.sampling(), list(case.prompt)
        lp = tree_optimum(target, draft, prompt, case.k, case.L, case.scheme, sampling).value
        names = [r for r in rules_for(case.scheme, case.k) if rules is None or r in rules]
        todo: list = list(names)
        if tree_lp:
            from ..decode.tree_rules_tree_lp import TreeLP

            todo.append(TreeLP(target, draft, sampling))
        for rule in todo:
            name = rule if isinstance(rule, str) else rule.name
            start = time.perf_counter()
            try:
                value = rule_tokens_per_call(target, draft, prompt, case.k, case.L, rule, case.scheme, sampling)
                note = ""
                if value > lp + EXCESS_TOLERANCE:
                    note = f"exceeds the LP by {value - lp:.3g}: not lossless"
            except OtmError as exc:
                value, note = None, str(exc).splitlines()[0]
            out.append(TableRow(case, name, value, lp, time.perf_counter() - start, note))
    return out


def markdown(rows: list[TableRow]) -> str:
    """The rows as a markdown table (one line per case and rule)."""
    lines = ["| case | rule | tokens per call | tree LP | ratio | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        value = "-" if r.tokens_per_call is None else f"{r.tokens_per_call:.6f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.4f}"
        lines.append(f"| {r.case.label} | {r.rule} | {value} | {r.lp:.6f} | {ratio} | {r.note} |")
    return "\n".join(lines)


def main(argv=None) -> int:  # pragma: no cover - a command
    import argparse

    import torch

    parser = argparse.ArgumentParser(description="each decoder rule's exact tokens per call beside the tree LP")
    parser.add_argument("--rules", nargs="*", default=None, help="rule names (default: every registered rule)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(markdown(tree_rules_table(DEFAULT_CASES, args.rules)))
    return 0


__all__ = ["DEFAULT_CASES", "EXCESS_TOLERANCE", "TableRow", "ToyCase", "markdown", "rules_for", "tree_rules_table"]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
