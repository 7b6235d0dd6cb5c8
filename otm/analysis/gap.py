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
  Monte Carlo estimate of :func:`otm.verifiers.rrs_without_replacement.acceptance` (its standard error is kept in
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
``<out>/cache/<config>/<family>.jsonl`` (one JSON row per line); a rerun reads them and computes only the
missing (pair, k). ``--quick`` uses small sizes and finishes in well under a minute.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import softmax

from ..laws import OtmError, check_law
from ..verifiers.kseq import guarantee as bound  # SpecTr's guarantee, by the name the tables use
from .io import group_label, load_resume_cache, write_table  # noqa: F401  (group_label: read by the figures)

DIRICHLET = (0.1, 0.3, 1.0, 3.0)
TEMPERATURES = (0.25, 0.5, 0.7, 1.0, 1.5, 2.0)
TARGET_SCALE = 2.5  # base target logits ~ N(0, 2.5^2)
DRAFT_NOISE = 1.0  # draft logits = target logits + N(0, 1)

RATIOS = {  # name: (verifier column, optimum column, label)
    "kseq": ("kseq", "opt_iid", "K-SEQ / α*(iid)"),
    "rrs": ("rrs", "opt_iid", "RRS / α*(iid)"),
    "rrsw": ("rrsw", "opt_wo", "RRS w/o repl. / α*(w/o repl.)"),
}


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
    from ..optimum import optimal_acceptance
    from ..verifiers import greedy, kseq, rrs, rrs_without_replacement

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
    est = rrs_without_replacement.acceptance(target, draft, k, paths=paths, rng=rng)
    row.update(rrsw=est.value, rrsw_se=est.se, rrsw_method=est.method)
    return row


# ----------------------------------------------------------------------------- sweep + cache


def _cache_file(out: Path, cfg: Config, family: str, param: float) -> Path:
    return out / "cache" / cfg.key / f"{family}-{param:g}.jsonl"


def sweep(cfg: Config, out: Path, *, families=None, progress: bool = True, resume: bool = True) -> list[dict]:
    """Evaluate every (family, pair, k); rows cached per family under ``out/cache``."""
    from ..progress import bar as tqdm  # a live bar on a terminal, plain lines elsewhere

    families = families or family_names()
    todo = []
    all_rows: list[dict] = []
    for family, param in families:
        path = _cache_file(out, cfg, family, param)
        rows = list(load_resume_cache(path, lambda r: (r["index"], r["k"])).values()) if resume else []
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
        with path.open("a+") as f:  # one pair's rows at a time: resumable
            if f.tell() and (f.seek(f.tell() - 1) or f.read(1) != "\n"):
                f.write("\n")  # close a line torn by an interrupted run (it is skipped when read)
            f.writelines(json.dumps(r) + "\n" for r in new)
        all_rows.extend(new)
    return all_rows


# ----------------------------------------------------------------------------- summaries


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
    from .gap_figures import plot_ratios, plot_schemes, plot_temperature

    written += plot_ratios(ratios, out / "gap_ratio_vs_k", cond)
    written += plot_schemes(schemes, out / "scheme_optimum_vs_k", cond)
    written += plot_temperature(temps, out / "acceptance_vs_temperature", cond)
    return {"written": written, "rows": len(rows), "sweep_s": t_sweep, "total_s": time.perf_counter() - t0}
