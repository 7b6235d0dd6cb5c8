"""Adversarial worst cases of K-SEQ, RRS and RRS without replacement against the optimum.

For each rule, k and V, :func:`otm.analysis.worst_case.search` minimises acceptance / optimum of the
rule's scheme over softmax-parametrised (target, draft) from several seeded starts. Results are
cached one JSON line per (rule, k, V) in ``<out>/cache/worst_cases.jsonl`` (resumable: a rerun
skips what is there), then summarised into

* ``<out>/worst_cases.json``: the worst instance per (rule, k) with its laws, and every run;
* ``<out>/worst_cases.csv`` / ``.md``: worst ratio per (rule, k) next to 1-(1-1/k)^k, and the minimum
  over an exhaustive grid of two-token laws (target (a, 1-a), draft (b, 1-b)) as an optimiser-free check;
* ``<out>/worst_cases.png`` / ``.svg``: the same against k.

    nice -n 10 .venv/bin/python analysis/worst_cases.py            # full (about 15-25 min on 1 core)
    .venv/bin/python analysis/worst_cases.py --quick --out /tmp/wc  # seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otm.analysis.io import load_resume_cache, write_table  # noqa: E402
from otm.analysis.worst_case import bound, search  # noqa: E402

RRSW_MAX_TUPLES = 60_000  # exact RRSw path sum per evaluation: V^k entries at most
GRID = 200  # V = 2 cross-check: target (a, 1-a), draft (b, 1-b) on a GRID x GRID grid of (0, 1)^2


def grid_v2(rule: str, k: int, n: int) -> dict:
    """Exhaustive grid over two-token laws: the worst ratio on it (no optimiser involved)."""
    from otm.analysis.worst_case import RULES

    f = RULES[rule]
    g = (np.arange(n) + 0.5) / n
    best = (np.inf, 0.0, 0.0)
    for a in g:
        t = np.array([a, 1 - a])
        for b in g:
            r = f(t, np.array([b, 1 - b]), k)
            if r < best[0]:
                best = (r, a, b)
    return {"rule": rule, "k": k, "grid": n, "ratio": float(best[0]), "target": [best[1], 1 - best[1]], "draft": [best[2], 1 - best[2]]}


def grid(quick: bool) -> list[tuple[str, int, int, int]]:
    """(rule, k, V, starts) runs."""
    if quick:
        return [(r, k, V, 2) for r in ("kseq", "rrs") for k in (2, 3, 4) for V in (4, 8)] + [
            ("rrsw", k, V, 2) for k in (2, 3) for V in (4, 6)
        ]
    runs = []
    for k in range(2, 9):
        for V in (3, 6, 12, 25, 50):
            starts = 6 if V <= 12 else 4 if V <= 25 else 3
            runs += [("kseq", k, V, starts), ("rrs", k, V, starts)]
        for V in (k + 1, k + 2, k + 4, 12):
            if V ** k <= RRSW_MAX_TUPLES and ("rrsw", k, V, 4) not in runs:
                runs.append(("rrsw", k, V, 4))
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--quick", action="store_true", help="few small runs, for tests and notebooks")
    ap.add_argument("--maxiter", type=int, default=150, help="L-BFGS-B iterations per start")
    ap.add_argument("--polish", type=int, default=1500, help="Nelder-Mead evaluations from the best point")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    maxiter, polish = (40, 200) if args.quick else (args.maxiter, args.polish)
    cache = out / "cache" / f"worst_cases-{'quick' if args.quick else 'full'}-seed{args.seed}-it{maxiter}-p{polish}.jsonl"
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = load_resume_cache(cache, lambda r: (r["rule"], r["k"], r["V"]))
    todo = [g for g in grid(args.quick) if (g[0], g[1], g[2]) not in done]
    for rule, k, V, starts in tqdm(todo, desc="worst cases", unit="run"):
        t0 = time.perf_counter()
        w = search(rule, k, V, starts=starts, seed=args.seed, maxiter=maxiter, polish=polish)
        rec = w.as_dict() | {"seconds": time.perf_counter() - t0}
        with cache.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        done[(rule, k, V)] = rec
    runs = [done[(r, k, V)] for r, k, V, _ in grid(args.quick)]
    n_grid = 20 if args.quick else GRID
    gcache = out / "cache" / f"worst_cases-grid{n_grid}.jsonl"
    gdone = load_resume_cache(gcache, lambda r: (r["rule"], r["k"]))
    gkeys = sorted({(r, k) for r, k, _, _ in grid(args.quick) if r in ("kseq", "rrs")})
    for rule, k in tqdm([g for g in gkeys if g not in gdone], desc="V=2 grid", unit="run"):
        rec = grid_v2(rule, k, n_grid)
        with gcache.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        gdone[(rule, k)] = rec
    worst = {}
    for r in runs:
        key = (r["rule"], r["k"])
        if key not in worst or r["ratio"] < worst[key]["ratio"]:
            worst[key] = r
    rows = []
    for (rule, k), r in sorted(worst.items()):
        Vs = sorted(x["V"] for x in runs if (x["rule"], x["k"]) == (rule, k))
        rows.append({
            "rule": rule, "k": k, "worst_ratio": r["ratio"], "bound": bound(k),
            "gap_to_bound": r["ratio"] - bound(k), "at_V": r["V"], "V_searched": " ".join(map(str, Vs)),
            "starts_per_V": r["starts"],
            f"V2_grid{n_grid}_min": gdone[(rule, k)]["ratio"] if (rule, k) in gdone else float("nan"),
        })  # fmt: skip
    cond = (
        f"L-BFGS-B ({maxiter} it) + Nelder-Mead polish ({polish} evals) over softmax logits in [-20, 20], "
        f"seed {args.seed}; optimum floor 1e-6; last column: minimum over a {n_grid}x{n_grid} grid of two-token laws "
        f"(no optimiser). Command: `python analysis/worst_cases.py"
        f"{' --quick' if args.quick else ''}`"
    )
    write_table(rows, out / "worst_cases", f"Smallest acceptance / optimum found by adversarial search. {cond}", digits=5)
    (out / "worst_cases.json").write_text(json.dumps({
        "conditions": cond,
        "worst": [worst[key] for key in sorted(worst)],
        "runs": [{k: v for k, v in r.items() if k not in ("target", "draft")} for r in runs],
        "v2_grid": [gdone[key] for key in gkeys if key in gdone],
    }, indent=1) + "\n")  # fmt: skip
    plot(rows, out / "worst_cases", cond)
    for r in rows:
        print(f"{r['rule']:5s} k={r['k']}: worst {r['worst_ratio']:.5f} (V={r['at_V']})  bound {r['bound']:.5f}")
    return 0


def plot(rows, stem: Path, cond: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    labels = {"kseq": "K-SEQ / α*(iid)", "rrs": "RRS / α*(iid)", "rrsw": "RRS w/o repl. / α*(w/o)"}
    for i, (rule, label) in enumerate(labels.items()):
        sel = [r for r in rows if r["rule"] == rule]
        if sel:
            ax.plot([r["k"] for r in sel], [r["worst_ratio"] for r in sel], "o-", color=f"C{i}", label=f"worst found: {label}")
    kk = np.arange(1, 9)
    ax.plot(kk, 1 - (1 - 1 / kk) ** kk, "k:", label="1-(1-1/k)^k (K-SEQ guarantee)")
    ax.axhline(1 - 1 / np.e, color="grey", lw=0.8, label="1-1/e")
    ax.set_xlabel("k (drafts)")
    ax.set_ylabel("smallest acceptance / optimum found")
    ax.set_ylim(0.6, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Adversarial worst cases (" + cond.split("Command")[0].strip() + ")", fontsize=7, wrap=True)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=100)
    fig.savefig(stem.with_suffix(".svg"), metadata={"Date": None})
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
