"""The reports of ``otm profile``: the text (:func:`format_profile`) and the figure (:func:`plot_profile`, with
its :func:`caption`). The JSON form is :meth:`otm.decode.profile.Profile.to_json`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...laws import OtmError
from .results import METHODS, MODEL, SCHEME_OF, Profile
from .statistics import Stat

def _f(x: float, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def _ci(s: Stat, digits: int = 3) -> str:
    if s.lo != s.lo:
        return f"{_f(s.mean, digits)}"
    return f"{_f(s.mean, digits)} [{_f(s.lo, digits)}, {_f(s.hi, digits)}]"


def format_profile(p: Profile, command: str = "") -> str:
    """The text report of ``otm profile``."""
    c = p.conditions
    L = c["length"]
    out = ["otm profile: what k drafts and each verifier buy on this pair, and the ceiling alpha*"]
    if command:
        out.append(f"  command: {command}")
    out += [
        f"  target: {c['target']}",
        f"  draft:  {c['draft']}",
        f"  V = {c['V']}; {c['prompts']} prompts ({c['prompt_source']}) x {c['positions_per_prompt']} positions = "
        f"{c['positions']} positions: {c['positions_how']}; {c['laws']}; seed {c['seed']}",
        f"  alpha*: {METHODS['alpha*']}" + (f"; {c['quadrature_warnings']} quadrature warnings"
                                            if c["quadrature_warnings"] else ""),
        f"  verifiers: speculative, kseq, rrs, greedy exact closed forms; rrs_without_replacement "
        f"{METHODS['rrs_without_replacement']} ({c['paths']} paths per position); kseq_without_replacement "
        f"{METHODS['kseq_without_replacement']}",
        f"  intervals: {c['interval']}; ratio = {c['ratio']}",
        "",
        f"per-token acceptance, mean over {c['positions']} positions [95% interval]",
        f"  {'k':>3}  {'scheme':<21}{'alpha*':<23}{'verifier':<25}{'acceptance':<23}/ alpha* of its scheme",
    ]
    for r in p.rows:
        first = True
        for s, a in r.alpha.items():
            label = "iid (= every scheme)" if r.k == 1 else s
            names = [n for n, v in r.verifiers.items() if v.scheme == s]
            for j, n in enumerate(names or [None]):
                head = f"  {r.k:>3}  " if first else " " * 7
                first = False
                left = f"{label:<21}{_ci(a):<23}" if j == 0 else " " * 44
                if n is None:
                    out.append(head + left.rstrip())
                    continue
                v = r.verifiers[n]
                acc = _ci(v.acceptance)
                extra = f" (MC se {v.mc_se:.1e})" if v.mc_se else ""
                out.append(f"{head}{left}{n:<25}{acc:<23}{_ci(v.ratio, 4)}{extra}")
        for n, why in r.skipped.items():
            out.append(" " * 7 + f"{'':<44}{n:<25}skipped: {why}")
    out += ["", f"block efficiency (new tokens per target call) at L = {L}",
            f"  model: {MODEL}",
            "  ceiling: the same model at the highest mean alpha* over the schemes (no verifier of that scheme does better "
            "at depth 1; the decoder runs iid and without_replacement drafts, not greedy)"]
    if p.checks:
        out.append(f"  measured: {c['check']}; 'depth formula' = the model fed with the measured acceptance by depth")
    else:
        out.append(f"  measured: {c['check']}")
    out.append(f"  {'k':>3}  {'verifier':<25}{'predicted':<23}{'ceiling':<29}{'measured':<10}{'depth formula':<15}"
               "measured acceptance by depth (accepted/verified)")
    for r in p.rows:
        chk = p.check(r.k)
        name = r.best if chk is None else chk.verifier
        pred = r.verifiers[name].predicted_block_efficiency
        ceiling = f"{r.ceiling_block_efficiency:.2f} ({r.ceiling_scheme})"
        if chk is None:
            out.append(f"  {r.k:>3}  {name:<25}{_ci(pred, 2):<23}{ceiling:<29}{'-':<10}{'-':<15}-")
            continue
        depths = " ".join(f"{_f(a, 2)} ({acc}/{ver})" for a, acc, ver in
                          zip(chk.acceptance_by_depth, chk.accepted_by_depth, chk.verified_by_depth))
        out.append(f"  {r.k:>3}  {name:<25}{_ci(pred, 2):<23}{ceiling:<29}{_f(chk.block_efficiency, 2):<10}"
                   f"{_f(chk.depth_formula, 2):<15}{depths}")
    if p.checks:
        tokens = sum(x.new_tokens for x in p.checks)
        out += [
            f"  (measured on {tokens} tokens in all: a few, so read it as a check, not a benchmark; "
            "otm bench-decode measures at length)",
            "  Prediction and measurement differ where the draft's quality drops with depth: deeper in the tree the draft",
            "  conditions on its own drafted tokens (a feature draft also on its own guessed features), fewer than k rows",
            "  pass through an accepted node, and drafts without replacement are k distinct tokens at the root only (each",
            "  row below is a single chain verified by speculative sampling). The measured figure also counts the first call",
            "  (a feature draft drafts nothing on it), the depth cut near the token budget and EOS; the depth formula does not.",
        ]
    s = c["seconds"]
    load = f"loading the models {s['load']:.1f} s, " if "load" in s else ""
    out.append(f"\ntime: {load}laws {s['laws']:.1f} s, acceptance {s['acceptance']:.1f} s, decode check {s['check']:.1f} s; "
               f"{s['total']:.1f} s after loading")
    return "\n".join(out)


def caption(p: Profile) -> str:
    c = p.conditions
    return (f"target {c['target']}; draft {c['draft']}; V = {c['V']}; {c['prompts']} prompts x {c['positions_per_prompt']} "
            f"positions of target-sampled continuations at T = {c['temperature']:g}, float64 laws; alpha* and kseq/rrs/greedy "
            f"closed forms, rrs w/o replacement exact or Monte Carlo ({c['paths']} paths); intervals: "
            f"{c['interval'].split(' (')[0]}; block efficiency model 1 + a + ... + a^L at L = {c['length']}; "
            f"measured: {c['check']}; seed {c['seed']}.")


def plot_profile(p: Profile, out_dir) -> list[Path]:
    """``profile.png`` and ``profile.svg`` in ``out_dir``: acceptance and alpha* against k, acceptance / alpha*
    against k, and predicted vs measured block efficiency against k; the conditions in the caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...analysis.io import save_figure, wrap

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OtmError(f"--plot directory {str(out_dir)!r} cannot be created: {str(exc).splitlines()[0]}") from None
    ks = [r.k for r in p.rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colors = {"speculative": "k", "kseq": "C0", "rrs": "C1", "rrs_without_replacement": "C2", "greedy": "C3", "optimal": "C4",
              "kseq_without_replacement": "C5"}
    scheme_colors = {"iid": "C0", "without_replacement": "C2", "greedy": "C3"}

    def err(stats):
        m = np.array([s.mean for s in stats])
        lo = np.array([s.lo if s.lo == s.lo else s.mean for s in stats])
        hi = np.array([s.hi if s.hi == s.hi else s.mean for s in stats])
        # an interval can leave out its own mean by a rounding (1 - 3e-16 above 1 - 4e-16): a bar of length 0 there
        return m, np.maximum(np.vstack([m - lo, hi - m]), 0.0)

    ax = axes[0]
    for s, color in scheme_colors.items():
        sel = [r for r in p.rows if s in r.alpha]
        if sel:
            m, e = err([r.alpha[s] for r in sel])
            ax.errorbar([r.k for r in sel], m, yerr=e, fmt="--", color=color, alpha=0.6, capsize=3, label=f"α* {s}")
    for n, color in colors.items():
        sel = [r for r in p.rows if n in r.verifiers]
        if sel:
            m, e = err([r.verifiers[n].acceptance for r in sel])
            ax.errorbar([r.k for r in sel], m, yerr=e, fmt="o-", color=color, capsize=3, label=n)
    ax.set_xlabel("k (drafts per position)")
    ax.set_ylabel("mean per-token acceptance (95% interval)")
    ax.set_title("acceptance and optimum α* per scheme")
    ax.legend(fontsize=7)
    ax = axes[1]
    for n, color in colors.items():
        sel = [r for r in p.rows if n in r.verifiers]
        if sel:
            m, e = err([r.verifiers[n].ratio for r in sel])
            ax.errorbar([r.k for r in sel], m, yerr=e, fmt="o-", color=color, capsize=3,
                        label=f"{n} / α* {SCHEME_OF[n]}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k (drafts per position)")
    ax.set_ylabel("acceptance / α* of the verifier's scheme")
    ax.set_title("how close each verifier gets to its optimum")
    ax.legend(fontsize=7)
    ax = axes[2]
    m, e = err([r.verifiers[p.check(r.k).verifier if p.check(r.k) else r.best].predicted_block_efficiency for r in p.rows])
    ax.errorbar(ks, m, yerr=e, fmt="o--", color="C0", capsize=3, label="predicted: 1 + a + ... + a^L (a at depth 1)")
    ax.plot(ks, [r.ceiling_block_efficiency for r in p.rows], "^:", color="C3", label="ceiling: same model at best α*")
    if p.checks:
        ax.plot([c.k for c in p.checks], [c.block_efficiency for c in p.checks], "s-", color="k",
                label="measured (short decode)")
        ax.plot([c.k for c in p.checks], [c.depth_formula for c in p.checks], "x-", color="grey",
                label="model with measured acceptance by depth")
    ax.set_xlabel("k (drafts per position)")
    ax.set_ylabel(f"block efficiency (tokens per target call), L = {p.conditions['length']}")
    ax.set_title("predicted vs measured block efficiency")
    ax.legend(fontsize=7)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.grid(alpha=0.3)
    fig.text(0.01, -0.02, wrap(caption(p), 190), fontsize=8, va="top", ha="left")
    fig.tight_layout()
    paths = save_figure(fig, out_dir / "profile")
    plt.close(fig)
    return paths

