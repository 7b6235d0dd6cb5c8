"""Audit real engines' verification rules with `otm certify` (docs/audit.md).

    .venv/bin/python analysis/audit.py [--tv 0.02] [--examples 300]

For each rule of otm.certify.engines.ENGINE_RULES and each (scheme, k) its engine draws drafts with:
the exact law (every draft tuple of the bank + a hypothesis search), the step-by-step sampler
(statistical at --tv, with the boundary probe u == 0.0), the acceptance against alpha* (the smallest
ratio over the bank's cases), and the smallest counterexample of a rule that is not exact.
Prints a markdown table and, per inexact rule, its counterexample and reproduce command.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from otm.certify import certify
from otm.certify import engines
from otm.certify.engines import ENGINE_RULES
from otm.certify.report import law_text


def _code(rule) -> str:
    """Real code (the engine's function, imported from the installed package) or our rewrite of it."""
    if rule.sample is engines.transformers_sample:  # calls transformers' own _speculative_sampling
        import transformers

        return f"real code, transformers {'.'.join(transformers.__version__.split('.')[:2])}"
    return "rewrite"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tv", type=float, default=0.02, help="sampler runs: TV detected with power 0.99")
    parser.add_argument("--examples", type=int, default=300, help="hypothesis pairs per exact run")
    args = parser.parse_args()
    rows, details = [], []
    for rule in ENGINE_RULES.values():
        for (scheme, k), expected in zip(rule.schemes, rule.expected_exact):
            t0 = time.perf_counter()
            exact = certify(rule.law, kind="law", scheme=scheme, k=k, examples=args.examples,
                            name=f"otm.certify.engines:{rule.law.__name__}")
            sampled = certify(rule.sample, kind="sampler", scheme=scheme, k=k, tv=args.tv,
                              name=f"otm.certify.engines:{rule.sample.__name__}")
            ratios = [c.ratio for c in exact.cases if c.ratio is not None and c.optimum > 1e-9]
            worst = exact.worst
            boundary = any("exactly 0.0" in c.reason for c in sampled.cases)
            rows.append(
                f"| `{rule.name}` | {rule.engine} | {_code(rule)} | {scheme}, k = {k} | {'exact' if exact.certified else 'NOT exact'} "
                f"| {worst.law_error:.2g} / {worst.tv:.2g} | {sampled.verdict}{' (boundary u = 0)' if boundary else ''} "
                f"| {min(ratios):.3f} | {'yes' if exact.certified == expected else 'NO'} | {time.perf_counter() - t0:.0f} s |"
            )
            if not exact.certified:
                shrunk = [c for c in exact.cases if c.name.startswith("hypothesis") and not c.passed]
                small = min(shrunk or [c for c in exact.cases if not c.passed], key=lambda c: (c.target.size, -c.tv))
                command = (f"otm certify {exact.rule} --kind law --scheme {scheme} -k {k} --target "
                           f"{law_text(small.target)} --draft {law_text(small.draft)}")
                details.append(f"- `{rule.name}`, {scheme}, k = {k}: smallest counterexample ({small.name}) target "
                               f"{law_text(np.round(small.target, 6))}, draft {law_text(np.round(small.draft, 6))}: "
                               f"{small.reason}. Reproduce: `{command}`")
            if boundary:
                case = next(c for c in sampled.cases if "exactly 0.0" in c.reason)
                command = (f"otm certify {sampled.rule} --kind sampler --scheme {scheme} -k {k} --target "
                           f"{law_text(case.target)} --draft {law_text(case.draft)} --tv {args.tv:g}")
                details.append(f"- `{rule.name}`, {scheme}, k = {k}: boundary: {case.reason.split('; ')[-1]} "
                               f"(case {case.name}). Reproduce: `{command}`")
            print(rows[-1], flush=True)
    print("\n| rule | engine | code | drafts | exact law | worst law error / TV | sampler | min acceptance / alpha* | "
          "as expected | time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
