"""The ``otm`` command line.

    otm acceptance --target 0.5,0.3,0.2 --draft 0.2,0.2,0.6 -k 2 --scheme iid [--json]
    otm certify MODULE:FUNCTION --kind law|sampler|torch|decoder --scheme iid -k 2 [--tv 0.01] [--json]
    otm certify transformers|MODULE:FUNCTION --kind chain --layout transformers|vllm|flashinfer --length 2
    otm demo [--no-decode]
    otm decode | bench-decode | profile ...   (otm/decode/cli.py; otm[decode])

Bad input prints one line on stderr (``otm: error: ...``) and exits with status 2;
no traceback. ``otm certify`` exits with 0 when the rule is certified, 1 when it is refuted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from .laws import OtmError, check_k, check_law

EXIT_BAD_INPUT = 2
DEFAULT_MAX_LP_VARIABLES = 2_000_000
DEFAULT_MAX_TUPLES = 200_000
EXTRAS = {"torch": "torch", "transformers": "decode", "gguf": "decode", "accelerate": "decode", "safetensors": "decode"}
"""Packages of the optional layers and the extra that installs each (pyproject.toml)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message):  # pragma: no cover - exercised through main()
        raise OtmError(f"{message} (see `{self.prog} --help`)")


LAW_FILE_SUFFIXES = (".npy", ".txt", ".json", ".csv")


def parse_law(text: str, name: str) -> np.ndarray:
    """A law from ``--target``/``--draft`` text: comma-separated numbers (one law), or a file."""
    if text.endswith(LAW_FILE_SUFFIXES) or os.path.isfile(text):
        laws = read_laws(text, name)
        if laws.shape[0] != 1:
            raise OtmError(f"--{name} file {text!r} holds {laws.shape[0]} laws: this option takes one")
        return laws[0]
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise OtmError(f"--{name} must be comma-separated numbers like 0.5,0.3,0.2, got {text!r}") from None
    return check_law(values, name)


def read_laws(path: str, name: str) -> np.ndarray:
    """Laws from a file: ``.npy`` (a vector or a [rows, V] array), ``.json`` (a list, or a list of lists),
    ``.txt`` / ``.csv`` (one law per line, numbers separated by commas or spaces). Returns [rows, V],
    every row checked by :func:`otm.laws.check_law`."""
    if not os.path.isfile(path):
        raise OtmError(f"--{name} file {path!r} does not exist: give a .npy, .json or .txt file, or numbers like 0.5,0.5")
    try:
        if path.endswith(".npy"):
            arr = np.load(path, allow_pickle=False)
        elif path.endswith(".json"):
            with open(path) as f:
                arr = np.asarray(json.load(f), dtype=np.float64)
        else:
            rows = []
            with open(path) as f:
                for line in f:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        rows.append([float(x) for x in line.replace(",", " ").split()])
            if len({len(r) for r in rows}) > 1:
                raise ValueError("lines of different lengths")
            arr = np.asarray(rows, dtype=np.float64)
    except (OSError, ValueError, TypeError) as exc:
        raise OtmError(f"--{name} file {path!r} is not a law or a table of laws ({str(exc).splitlines()[0]})") from None
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.size == 0:
        raise OtmError(f"--{name} file {path!r} holds an array of shape {arr.shape}: give one law [V] or rows [n, V]")
    return np.stack([check_law(row, f"{name} row {i}" if arr.shape[0] > 1 else name) for i, row in enumerate(arr)])


def acceptance_report(
    target,
    draft,
    k: int,
    scheme_name: str,
    *,
    max_lp_variables: int = DEFAULT_MAX_LP_VARIABLES,
    max_tuples: int = DEFAULT_MAX_TUPLES,
) -> dict:
    """Optimum (closed form, and LP where it fits) and every applicable verifier's acceptance.

    Each verifier's acceptance comes from enumerating the draft tuples with its exact law (which also
    gives its law error) when at most ``max_tuples`` tuples exist, else from its closed form or exact
    formula; ``lp_optimal`` needs the LP. ``methods`` says which method gave each number. Returns the
    dictionary that ``otm acceptance --json`` prints.
    """
    from .exact import evaluate
    from .lp import count_variables, solve_lp
    from .optimum import optimal_acceptance_of
    from .schemes import make_scheme
    from .verifiers import applicable

    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    k = check_k(k)
    scheme = make_scheme(scheme_name, draft, k)
    fast = optimal_acceptance_of(scheme, target).value
    methods = {"fast": "closed form (sorted-prefix min cut)"}
    n_vars = count_variables(scheme, fold=True)
    if n_vars is not None and n_vars <= max_lp_variables:
        lp = solve_lp(scheme, target, fold=True, backend="highs", max_variables=max_lp_variables).value
        methods["lp"] = "LP (HiGHS)"
    else:
        lp = None
        size = f"{n_vars:,}" if n_vars is not None else "unknown"
        methods["lp"] = f"not built: {size} variables > --max-lp-variables {max_lp_variables:,}"
    verifiers, skipped = {}, {}
    enumerable = scheme.n_tuples() <= max_tuples
    for v in applicable(scheme):
        ev = None
        law_fits = k <= getattr(v.module, "MAX_K", k)  # a rule whose exact law has a k limit of its own
        if enumerable and law_fits and (v.name != "lp_optimal" or lp is not None):  # (optimal_embedded)
            ev = evaluate(v, scheme, target, limit=max_tuples)
        if ev is not None:
            verifiers[v.name] = {"acceptance": ev.acceptance, "law_error": ev.law_error,
                                 "method": f"enumeration of {scheme.n_tuples():,} draft tuples"}
        elif v.name == "lp_optimal":
            if lp is not None:
                verifiers[v.name] = {"acceptance": lp, "law_error": None, "method": "the LP optimum (its plan is exact)"}
            else:
                skipped[v.name] = "needs the LP, not built"
        else:
            try:
                value, method = v.acceptance(target, draft, k)
            except OtmError as e:  # optimal_without_replacement beyond its enumeration limit
                skipped[v.name] = str(e)
                continue
            verifiers[v.name] = {"acceptance": value, "law_error": None, "method": method}
    return {"scheme": scheme.name, "k": k, "V": int(target.size), "optimal": {"lp": lp, "fast": fast},
            "methods": methods, "verifiers": verifiers, "skipped": skipped}


def format_report(report: dict, V: int) -> str:
    opt = report["optimal"]["fast"]
    lp = report["optimal"]["lp"]
    names = [*report["verifiers"], *report.get("skipped", {})]
    w = max([26, *(len(n) + 1 for n in names)])  # the name column fits the longest name
    lines = [
        f"scheme {report['scheme']}, k = {report['k']}, V = {V}",
        "  optimum alpha* (LP, HiGHS)   " + (f"{lp:.9f}" if lp is not None else report["methods"]["lp"]),
        f"  optimum alpha* (closed form) {opt:.9f}",
        "",
        f"  {'verifier':<{w}}{'acceptance':>12}{'/ optimum':>11}{'law error':>12}  method",
    ]
    for name, r in report["verifiers"].items():
        ratio = r["acceptance"] / opt if opt > 0 else float("nan")
        err = f"{r['law_error']:>12.1e}" if r["law_error"] is not None else f"{'-':>12}"
        lines.append(f"  {name:<{w}}{r['acceptance']:>12.9f}{ratio:>11.4f}{err}  {r['method']}")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"  {name:<{w}}{'-':>12}{'-':>11}{'-':>12}  {why}")
    return "\n".join(lines)


def _cmd_acceptance(args) -> int:
    targets = _laws_arg(args.target, "target")
    drafts = _laws_arg(args.draft, "draft")
    if targets.shape[1] != drafts.shape[1]:
        raise OtmError(f"target has {targets.shape[1]} masses but the draft has {drafts.shape[1]}: "
                       "give laws over the same vocabulary")
    if targets.shape[0] != drafts.shape[0] and 1 not in (targets.shape[0], drafts.shape[0]):
        raise OtmError(f"--target holds {targets.shape[0]} laws and --draft {drafts.shape[0]}: give as many of each, or one")
    n = max(targets.shape[0], drafts.shape[0])
    reports = [
        acceptance_report(targets[min(i, targets.shape[0] - 1)], drafts[min(i, drafts.shape[0] - 1)], args.k,
                          args.scheme, max_lp_variables=args.max_lp_variables, max_tuples=args.max_tuples)
        for i in range(n)
    ]
    V = targets.shape[1]
    if n == 1:
        print(json.dumps(reports[0]) if args.json else format_report(reports[0], V))
        return 0
    names = list(reports[0]["verifiers"])
    mean = {"optimal": float(np.mean([r["optimal"]["fast"] for r in reports])),
            "verifiers": {v: float(np.mean([r["verifiers"][v]["acceptance"] for r in reports])) for v in names}}
    if args.json:
        print(json.dumps({"rows": reports, "mean": mean}))
        return 0
    for i, r in enumerate(reports):
        print(f"== row {i}\n{format_report(r, V)}\n")
    print(f"== mean over {n} rows: optimum {mean['optimal']:.9f}; "
          + ", ".join(f"{v} {a:.9f} ({a / mean['optimal']:.4f})" for v, a in mean["verifiers"].items()))
    return 0


def _laws_arg(text: str, name: str) -> np.ndarray:
    if text.endswith(LAW_FILE_SUFFIXES) or os.path.isfile(text):
        return read_laws(text, name)
    return parse_law(text, name)[None]


def _cmd_certify_kernel(args) -> int:
    """``--kind chain`` / ``--kind tree``: an engine's kernel in its own layout."""
    from .certify import load_rule

    if args.target is not None or args.draft is not None or args.delay is not None:
        raise OtmError(f"--target, --draft and --delay do not apply to --kind {args.kind}")
    length = 2 if args.length is None else args.length
    tv = 0.05 if args.tv is None else args.tv
    if args.kind == "chain":
        from .certify.chain import LAYOUTS, builtin_kernel, certify_chain

        if args.layout is not None and args.layout not in LAYOUTS:
            raise OtmError(f"unknown chain layout {args.layout!r}: --layout takes one of {', '.join(LAYOUTS)}")
        if ":" in args.rule:
            kernel, layout = load_rule(args.rule), args.layout
            if layout is None:
                raise OtmError(f"--kind chain needs --layout ({', '.join(LAYOUTS)}) for MODULE:FUNCTION")
        else:
            kernel, layout = builtin_kernel(args.rule)
            if args.layout is not None and args.layout != layout:
                raise OtmError(f"the built-in chain kernel {args.rule!r} is in the {layout} layout: "
                               f"give --layout {layout}")
        report = certify_chain(kernel, layout=layout, length=length, tv=tv, alpha=args.alpha, seed=args.seed,
                               name=args.rule)
    else:
        try:
            from .certify.tree_kernels import LAYOUTS as TREE_LAYOUTS, certify_tree
        except ImportError:
            raise OtmError("--kind tree needs otm.certify.tree_kernels, which this installation lacks") from None
        layout = args.layout or "generic"
        if layout not in TREE_LAYOUTS:
            raise OtmError(f"unknown tree layout {layout!r}: --layout takes one of {', '.join(TREE_LAYOUTS)}")
        kernel = load_rule(args.rule) if ":" in args.rule else args.rule
        scheme = "top_k" if args.scheme == "top" else args.scheme
        report = certify_tree(kernel, layout=layout, k=args.k, length=length, tv=tv, alpha=args.alpha,
                              seed=args.seed, scheme=scheme)
    print(report.to_json() if args.json else str(report))
    return report.exit_code


def _cmd_certify(args) -> int:
    from .certify import certify, load_rule

    if args.kind in ("chain", "tree"):
        return _cmd_certify_kernel(args)
    if args.layout is not None:
        raise OtmError("--layout applies to --kind chain and --kind tree only")
    if args.kind == "decoder" and ":" not in args.rule:  # a decoder rule by name: otm certify traversal --kind decoder
        from .decode.decoder import VERIFIERS

        known = sorted({v for names in VERIFIERS.values() for v in names})
        if args.rule not in known:
            raise OtmError(f"unknown decoder rule {args.rule!r}: name one of {', '.join(known)}, "
                           "or MODULE:NAME of a torch verifier or of a TreeRule class")
        rule = args.rule
    else:
        rule = load_rule(args.rule)
    target = parse_law(args.target, "target") if args.target is not None else None
    draft = parse_law(args.draft, "draft") if args.draft is not None else None
    if args.kind != "decoder" and (args.length is not None or args.delay is not None):
        raise OtmError("--length and --delay apply to --kind decoder only")
    if args.kind == "decoder" and (target is not None or draft is not None):
        raise OtmError("--target/--draft apply to token-level kinds (law, sampler, torch), not to --kind decoder")
    extra = {"length": args.length} if args.length is not None else {}
    if args.delay is not None:
        extra["delay"] = args.delay
    progress = not args.json and not args.no_progress and sys.stderr.isatty()
    report = certify(rule, kind=args.kind, scheme=args.scheme, k=args.k, tv=args.tv, alpha=args.alpha, seed=args.seed,
                     target=target, draft=draft, examples=args.examples, progress=progress, name=args.rule, **extra)
    print(report.to_json() if args.json else str(report))
    return report.exit_code


DEMO_CASES = [
    ("README example: K-SEQ and RRS below the iid optimum", "0.5,0.3,0.2", "0.2,0.2,0.6", 2, "iid"),
    ("same laws, drafts without replacement", "0.5,0.3,0.2", "0.2,0.2,0.6", 2, "without_replacement"),
    ("same laws, greedy drafts (Hu et al.): the optimum is 1", "0.5,0.3,0.2", "0.2,0.2,0.6", 2, "greedy"),
    ("no cover property (Sequoia): target [1,0], draft [.5,.5]", "1,0", "0.5,0.5", 2, "iid"),
    (
        "peaked 8-token laws, k = 3",
        "0.42,0.2,0.12,0.1,0.07,0.05,0.03,0.01",
        "0.3,0.3,0.05,0.15,0.1,0.04,0.04,0.02",
        3,
        "iid",
    ),
    (
        "peaked 8-token laws, k = 3, without replacement",
        "0.42,0.2,0.12,0.1,0.07,0.05,0.03,0.01",
        "0.3,0.3,0.05,0.15,0.1,0.04,0.04,0.02",
        3,
        "without_replacement",
    ),
    ("SpecHub's two drafts around the hub", "0.42,0.2,0.12,0.1,0.16", "0.5,0.2,0.1,0.1,0.1", 2, "spechub"),
]


def _cmd_demo(args) -> int:
    if args.max_new_tokens < 1:
        raise OtmError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    print("otm demo, part 1: exact optimum and exact verifier acceptance on instructive cases\n")
    for title, t, d, k, scheme in DEMO_CASES:
        target = parse_law(t, "target")
        draft = parse_law(d, "draft")
        print(f"== {title}\n   target {t}\n   draft  {d}")
        print(format_report(acceptance_report(target, draft, k, scheme), target.size))
        print()
    if args.no_decode:
        return 0
    return _demo_decode(args)


DEMO_GRID = {"ks": [1, 2, 4], "lengths": [1, 2, 3, 4], "verifiers": ["kseq"]}
"""The configurations the demo's plan chooses among (otm.decode.auto.plan: measured costs and acceptance by
depth on this machine); the table then runs autoregressive sampling, speculative sampling (k = 1) and the
chosen K-SEQ tree at the chosen depth."""


def _demo_decode(args) -> int:
    """Part 2: the machine picks k and L (costs and acceptance measured here), then a short decode of
    autoregressive sampling against speculative sampling and the chosen tree, with the measured speed-up."""
    import os

    import torch

    from .decode.auto import kept_plan, steps_to_weigh, weighs_eager
    from .decode.bench import PROMPTS, best_speculative, encode_prompt, measure_costs, run_bench
    from .decode.draft_vocab import DEFAULT_DRAFT_VOCAB
    from .decode.models import load_pair, resolve_dtype
    from .decode.sampling import Sampling

    torch.set_num_threads(1)  # measured here: one thread per process is faster and steadier on 2 cores
    from .decode.allocator import keep_freed_memory

    keep_freed_memory()  # a step's large temporaries are not faulted in again every step (otm.decode.allocator)
    dtype = resolve_dtype("auto")
    g = DEMO_GRID
    print("otm demo, part 2: SpecTr decoding with the embedded models (SmolLM2-135M-Instruct target, feature")
    print(f"draft over its {DEFAULT_DRAFT_VOCAB} most frequent tokens), every contender in {dtype}, one thread.")
    print(f"The machine picks the tree (k in {g['ks']}, L in {g['lengths']}, K-SEQ) and how the step runs, from T(n), d(b) and the acceptance")
    print("by depth measured here; then autoregressive vs k = 1 (speculative sampling) vs the chosen tree\n")
    print("loading the models (the first run converts the GGUF target into the user cache, ~30 s) ...", flush=True)
    if not sys.stderr.isatty():  # transformers' own bars redraw with carriage returns: in a log, one garbled line
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    target, draft, tokenizer = load_pair(None, None, dtype=dtype, device="cpu", draft_vocab=DEFAULT_DRAFT_VOCAB)
    name = str(dtype).removeprefix("torch.")
    sampling = Sampling()
    ids = encode_prompt(tokenizer, PROMPTS[0])
    compile = args.compile
    if compile == "auto":
        from .decode.compile_choice import choose

        picked = choose(target, draft, ids, measure=measure_costs, k=max(g["ks"]), length=max(g["lengths"]), sampling=sampling,
                        new_tokens=3 * args.prompts * args.max_new_tokens, capacity=len(ids) + args.max_new_tokens,
                        out=print)
        print(picked.line + ("; the plan then weighs every eager step with the tree" if weighs_eager(picked.choice)
                             else ""), flush=True)
        compile = picked.choice
    # an eager step (or the compiled twin of one) chosen: the plan compares every eager step here (torch's GEMM,
    # oneDNN's, the GGUF's 4-bit blocks) with the tree by predicted tokens/s, and times the winner on its compiled
    # twin too (otm.decode.auto, otm.decode.precompile)
    steps, refine = steps_to_weigh(target, compile, args.compile == "auto")
    chosen = kept_plan(target, draft, ids, ks=g["ks"], lengths=g["lengths"], verifiers=g["verifiers"],
                       sampling=sampling, compiles=steps, refine=refine, say=lambda line: print(line, flush=True))
    print(chosen.line(), flush=True)
    compile = chosen.compile
    best = chosen.best
    if best is None:
        print("\nNo tree is predicted to beat autoregressive sampling on this machine: decode autoregressively here "
              "(otm decode --autoregressive); otm bench-decode --threads 1 measures every configuration.")
        return 0
    ks = sorted({1, best.k})
    # the bench runs speculative sampling's k = 1 rows anyway: the plan's one-draft choice is one of them
    verifiers = g["verifiers"] if best.verifier == "speculative" else [best.verifier]
    command = (f"otm bench-decode --k {','.join(map(str, ks))} --length {best.length} "
               f"--verifiers {','.join(verifiers)} --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
               f"--dtype {name} --draft-vocab {DEFAULT_DRAFT_VOCAB} --no-hf --threads 1 --compile {compile}")
    rows = run_bench(target, draft, tokenizer, ks=ks, lengths=[best.length], verifiers=verifiers,
                     sampling=sampling, max_new_tokens=args.max_new_tokens, n_prompts=args.prompts, seed=0,
                     hf=False, progress=True, command=command, compile=compile)
    ar = next(r for r in rows if r.contender.kind == "autoregressive")
    top = best_speculative(rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nautoregressive: {ar.tokens_per_second:.1f} tokens/s; best speculative row: {top.contender.name}, "
          f"{top.tokens_per_second:.1f} tokens/s = {top.tokens_per_second / ar.tokens_per_second:.2f}x "
          f"autoregressive (this run, {name}, one thread, {args.prompts} prompts x {args.max_new_tokens} tokens; "
          f"predicted {best.speedup:.2f}x for {best.verifier} k={best.k} L={best.length}; "
          f"{top.tokens_per_cpu_second / ar.tokens_per_cpu_second:.2f}x in CPU time; load average {load:.2f} at the "
          f"end: other work on the machine slows every row and blurs the ratio)")
    print("\nThe full table (every verifier, k in 1,2,4,8, L in 2,4,8, transformers' generate and assisted generation):")
    print("  otm bench-decode --threads 1")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="otm", description="Optimal transport with membership cost for speculative decoding.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True
    acc = sub.add_parser("acceptance", help="optimum and verifier acceptances for one (target, draft, k, scheme)")
    acc.add_argument("--target", required=True,
                     help="target law, comma-separated (e.g. 0.5,0.3,0.2), or a file: .npy, .json, .txt/.csv "
                          "(one law, or one law per row)")
    acc.add_argument("--draft", required=True, help="draft law(s), the same way, over the same vocabulary")
    acc.add_argument("-k", type=int, default=2, help="drafts per position (default 2)")
    acc.add_argument(
        "--scheme",
        default="iid",
        choices=["iid", "without_replacement", "greedy", "spechub"],
        help="how the k drafts are drawn (default iid)",
    )
    acc.add_argument("--json", action="store_true", help="print one JSON object")
    acc.add_argument("--max-lp-variables", type=int, default=DEFAULT_MAX_LP_VARIABLES,
                     help="build the LP only up to this many variables (default 2,000,000; the closed forms need none)")
    acc.add_argument("--max-tuples", type=int, default=DEFAULT_MAX_TUPLES, help="cap on enumerated draft tuples")
    acc.set_defaults(func=_cmd_acceptance)
    cert = sub.add_parser(
        "certify", help="prove a verifier exact or refute it with its smallest counterexample (exit 0 / 1)",
        description="Certify a verifier given as MODULE:FUNCTION (an importable module or a path to a .py file). "
                    "Exit status 0: certified; 1: refuted; 2: bad input.",
    )
    cert.add_argument("rule", help="MODULE:FUNCTION, e.g. otm.verifiers.kseq:law or my_rule.py:sample; or a built-in "
                                   "name (decoder rules; chain: transformers, vllm; tree: sglang, rrs)")
    cert.add_argument("--kind", required=True, choices=["law", "sampler", "torch", "decoder", "chain", "tree"],
                      help="law: law(target, draft, drafts) -> [V]; sampler: sample(target, draft, drafts, rng) -> "
                           "token; torch: batched, signature of otm.torch verifiers; decoder: a torch verifier run "
                           "inside speculative_decode on toy models; chain / tree: an engine's kernel in its own "
                           "layout (--layout; chain built-ins: transformers, vllm)")
    cert.add_argument("--layout", default=None,
                      help="chain: transformers | vllm | flashinfer; tree: generic | sglang (default generic)")
    cert.add_argument("--scheme", default="iid", choices=["iid", "without_replacement", "greedy", "spechub", "top"],
                      help="how the k drafts are drawn (default iid)")
    cert.add_argument("-k", type=int, default=2, help="drafts per position (default 2)")
    cert.add_argument("--tv", type=float, default=None,
                      help="statistical kinds: total variation detected with power >= 0.99 "
                           "(default 0.01; decoder, chain, tree 0.05)")
    cert.add_argument("--alpha", type=float, default=1e-3,
                      help="statistical kinds: chance of refuting a valid rule (default 0.001)")
    cert.add_argument("--seed", type=int, default=0, help="seed of the draws and of the search (default 0)")
    cert.add_argument("--examples", type=int, default=300,
                      help="law kind: random pairs the hypothesis search tries after the fixed bank (default 300)")
    cert.add_argument("--target", help="check this one target law (comma-separated) instead of the bank")
    cert.add_argument("--draft", help="the draft law of that one case")
    cert.add_argument("--length", type=int, default=None,
                      help="decoder, chain and tree kinds: draft depth L (default 2)")
    cert.add_argument("--delay", type=int, default=None,
                      help="decoder kind: a delayed tree, one shared path of this many tokens before the k rows branch")
    cert.add_argument("--json", action="store_true", help="print one JSON object")
    cert.add_argument("--no-progress", action="store_true", help="no progress bar")
    cert.set_defaults(func=_cmd_certify)
    demo = sub.add_parser(
        "demo", help="the main job: acceptance tables on instructive cases, then a short decode with the embedded models"
    )
    demo.add_argument("--no-decode", action="store_true", help="only the acceptance tables (no model loading)")
    demo.add_argument("--prompts", type=int, default=4, choices=range(1, 9), metavar="N",
                      help="prompts of the fixed set to decode (1-8, default 4: with 2 the measured speed-up moved "
                           "by +-5 %% between runs)")
    demo.add_argument("--max-new-tokens", type=int, default=48, help="tokens per prompt and contender (default 48)")
    from .decode.steps import COMPILE_CHOICES

    demo.add_argument("--compile", default="auto", choices=COMPILE_CHOICES,
                      help="how every contender's step runs (default auto: eager, eager with the linear layers on "
                           "oneDNN, with the target's block layers on its GGUF's own 4-bit weights, or compiled by torch.compile, whichever the cost model measures fastest on this "
                           "machine; the first run compiles each shape once, about 30 s each on 2 cores, and the "
                           "choice is kept in the user cache)")
    demo.set_defaults(func=_cmd_demo)
    from .analysis import cli as analysis_cli
    from .decode import cli as decode_cli  # imports no torch until a command runs

    analysis_cli.register(sub)  # `otm gap` (otm/analysis/cli.py)
    decode_cli.register(sub)  # `otm decode`, `otm bench-decode`, `otm profile` (otm/decode/cli.py)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except OtmError as exc:
        print(f"otm: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:  # an optional layer's dependency is not installed
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        if getattr(args, "command", None) in ("decode", "bench-decode", "profile", "demo"):
            extra = "decode"  # the decoder needs torch and transformers both
        print(f"otm: error: this command needs {exc.name}, which is not installed: "
              f"pip install 'otm[{extra}]' (or `make test`, which installs everything)", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("otm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `otm demo | head`: the reader left, stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
