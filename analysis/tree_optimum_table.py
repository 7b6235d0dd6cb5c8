"""Each decoder rule's expected tokens per target call in one step, as a ratio to the exact tree optimum.

For random toy LM pairs (``ToyLM(V, seed=2s)`` target, ``ToyLM(V, seed=2s+1)`` draft, prompt
``[0, 2]``), temperatures 0.5 / 1 / 2 (both models, no top-k / top-p) and the cases that fit
(V in {3, 4}, k in {1, 2}, L in {1, 2}): :func:`otm.analysis.tree_optimum.tree_optimum` for the
scheme (i.i.d. rows; for k = 2 also the root without replacement) and every rule's exact first-step
tokens (:func:`otm.analysis.tree_optimum.rule_tokens_per_call`). Writes into ``--out``
(default ``docs/results``):

* ``tree_optimum_runs.csv`` / ``.md``: one row per (V, k, L, temperature, seed, scheme, rule);
* ``tree_optimum_table.csv`` / ``.md``: per (V, k, L, temperature, rule): mean optimum, mean and
  minimum ratio over the seeds;
* ``tree_optimum_summary.csv`` / ``.md``: the same, one row per (V, k, L, rule), temperatures side by side;
* ``tree_optimum.png`` / ``.svg``: mean ratio per case, one panel per temperature.

Resumable (``<out>/cache/tree_optimum.jsonl``).

    OMP_NUM_THREADS=1 .venv/bin/python analysis/tree_optimum_table.py            # about 6 min on 1 core
    OMP_NUM_THREADS=1 .venv/bin/python analysis/tree_optimum_table.py --seeds 2 --out /tmp/to   # quick
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otm.analysis.io import load_resume_cache, save_figure, write_table, wrap  # noqa: E402
from otm.analysis.tree_optimum import RULES as ALL_RULES, rule_tokens_per_call, tree_optimum  # noqa: E402
from otm.decode.tree_registry import refuted  # noqa: E402

RULES = {key: k for key, k in ALL_RULES.items() if not refuted(key[0])}
"""The lossless rules (a refuted rule, hsd, exceeds the optimum by being lossy: docs/tree_rules.md)."""

PROMPT = [0, 2]
TEMPERATURES = (0.5, 1.0, 2.0)
CASES = [(V, k, L) for V in (3, 4) for k in (1, 2) for L in (1, 2)]
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python analysis/tree_optimum_table.py"


def label(rule: str, scheme: str) -> str:
    """A rule's row name: ``traversal_without_replacement`` for traversal on roots drawn without replacement (and
    likewise for every rule that runs on both schemes), the rule's own name otherwise."""
    return rule if scheme == "iid" or rule.endswith("without_replacement") else f"{rule}_without_replacement"


def run_one(V: int, k: int, L: int, temperature: float, seed: int) -> list[dict]:
    from otm.decode import Sampling
    from otm.decode.toy import ToyLM

    s = Sampling(temperature=temperature)
    t, d = ToyLM(V, seed=2 * seed), ToyLM(V, seed=2 * seed + 1)
    out = []
    schemes = ("iid", "without_replacement") if k > 1 else ("iid",)
    for scheme in schemes:
        opt = tree_optimum(t, d, PROMPT, k, L, scheme, sampling=s)
        for (rule, rule_scheme), only_k in RULES.items():
            if rule_scheme != scheme or (only_k is not None and only_k != k):
                continue
            if k == 1 and rule in ("kseq", "rrs", "optimal", "traversal"):  # one draft: speculative's rule, or block's
                continue
            got = rule_tokens_per_call(t, d, PROMPT, k, L, rule, scheme, s)
            name = label(rule, scheme)
            if got > opt.value + 1e-9:
                raise AssertionError(f"{rule} above the optimum at V={V} k={k} L={L} T={temperature} seed={seed}")
            out.append({"V": V, "k": k, "L": L, "temperature": temperature, "seed": seed, "scheme": scheme,
                        "rule": name, "tokens": got, "optimum": opt.value, "ratio": got / opt.value,
                        "dual_bound": opt.dual_bound, "transport_bound": opt.transport_bound,
                        "lp_variables": opt.variables, "lp_seconds": opt.seconds})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "results")
    args = ap.parse_args(argv)
    cache = args.out / "cache" / "tree_optimum.jsonl"
    cache.parent.mkdir(parents=True, exist_ok=True)
    rules = ",".join(f"{rule}/{scheme}" for rule, scheme in RULES)  # a cached case is reused only for the same rules
    key = lambda r: (r["V"], r["k"], r["L"], r["temperature"], r["seed"], r.get("rules", ""))  # noqa: E731
    done = load_resume_cache(cache, key)
    rows: list[dict] = []
    for V, k, L in CASES:
        for temperature in TEMPERATURES:
            for seed in range(args.seeds):
                kk = (V, k, L, temperature, seed, rules)
                if kk in done:
                    rows.extend({**r, "rule": label(r["rule"], r["scheme"])} for r in done[kk]["rows"])
                    continue
                got = run_one(V, k, L, temperature, seed)
                with cache.open("a") as f:
                    f.write(json.dumps({"V": V, "k": k, "L": L, "temperature": temperature, "seed": seed,
                                        "rules": rules, "rows": got}) + "\n")
                rows.extend(got)
                print(f"V={V} k={k} L={L} T={temperature} seed={seed}: "
                      + ", ".join(f"{r['rule']} {r['ratio']:.4f}" for r in got), flush=True)
    conditions = (f"Toy LM pairs ToyLM(V, seed=2s) / ToyLM(V, seed=2s+1), s = 0..{args.seeds - 1}, prompt {PROMPT}, "
                  f"temperatures {', '.join(map(str, TEMPERATURES))} (both models, no top-k/top-p); V in {{3, 4}}, "
                  "k in {1, 2}, L in {1, 2}; one step from the prompt; optimum = the lossless-block LP "
                  "(otm.analysis.tree_optimum) for the rule's scheme; rule values exact (first step of the real "
                  f"decoder, every random choice enumerated). Command: `{COMMAND}`.")
    write_table(rows, args.out / "tree_optimum_runs",
                "Expected tokens per target call of one step, each rule and its scheme's optimum. " + conditions)
    summary = []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["V"], r["k"], r["L"], r["temperature"], r["rule"]), []).append(r)
    for (V, k, L, temperature, rule), g in groups.items():
        ratio = np.array([r["ratio"] for r in g])
        summary.append({"V": V, "k": k, "L": L, "temperature": temperature, "rule": rule, "scheme": g[0]["scheme"],
                        "seeds": len(g), "optimum_mean": float(np.mean([r["optimum"] for r in g])),
                        "tokens_mean": float(np.mean([r["tokens"] for r in g])),
                        "ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()),
                        "transport_over_optimum_max": float(max(r["transport_bound"] / r["optimum"] for r in g))})
    write_table(summary, args.out / "tree_optimum_table",
                "Ratio of each rule's expected tokens per target call to the exact one-step optimum of its scheme "
                "(mean and minimum over seeds); last column: how far the plain optimal-transport relaxation "
                "(which may look ahead) sits above the optimum. " + conditions)
    pivot = []
    for V, k, L in CASES:
        for rule in dict.fromkeys(r["rule"] for r in summary if (r["V"], r["k"], r["L"]) == (V, k, L)):
            cells = {r["temperature"]: r for r in summary if (r["V"], r["k"], r["L"], r["rule"]) == (V, k, L, rule)}
            row = {"V": V, "k": k, "L": L, "rule": rule}
            for temperature in TEMPERATURES:
                c = cells[temperature]
                row[f"T={temperature}: optimum"] = c["optimum_mean"]
                row[f"T={temperature}: ratio mean (min)"] = f"{c['ratio_mean']:.4f} ({c['ratio_min']:.4f})"
            row["OT relaxation / optimum, max"] = max(c["transport_over_optimum_max"] for c in cells.values())
            pivot.append(row)
    write_table(pivot, args.out / "tree_optimum_summary",
                "Each rule's tokens per target call over the one-step optimum of its scheme, mean (minimum) over "
                "seeds, beside the mean optimum (tokens per target call); last column: the largest ratio of the "
                "plain optimal-transport relaxation to the optimum. " + conditions, digits=3)
    figure(summary, args.out / "tree_optimum", conditions)


def figure(summary: list[dict], stem: Path, conditions: str) -> None:
    import matplotlib
    import matplotlib.patches

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = list(dict.fromkeys(r["rule"] for r in summary))
    cases = [c for c in CASES if any((r["V"], r["k"], r["L"]) == c for r in summary)]
    fig, axes = plt.subplots(1, len(TEMPERATURES), figsize=(18, 5.2), sharey=True)
    palette = plt.get_cmap("tab20").colors  # one colour per rule (more rules than tab10's ten)
    colors = {rule: palette[i % len(palette)] for i, rule in enumerate(rules)}
    for ax, temperature in zip(axes, TEMPERATURES):
        for j, c in enumerate(cases):
            here = [r for r in summary if (r["V"], r["k"], r["L"]) == c and r["temperature"] == temperature]
            width = 0.8 / max(len(here), 1)
            for i, m in enumerate(here):
                ax.bar(j + (i - (len(here) - 1) / 2) * width, m["ratio_mean"], width, color=colors[m["rule"]],
                       yerr=[[m["ratio_mean"] - m["ratio_min"]], [0]], capsize=1, error_kw={"lw": 0.6})
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(cases)), [f"V={V} k={k} L={L}" for V, k, L in cases], fontsize=8, rotation=45,
                      ha="right")
        ax.set_title(f"temperature {temperature}")
        ax.set_xlabel("case (vocabulary V, drafts k, depth L)")
    handles = [matplotlib.patches.Patch(color=colors[r], label=r) for r in rules]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(rules), 7), fontsize=9, bbox_to_anchor=(0.5, -0.25))
    axes[0].set_ylabel("tokens per target call / one-step optimum\n(bar: mean over seeds; whisker: minimum)")
    lows = [r["ratio_min"] for r in summary]
    axes[0].set_ylim(max(0.0, min(lows) - 0.02), 1.005)
    fig.suptitle(wrap(conditions, 190), fontsize=7, y=1.06)
    save_figure(fig, stem)
    plt.close(fig)


if __name__ == "__main__":
    main()
