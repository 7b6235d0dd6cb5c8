"""Acceptance against time per verification, every iid / without-replacement rule, on real laws.

The embedded pair's next-token laws (``otm.decode.models.load_pair()``: the SmolLM2 target and the
committed draft, V = 49152) at ``--positions`` positions of a target-sampled continuation of each
of the first ``--prompts`` prompts of ``otm profile`` (``otm.decode.profile.continuation_laws``,
temperature ``--temperature``), cached in ``~/.cache/otm/accept_vs_time-<key>.npz``. For k = 2, 4, 8:

* acceptance per rule, averaged over the positions: K-SEQ, RRS (with replacement), the ``optimal``
  verifier (all exact formulas, iid drafts), RRS without replacement (its exact path sum or Monte
  Carlo estimate) and K-SEQ without replacement (``kseq_without_replacement``, exact; drafts without
  replacement), and alpha* of each scheme (the bound, drawn as a line);
* time per verification: one batched torch call (``otm.torch``, CPU, 1 thread, ``validate=False``,
  batch 1: set-up + one verification of one position), mean over the positions, fresh drafts
  and uniforms each call, after one warm-up call per rule; and ms per row at batch 32 (the positions
  32 at a time, each block called 5 times with fresh drafts, after one warm-up call).

The figure puts mean time per verification (log x) against mean acceptance, one marker per
(rule, k), with the budgets of Thomas & Pal: Partial Resolution's 2 ms, Global Resolution's 10 ms
and 100 ms (their acceptance numbers are on other pairs, not redrawn here).

    PYTHONPATH=. python analysis/accept_vs_time.py                 # 8 prompts x 8 positions
    PYTHONPATH=. python analysis/accept_vs_time.py --prompts 2 --positions 4   # quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RULES = {  # label: (otm.torch verifier, scheme, acceptance key of position_acceptances)
    "K-SEQ": ("kseq", "iid", "kseq"),
    "RRS": ("rrs", "iid", "rrs"),
    "RRS without replacement": ("rrs_without_replacement", "without_replacement", "rrs_without_replacement"),
    "optimal": ("optimal", "iid", "optimal"),
    "K-SEQ without replacement": ("kseq_without_replacement", "without_replacement", "kseq_without_replacement"),
}


def collect(prompts: int, positions: int, temperature: float, seed: int) -> tuple[np.ndarray, np.ndarray, Path]:
    """``(target, draft)`` float64 ``[prompts * positions, V]``, from the cache or the models."""
    from otm.decode.embedded import cache_dir
    from otm.decode.profile import PROMPTS

    path = Path(cache_dir()) / f"accept_vs_time-p{prompts}-n{positions}-t{temperature:g}-s{seed}.npz"
    if path.exists():
        z = np.load(path)
        return z["target"].astype(np.float64), z["draft"].astype(np.float64), path
    from otm.decode.models import load_pair
    from otm.decode.profile import continuation_laws, prompt_ids

    target_model, draft_model, tokenizer = load_pair()
    ts, ds = [], []
    for i in range(prompts):
        ids = prompt_ids(tokenizer, PROMPTS[i])
        tl, dl = continuation_laws(target_model, draft_model, ids, positions=positions, temperature=temperature, seed=seed + i)
        ts.append(tl)
        ds.append(dl)
    target, draft = np.concatenate(ts), np.concatenate(ds)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, target=target, draft=draft)
    return target, draft, path


def acceptances(target, draft, ks, seed):
    """Mean acceptance per (rule or bound, k) over the positions."""
    from otm.decode.profile import position_acceptances

    rng = np.random.default_rng(seed)
    out = {}
    for k in ks:
        rows = [position_acceptances(t, d, k, rng=rng) for t, d in zip(target, draft)]
        for key in ("kseq", "rrs", "optimal", "rrs_without_replacement", "kseq_without_replacement", "alpha_iid",
                    "alpha_without_replacement"):
            out[key, k] = float(np.mean([r[key] for r in rows]))
        gaps = np.array([r["alpha_iid"] - r["optimal"] for r in rows])
        out["gaps", k] = (int((gaps > 1e-9).sum()), float(gaps.max()), len(rows))
    return out


def timings(target, draft, ks, seed, batch=32, repeats=5):
    """Per (rule, k): ``(mean, median)`` ms per call at batch 1 (set-up + one verification of one
    position), and the mean ms per row at batch ``batch`` (the positions taken ``batch`` at a time, each
    block called ``repeats`` times with fresh drafts, after one warm-up call)."""
    import torch

    import otm.torch as ot

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    with torch.inference_mode():
        for label, (name, scheme, _) in RULES.items():
            f = ot.VERIFIERS[name]
            for k in ks:
                times = []
                for i in range(-1, len(target)):  # one warm-up call
                    t = torch.from_numpy(target[max(i, 0)][None])
                    q = torch.from_numpy(draft[max(i, 0)][None])
                    d = ot.sample_drafts(scheme, q, k, generator=gen)
                    start = time.perf_counter()
                    f(t, q, d, generator=gen, validate=False)
                    if i >= 0:
                        times.append((time.perf_counter() - start) * 1e3)
                rows = []
                blocks = [(a, a + batch) for a in range(0, len(target) - batch + 1, batch)]
                for n, (a, b) in enumerate([blocks[0]] + blocks * repeats):  # one warm-up call
                    t, q = torch.from_numpy(target[a:b]), torch.from_numpy(draft[a:b])
                    d = ot.sample_drafts(scheme, q, k, generator=gen)
                    start = time.perf_counter()
                    f(t, q, d, generator=gen, validate=False)
                    if n:
                        rows.append((time.perf_counter() - start) * 1e3 / (b - a))
                out[label, k] = (statistics.mean(times), statistics.median(times),
                                 statistics.mean(rows) if rows else float("nan"))
    return out


def plot(acc, tim, ks, conditions, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {"K-SEQ": "o", "RRS": "s", "RRS without replacement": "^", "optimal": "*", "K-SEQ without replacement": "v"}
    colors = {2: "tab:blue", 4: "tab:orange", 8: "tab:green"}
    fig, ax = plt.subplots(figsize=(9.6, 5.4))
    for label, (_, _, key) in RULES.items():
        for k in ks:
            ax.scatter(tim[label, k][0], acc[key, k], marker=markers[label], s=140 if label == "optimal" else 70,
                       color=colors[k], edgecolor="black", linewidth=0.6, zorder=3)
    for k in ks:
        ax.axhline(acc["alpha_iid", k], color=colors[k], linestyle="--", linewidth=1.0)
        ax.axhline(acc["alpha_without_replacement", k], color=colors[k], linestyle=":", linewidth=1.0)
    for budget, name in ((2, "2 ms (Partial Resolution)"), (10, "10 ms (Global Resolution)"), (100, "100 ms (Global Resolution)")):
        ax.axvline(budget, color="grey", linewidth=0.8)
        ax.annotate(name, (budget, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12), textcoords="offset points",
                    fontsize=7, color="grey", rotation=90, va="top")
    ax.set_xscale("log")
    ax.set_xlabel("time per verification, set-up + one verification at batch 1 (ms, log scale)")
    ax.set_ylabel("mean acceptance P(output is a draft)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker=m, linestyle="", color="white", markeredgecolor="black", label=l) for l, m in markers.items()]
    handles += [Line2D([], [], marker="o", linestyle="", color=c, label=f"k = {k}") for k, c in colors.items() if k in ks]
    handles += [Line2D([], [], linestyle="--", color="black", label="alpha* iid drafts"),
                Line2D([], [], linestyle=":", color="black", label="alpha* without replacement")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: no marker hidden
    ax.set_title("Acceptance against time per verification, embedded pair, real next-token laws", fontsize=10)
    fig.text(0.01, 0.005, conditions, fontsize=6, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "accept_vs_time.png", out_dir / "accept_vs_time.svg"]
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--collect-only", action="store_true", help="only fetch (and cache) the laws")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "results"))
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.ks.split(",")]
    target, draft, path = collect(args.prompts, args.positions, args.temperature, args.seed)
    print(f"laws: {target.shape[0]} positions, V = {target.shape[1]} ({path})", flush=True)
    if args.collect_only:
        return
    acc = acceptances(target, draft, ks, args.seed)
    tim = timings(target, draft, ks, args.seed)
    import torch

    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    conditions = (f"{datetime.date.today()}; embedded pair (SmolLM2 target, committed draft), V = {target.shape[1]}, "
                  f"{args.prompts} prompts x {args.positions} positions, temperature {args.temperature:g}, seed {args.seed}; "
                  f"time: otm.torch, batch 1, CPU {platform.machine()} ({os.cpu_count()} cores, shared), torch "
                  f"{torch.__version__}, 1 thread, validate=False, mean over positions; load average {load}; "
                  f"command: python analysis/accept_vs_time.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    rows = []
    for label, (_, _, key) in RULES.items():
        for k in ks:
            rows.append({"rule": label, "k": k, "acceptance": acc[key, k], "ratio_to_alpha_iid": acc[key, k] / acc["alpha_iid", k],
                         "ms_mean": tim[label, k][0], "ms_median": tim[label, k][1], "ms_per_row_batch32": tim[label, k][2]})
    for k in ks:
        rows.append({"rule": "alpha* iid", "k": k, "acceptance": acc["alpha_iid", k]})
        rows.append({"rule": "alpha* without replacement", "k": k, "acceptance": acc["alpha_without_replacement", k]})
    print("| rule | k | mean acceptance | / alpha* iid | ms at batch 1 (mean / median) | ms per row at batch 32 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ms = f"{r['ms_mean']:.2f} / {r['ms_median']:.2f} | {r['ms_per_row_batch32']:.2f}" if "ms_mean" in r else "(bound) |"
        print(f"| {r['rule']} | {r['k']} | {r['acceptance']:.4f} | {r['acceptance'] / acc['alpha_iid', r['k']]:.4f} | {ms} |")
    for k in ks:
        n_gap, worst, n = acc["gaps", k]
        print(f"optimal vs alpha* (iid), k = {k}: gap > 1e-9 at {n_gap} of {n} positions, largest {worst:.2e}")
        rows.append({"rule": "optimal gap to alpha* iid", "k": k, "positions_above_1e-9": n_gap, "largest": worst, "positions": n})
    print(conditions)
    paths = plot(acc, tim, ks, conditions, Path(args.out))
    (Path(args.out) / "accept_vs_time.json").write_text(json.dumps({"conditions": conditions, "rows": rows}, indent=1))
    print("wrote", ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
