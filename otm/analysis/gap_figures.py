"""The figures of ``otm gap``: ratio to the optimum against k, scheme optima against k, acceptance
against temperature (PNG + SVG, labelled axes, conditions in the caption)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..verifiers.kseq import guarantee as bound
from .io import group_label, save_figure, wrap


STYLE = {"kseq": ("C0", "K-SEQ / α*(iid)"), "rrs": ("C1", "RRS / α*(iid)"), "rrsw": ("C2", "RRS w/o repl. / α*(w/o)")}


def plot_ratios(table: list[dict], stem: Path, conditions: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["family"], r["param"]) for r in table})
    ncol = 5
    nrow = math.ceil(len(groups) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.8 * nrow), sharey=True, squeeze=False)
    kk = np.arange(1, 17)
    for ax, (family, param) in zip(axes.flat, groups):
        for name, (color, label) in STYLE.items():
            sel = sorted((r for r in table if (r["family"], r["param"], r["ratio"]) == (family, param, name)), key=lambda r: r["k"])
            ks = [r["k"] for r in sel]
            ax.plot(ks, [r["median"] for r in sel], "-", color=color, label=f"{label} median")
            ax.plot(ks, [r["p5"] for r in sel], "--", color=color, label=f"{label} 5th pct")
        ax.plot(kk, bound(kk), ":", color="k", label="1-(1-1/k)^k (K-SEQ bound)")
        ax.axhline(1 - 1 / math.e, color="grey", lw=0.8, label="1-1/e")
        ax.set_title(group_label(family, param), fontsize=9)
        ax.set_xlabel("k (drafts)")
        ax.grid(alpha=0.3)
    fig.supylabel("acceptance / optimum α* of its draft scheme", fontsize=10)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].set_ylim(0.6, 1.005)
    h, lab = axes.flat[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(wrap(f"Verifier acceptance / optimum of its draft scheme, against k. {conditions}", 160), fontsize=10)
    fig.tight_layout(rect=(0, 0.12 if nrow < 3 else 0.08, 1, 0.95))
    paths = save_figure(fig, stem)
    plt.close(fig)
    return paths


def plot_schemes(table: list[dict], stem: Path, conditions: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["family"], r["param"]) for r in table})
    ncol = 5
    nrow = math.ceil(len(groups) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.8 * nrow), squeeze=False)
    for ax, (family, param) in zip(axes.flat, groups):
        sel = sorted((r for r in table if (r["family"], r["param"]) == (family, param)), key=lambda r: r["k"])
        ks = [r["k"] for r in sel]
        for col, style, label in (
            ("without_replacement", "-", "α* without replacement"),
            ("iid", "--", "α* iid"),
            ("greedy", "-.", "α* greedy (top k-1 + 1)"),
        ):
            ax.plot(ks, [r[col] for r in sel], style, label=label)
        ax.set_title(group_label(family, param), fontsize=9)
        ax.set_xlabel("k (drafts)")
        ax.grid(alpha=0.3)
    fig.supylabel("median optimum α*", fontsize=10)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    h, lab = axes.flat[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(wrap(f"Which scheme is worth drawing: median optimum per draft scheme against k. {conditions}", 160), fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    paths = save_figure(fig, stem)
    plt.close(fig)
    return paths


def plot_temperature(table: list[dict], stem: Path, conditions: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = sorted({r["k"] for r in table})
    fig, axes = plt.subplots(1, len(ks), figsize=(4.2 * len(ks), 3.4), sharey=True, squeeze=False)
    labels = {
        "opt_wo": ("C2", "-", "α* w/o repl."), "opt_iid": ("C0", "-", "α* iid"),
        "opt_greedy": ("C3", "-", "α* greedy = greedy verifier"),
        "kseq": ("C0", "--", "K-SEQ"), "rrs": ("C1", "--", "RRS"), "rrsw": ("C2", "--", "RRS w/o repl."),
    }  # fmt: skip
    for ax, k in zip(axes[0], ks):
        sel = sorted((r for r in table if r["k"] == k), key=lambda r: r["T"])
        Ts = [r["T"] for r in sel]
        for col, (color, style, label) in labels.items():
            ax.plot(Ts, [r[col] for r in sel], style, color=color, marker="o", ms=3, label=label)
        ax.set_title(f"k = {k}", fontsize=9)
        ax.set_xlabel("temperature T (both laws)")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("median acceptance")
    h, lab = axes[0, 0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=6, fontsize=8)
    fig.suptitle(wrap(f"Acceptance against temperature (temperature family). {conditions}", 130), fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 0.93))
    paths = save_figure(fig, stem)
    plt.close(fig)
    return paths
