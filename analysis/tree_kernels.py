"""Tree kernels in the engines' layouts, judged inside the decoder (otm.certify.tree_kernels): the figures of
docs/certify.md, "Trees in the engines' layouts".

Writes ``--out``/tree_kernels.json and tree_kernels.md:

* statistical certifications (``--tv``, default 0.1, alpha 1e-3, power 0.99) of our rewrite of SGLang's
  ``tree_speculative_sampling_target_only`` (thresholds 1) under top-k (k = 4 rows, depth L = 3) and
  i.i.d. drafting, and of the correct generic kernels (k = 4, L = 3 for i.i.d. drafting);
* the exact TV of SGLang's rule at thresholds below 1 and of the planted tree bugs (their decisions through
  the decoder's door of chance, exact mode, k = 2, L = 2), and the statistical refutation of the kernels
  themselves (k = 2, L = 2).

Run: ``PYTHONPATH=. .venv/bin/python analysis/tree_kernels.py`` (one CPU thread; about 10 minutes on an idle core).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from otm.certify.decoder import certify_decoder  # noqa: E402
from otm.certify.tree_kernels import (PLANTED, SGLangRuleLaw, certify_tree, exact_walk, planted_kernel,  # noqa: E402
                                      sglang_target_only)


def _row(what, report, **extra) -> dict:
    worst = report.worst
    return {"what": what, "verdict": report.verdict, "method": report.method, "command": report.command,
            "seconds": report.seconds, "max_tv": max((c.tv for c in report.cases if c.tv is not None), default=None),
            "failed": [f"{c.name}: {c.reason}" for c in report.cases if not c.passed],
            "min_pvalue": min((c.pvalue for c in report.cases if c.pvalue is not None), default=None),
            "max_law_error": max((c.law_error for c in report.cases if c.law_error is not None), default=None),
            "runs": sum(c.draws for c in report.cases), "worst": worst.name if worst else None, **extra}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "tree_kernels")
    ap.add_argument("--tv", type=float, default=0.1)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    tv = args.tv

    def stat(what, kernel, layout, scheme, k=2, L=2, **extra):
        print(what, flush=True)
        rows.append(_row(f"{what}, k={k} L={L}", certify_tree(kernel, layout=layout, k=k, length=L, tv=tv,
                                                               scheme=scheme), **extra))

    def exact(what, rule, **extra):
        print(what, flush=True)
        rows.append(_row(what, certify_decoder(rule, k=2, length=2), **extra))

    stat("SGLang rewrite, thresholds 1, top-k drafting", "sglang", "sglang", "top_k", k=4, L=3)
    stat("SGLang rewrite, thresholds 1, i.i.d. drafting", "sglang", "sglang", "iid")
    stat("generic rrs (correct), i.i.d. drafting", "rrs", "generic", "iid", k=4, L=3)
    stat("generic rrs without replacement (correct)", "rrs_without_replacement", "generic", "without_replacement")
    for ts, ta in ((1.0, 1.0), (0.9, 0.9), (1.0, 0.5), (0.5, 1.0)):
        exact(f"SGLang rule law, threshold_single {ts:g}, threshold_acc {ta:g} (exact)", SGLangRuleLaw(ts, ta))
    stat("SGLang rewrite, threshold_single 0.9, threshold_acc 0.9, top-k drafting",
         functools.partial(sglang_target_only, threshold_single=0.9, threshold_acc=0.9), "sglang", "top_k")
    for bug, text in PLANTED.items():
        exact(f"planted {bug} (exact)", exact_walk(bug), bug=text)
        stat(f"planted {bug}", planted_kernel(bug), "generic", "iid", bug=text)
    stat("generic rrs on top-k drafts (a rule for sampled drafts)", "rrs", "generic", "top_k")
    report = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "torch": torch.__version__, "command": "PYTHONPATH=. .venv/bin/python analysis/tree_kernels.py",
              "rows": rows}
    (args.out / "tree_kernels.json").write_text(json.dumps(report, indent=1, default=float))
    lines = ["# Tree kernels in the engines' layouts", "", f"`{report['command']}` on {report['machine']} "
             f"(one thread), torch {report['torch']}.", "",
             "| what | verdict | max TV (exact, or empirical) | runs | min p | seconds |", "|---|---|---|---|---|---|"]
    for r in rows:
        p = "-" if r["min_pvalue"] is None else f"{r['min_pvalue']:.3g}"
        tv_text = "-" if r["max_tv"] is None else f"{r['max_tv']:.3g}"
        lines.append(f"| {r['what']} | {r['verdict']} | {tv_text} | {r['runs']:,} | {p} | {r['seconds']:.0f} |")
    (args.out / "tree_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
