r"""Optimality gaps: each verifier's acceptance against the optimum of its draft scheme.

``otm gap`` sweeps families of (target, draft) pairs and k = 1..16, and writes
figures (PNG + SVG) and tables (CSV + Markdown):

============================== ===================================================================
output                         what
============================== ===================================================================
``gap_ratio_vs_k``             median and 5th percentile of acceptance / optimum of the scheme, per
                               family, against k, with :math:`1-(1-1/k)^k` and :math:`1-1/e` drawn
``scheme_optimum_vs_k``        median optimum of the iid, without-replacement and greedy schemes
``acceptance_vs_temperature``  median acceptances and optima against temperature (k = 2, 4, 8)
``gap_ratios``                 table: median / p5 / min of each ratio per family and k
``scheme_optimum``             table: median optima per scheme, shares where one scheme wins
``temperature``                table: median acceptances against temperature
============================== ===================================================================

Ratios, each verifier against the optimum of the scheme its drafts come from:

* ``kseq`` / :math:`\alpha^*_{iid}` and ``rrs`` / :math:`\alpha^*_{iid}` (closed forms,
  :func:`otm.verifiers.kseq.acceptance`, :func:`otm.verifiers.rrs.acceptance`);
* ``rrsw`` / :math:`\alpha^*_{wo}`: exact path sum where it fits, else the unbiased
  Monte Carlo estimate of :mod:`otm.rrsw_acceptance` (its standard error is kept in
  the rows, and the tables say which was used);
* ``greedy`` / :math:`\alpha^*_{greedy}` is 1 by construction (Hu et al.'s verifier is
  optimal for its drafts); the sweep records the largest deviation as a check.

Families (seeded, reproducible):

* ``dirichlet-a``: target and draft drawn independently from a symmetric Dirichlet(a)
  on V tokens, a in {0.1, 0.3, 1, 3} (small a = peaked laws);
* ``temperature-T``: base logits ``z_target = 2.5 g``, ``z_draft = z_target + 1.0 e``
  (``g, e`` standard normal, one base pair per index), laws ``softmax(z / T)`` for
  T in {0.25, 0.5, 0.7, 1, 1.5, 2}: the same base pairs across T.

Long sweeps are resumable: each (family, parameter) keeps its rows in
``<out>/cache/<config>/<family>.csv``; a rerun reads them and computes only the
missing (pair, k). ``--quick`` uses small sizes and finishes in well under a minute.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .laws import OtmError, check_law

DIRICHLET = (0.1, 0.3, 1.0, 3.0)
TEMPERATURES = (0.25, 0.5, 0.7, 1.0, 1.5, 2.0)
TARGET_SCALE = 2.5  # base target logits ~ N(0, 2.5^2)
DRAFT_NOISE = 1.0  # draft logits = target logits + N(0, 1)

FIELDS = [
    "family", "param", "index", "V", "k",
    "opt_iid", "opt_wo", "opt_greedy",
    "kseq", "rrs", "rrsw", "rrsw_se", "rrsw_method", "greedy",
]  # fmt: skip

RATIOS = {  # name: (verifier column, optimum column, label)
    "kseq": ("kseq", "opt_iid", "K-SEQ / α*(iid)"),
    "rrs": ("rrs", "opt_iid", "RRS / α*(iid)"),
    "rrsw": ("rrsw", "opt_wo", "RRS w/o repl. / α*(w/o repl.)"),
}


def bound(k) -> np.ndarray | float:
    """SpecTr's guarantee for K-SEQ: :math:`1 - (1 - 1/k)^k` (1 at k = 1, decreasing to 1 - 1/e)."""
    k = np.asarray(k, dtype=float)
    out = 1.0 - (1.0 - 1.0 / k) ** k
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Config:
    """One sweep's sizes. ``paths``: Monte Carlo paths for RRSw where the exact sum does not fit."""

    V: int = 100
    pairs: int = 100
    ks: tuple[int, ...] = tuple(range(1, 17))
    paths: int = 1000
    seed: int = 0

    @property
    def key(self) -> str:
        return f"V{self.V}-kmax{max(self.ks)}-paths{self.paths}-seed{self.seed}"


QUICK = Config(V=20, pairs=6, ks=tuple(range(1, 17)), paths=200, seed=0)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def family_names() -> list[tuple[str, float]]:
    return [("dirichlet", a) for a in DIRICHLET] + [("temperature", t) for t in TEMPERATURES]


def make_pair(family: str, param: float, index: int, V: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``index``-th (target, draft) pair of a family (deterministic in ``seed``)."""
    if family == "dirichlet":
        rng = np.random.default_rng([seed, 1, index, int(round(param * 1000))])
        a = np.full(V, float(param))
        return rng.dirichlet(a), rng.dirichlet(a)
    if family == "temperature":
        rng = np.random.default_rng([seed, 2, index])  # same base pair for every T
        z_t = TARGET_SCALE * rng.standard_normal(V)
        z_d = z_t + DRAFT_NOISE * rng.standard_normal(V)
        return softmax(z_t / param), softmax(z_d / param)
    raise OtmError(f"unknown family {family!r}: choose dirichlet or temperature")


def evaluate_pair(target, draft, k: int, *, paths: int, rng) -> dict:
    """Optima of the three schemes and every verifier's acceptance for one (pair, k)."""
    from . import rrsw_acceptance
    from .optimum import optimal_acceptance
    from .verifiers import greedy, kseq, rrs

    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    V = target.size
    row = {
        "opt_iid": optimal_acceptance(target, draft, k, "iid"),
        "opt_wo": optimal_acceptance(target, draft, k, "without_replacement"),
        "kseq": kseq.acceptance(target, draft, k),
        "rrs": rrs.acceptance(target, draft, k),
    }
    if k < V:
        row["opt_greedy"] = optimal_acceptance(target, draft, k, "greedy")
        row["greedy"] = greedy.acceptance(target, draft, k)
    else:
        row["opt_greedy"] = row["greedy"] = float("nan")
    est = rrsw_acceptance.acceptance(target, draft, k, paths=paths, rng=rng)
    row.update(rrsw=est.value, rrsw_se=est.se, rrsw_method=est.method)
    return row


# ----------------------------------------------------------------------------- sweep + cache


def load_resume_cache(path: Path, key) -> dict:
    """Records of a JSON-lines resume cache, by ``key(record)``; ``{}`` when there is no file.

    A line that does not parse (a run cut short mid-write) or lacks a key field is skipped,
    so the record is recomputed. Used by the resumable analysis scripts.
    """
    done = {}
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            try:
                r = json.loads(line)
                done[key(r)] = r
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return done


def _cache_file(out: Path, cfg: Config, family: str, param: float) -> Path:
    return out / "cache" / cfg.key / f"{family}-{param:g}.csv"


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = []
        for r in csv.DictReader(f):
            if len(r) != len(FIELDS) or None in r.values():
                continue  # a torn last line from an interrupted run
            rows.append(_typed(r))
        return rows


def _typed(r: dict) -> dict:
    out = {}
    for key, v in r.items():
        if key in ("family", "rrsw_method"):
            out[key] = v
        elif key in ("index", "V", "k"):
            out[key] = int(v)
        else:
            out[key] = float(v)
    return out


def sweep(cfg: Config, out: Path, *, families=None, progress: bool = True, resume: bool = True) -> list[dict]:
    """Evaluate every (family, pair, k); rows cached per family under ``out/cache``."""
    from tqdm import tqdm

    families = families or family_names()
    todo = []
    all_rows: list[dict] = []
    for family, param in families:
        path = _cache_file(out, cfg, family, param)
        rows = _read_rows(path) if resume else []
        if not resume and path.exists():
            path.unlink()
        have = {(r["index"], r["k"]) for r in rows}
        all_rows.extend(r for r in rows if r["index"] < cfg.pairs and r["k"] in cfg.ks)
        for i in range(cfg.pairs):
            missing = [k for k in cfg.ks if (i, k) not in have]
            if missing:
                todo.append((family, param, i, missing))
    bar = tqdm(todo, desc="otm gap", unit="pair", disable=not progress, leave=False)
    for family, param, i, missing in bar:
        path = _cache_file(out, cfg, family, param)
        path.parent.mkdir(parents=True, exist_ok=True)
        target, draft = make_pair(family, param, i, cfg.V, cfg.seed)
        rng = np.random.default_rng([cfg.seed, 3, i, int(round(param * 1000))])
        new = []
        for k in missing:
            row = {"family": family, "param": param, "index": i, "V": cfg.V, "k": k}
            row.update(evaluate_pair(target, draft, k, paths=cfg.paths, rng=rng))
            new.append(row)
        fresh = not path.exists()
        with path.open("a", newline="") as f:  # one pair's rows at a time: resumable
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if fresh:
                w.writeheader()
            w.writerows(new)
        all_rows.extend(new)
    return all_rows


# ----------------------------------------------------------------------------- summaries


def _group_label(family: str, param: float) -> str:
    return f"Dirichlet({param:g})" if family == "dirichlet" else f"temperature T={param:g}"


def ratio_table(rows: list[dict]) -> list[dict]:
    """Median, 5th percentile and minimum of each ratio per (family, parameter, k)."""
    out = []
    groups = sorted({(r["family"], r["param"], r["k"]) for r in rows})
    for family, param, k in groups:
        sel = [r for r in rows if r["family"] == family and r["param"] == param and r["k"] == k]
        for name, (num, den, _) in RATIOS.items():
            x = np.array([r[num] / r[den] for r in sel if r[den] > 0])
            rec = {
                "family": family, "param": param, "k": k, "ratio": name, "n": x.size,
                "median": float(np.median(x)), "p5": float(np.percentile(x, 5)), "min": float(x.min()),
                "bound": bound(k),
            }  # fmt: skip
            if name == "rrsw":
                methods = {r["rrsw_method"] for r in sel}
                rec["method"] = "exact" if methods == {"exact"} else "monte_carlo" if methods == {"monte_carlo"} else "mixed"
                rec["max_se_over_opt"] = float(max(r["rrsw_se"] / r["opt_wo"] for r in sel if r["opt_wo"] > 0))
            else:
                rec["method"] = "exact"
                rec["max_se_over_opt"] = 0.0
            out.append(rec)
    return out


def scheme_table(rows: list[dict]) -> list[dict]:
    """Median optimum of each scheme per (family, parameter, k) and how often each wins."""
    out = []
    for family, param, k in sorted({(r["family"], r["param"], r["k"]) for r in rows}):
        sel = [r for r in rows if r["family"] == family and r["param"] == param and r["k"] == k]
        iid = np.array([r["opt_iid"] for r in sel])
        wo = np.array([r["opt_wo"] for r in sel])
        gr = np.array([r["opt_greedy"] for r in sel])
        out.append({
            "family": family, "param": param, "k": k, "n": len(sel),
            "iid": float(np.median(iid)), "without_replacement": float(np.median(wo)),
            "greedy": float(np.nanmedian(gr)) if np.isfinite(gr).any() else float("nan"),
            "wo_ge_iid": float(np.mean(wo >= iid - 1e-12)),
            "greedy_gt_wo": float(np.mean(gr > wo)) if np.isfinite(gr).any() else float("nan"),
            "max_greedy_verifier_gap": float(np.nanmax(np.abs([r["greedy"] - r["opt_greedy"] for r in sel])))
            if np.isfinite(gr).any() else float("nan"),
        })  # fmt: skip
    return out


TEMPERATURE_COLUMNS = ("opt_wo", "opt_iid", "opt_greedy", "kseq", "rrs", "rrsw", "greedy")


def temperature_table(rows: list[dict], ks=(2, 4, 8)) -> list[dict]:
    """Median acceptance of each optimum and verifier against temperature."""
    out = []
    temp = [r for r in rows if r["family"] == "temperature"]
    for k in ks:
        for T in sorted({r["param"] for r in temp}):
            sel = [r for r in temp if r["param"] == T and r["k"] == k]
            if not sel:
                continue
            rec = {"k": k, "T": T, "n": len(sel)}
            for c in TEMPERATURE_COLUMNS:
                rec[c] = float(np.nanmedian([r[c] for r in sel]))
            out.append(rec)
    return out


def write_table(records: list[dict], path_stem: Path, caption: str, digits: int = 4) -> None:
    """``<stem>.csv`` and ``<stem>.md`` (a caption line, then a Markdown table)."""
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    if not records:
        raise OtmError(f"no rows for table {path_stem.name}: the sweep produced nothing")
    cols = list(records[0].keys())
    with path_stem.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(records)

    def fmt(v):
        if isinstance(v, float):
            if math.isnan(v):
                return "–"
            return f"{v:.{digits}f}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"
        return str(v)

    lines = [caption, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in records]
    path_stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- figures


def _wrap(text: str, width: int) -> str:
    return textwrap.fill(text, width)


def _save(fig, stem: Path) -> list[Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=100, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight", metadata={"Date": None})
    return paths


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
        ax.set_title(_group_label(family, param), fontsize=9)
        ax.set_xlabel("k (drafts)")
        ax.grid(alpha=0.3)
    fig.supylabel("acceptance / optimum α* of its draft scheme", fontsize=10)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].set_ylim(0.6, 1.005)
    h, lab = axes.flat[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(_wrap(f"Verifier acceptance / optimum of its draft scheme, against k. {conditions}", 160), fontsize=10)
    fig.tight_layout(rect=(0, 0.12 if nrow < 3 else 0.08, 1, 0.95))
    paths = _save(fig, stem)
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
        ax.set_title(_group_label(family, param), fontsize=9)
        ax.set_xlabel("k (drafts)")
        ax.grid(alpha=0.3)
    fig.supylabel("median optimum α*", fontsize=10)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    h, lab = axes.flat[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(_wrap(f"Which scheme is worth drawing: median optimum per draft scheme against k. {conditions}", 160), fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    paths = _save(fig, stem)
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
    fig.suptitle(_wrap(f"Acceptance against temperature (temperature family). {conditions}", 130), fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 0.93))
    paths = _save(fig, stem)
    plt.close(fig)
    return paths


# ----------------------------------------------------------------------------- run + CLI


def run(cfg: Config, out: Path, *, progress: bool = True, resume: bool = True, command: str = "otm gap") -> dict:
    """Sweep, then write every table and figure into ``out``. Returns the paths written and timings."""
    out = Path(out)
    t0 = time.perf_counter()
    rows = sweep(cfg, out, progress=progress, resume=resume)
    t_sweep = time.perf_counter() - t0
    ratios = ratio_table(rows)
    schemes = scheme_table(rows)
    temps = temperature_table(rows)
    cond = (
        f"V={cfg.V}, {cfg.pairs} pairs per family, seed {cfg.seed}; RRS w/o repl. exact where V^(k-1)*V <= 4e5, "
        f"else unbiased Monte Carlo ({cfg.paths} paths). `{command}`"
    )
    written = []
    write_table(ratios, out / "gap_ratios", f"Acceptance / optimum of its scheme. {cond}")
    write_table(schemes, out / "scheme_optimum", f"Median optimum α* per draft scheme. {cond}")
    write_table(temps, out / "temperature", f"Median acceptance against temperature (temperature family). {cond}")
    for stem in ("gap_ratios", "scheme_optimum", "temperature"):
        written += [out / f"{stem}.csv", out / f"{stem}.md"]
    written += plot_ratios(ratios, out / "gap_ratio_vs_k", cond)
    written += plot_schemes(schemes, out / "scheme_optimum_vs_k", cond)
    written += plot_temperature(temps, out / "acceptance_vs_temperature", cond)
    return {"written": written, "rows": len(rows), "sweep_s": t_sweep, "total_s": time.perf_counter() - t0}


def _cmd_gap(args) -> int:
    if args.quick:
        cfg = QUICK
    else:
        cfg = Config(V=args.V, pairs=args.pairs, ks=tuple(range(1, args.kmax + 1)), paths=args.paths, seed=args.seed)
    if cfg.V < 2 or cfg.pairs < 1 or max(cfg.ks) >= cfg.V or cfg.paths < 2:
        raise OtmError(
            f"otm gap needs V >= 2, pairs >= 1, kmax < V and paths >= 2, got V={cfg.V}, pairs={cfg.pairs}, "
            f"kmax={max(cfg.ks)}, paths={cfg.paths}"
        )
    command = "otm gap --quick" if args.quick else (
        f"otm gap --V {cfg.V} --pairs {cfg.pairs} --kmax {max(cfg.ks)} --paths {cfg.paths} --seed {cfg.seed}"
    )
    res = run(cfg, Path(args.out), progress=not args.no_progress, resume=not args.no_resume, command=command)
    print(f"otm gap: {res['rows']} rows, sweep {res['sweep_s']:.1f} s, total {res['total_s']:.1f} s")
    for p in res["written"]:
        print(f"  wrote {p}")
    return 0


def register(sub) -> None:
    """Add the ``gap`` subcommand to the ``otm`` parser's subparsers."""
    p = sub.add_parser("gap", help="optimality-gap sweeps: figures and tables of acceptance / optimum")
    p.add_argument("--quick", action="store_true", help=f"small sizes ({QUICK.V} tokens, {QUICK.pairs} pairs), < 1 min")
    p.add_argument("--out", default="docs/results", help="output folder (default docs/results)")
    p.add_argument("--V", type=int, default=Config.V, help=f"vocabulary size (default {Config.V})")
    p.add_argument("--pairs", type=int, default=Config.pairs, help=f"pairs per family (the size flag; default {Config.pairs})")
    p.add_argument("--kmax", type=int, default=16, help="largest k (default 16)")
    p.add_argument("--paths", type=int, default=Config.paths, help="Monte Carlo paths for RRS w/o replacement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true", help="ignore cached rows and recompute")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_gap)
