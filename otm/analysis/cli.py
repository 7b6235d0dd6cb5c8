"""``otm gap``: the optimality-gap sweep from the command line (:func:`otm.analysis.gap.run`)."""

from __future__ import annotations

from pathlib import Path

from ..laws import OtmError
from .gap import QUICK, Config, run


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
