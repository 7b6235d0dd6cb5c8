"""``otm decode``, ``otm bench-decode`` and ``otm profile`` (registered by :func:`register` from ``otm.cli``).

    otm decode --prompt "Tell me a story" -k 8 --length 4 --verifier kseq [--scheme iid]
               [--temperature 1 --top-k 0 --top-p 1] [--max-new-tokens 64]
               [--target PATH --draft PATH] [--seed 0] [--autoregressive] [--quiet | --json]

In a terminal ``otm decode`` streams the text with the live figures on the bottom line only
(:mod:`otm.decode.stream`); piped or with ``--quiet`` stdout is the text alone and the figures go to
stderr; ``--json`` prints one object.
    otm bench-decode [--k 1,2,4,8] [--length 2,4,8] [--verifiers kseq,rrs,rrs_without_replacement,block,traversal]
                     [--max-new-tokens 64] [--prompts 8] [--no-hf]
    otm profile [--target DIR --draft DIR] [--prompts FILE] [-k 1,2,4,8] [--length 4] [--temperature 1]
                [--positions 8] [--json] [--plot DIR] [--seed 0] [--threads N] [--no-check]

All three take ``--dtype auto`` (default: bfloat16 where the CPU has native bfloat16 or the GPU
supports it, else float32; :func:`otm.decode.models.resolve_dtype`) and ``--draft-vocab auto|full|S``
(the draft proposes among the S most frequent tokens, :mod:`otm.decode.draft_vocab`; auto: 4096 for
the embedded pair, the whole vocabulary otherwise).

``otm profile`` (library: :mod:`otm.decode.profile`) answers "for my target and draft, on my
prompts, how much would k drafts and which verifier buy, and what is the ceiling alpha*?".

Models: ``--target``/``--draft`` are Hugging Face model directories; left out, the embedded pair
of :func:`otm.decode.models.load_pair` (SmolLM2-135M-Instruct and the committed draft). The prompt is
a user message passed through the tokenizer's chat template (``--raw`` feeds it as is).
Bad input raises :class:`otm.laws.OtmError` (one line; ``otm.cli.main`` prints it, exit 2).
Nothing here imports torch until a command runs.
"""

from __future__ import annotations

import sys

from ..laws import OtmError
from ..verifiers import VERIFIERS as TOKEN_VERIFIERS
from .profile import DECODABLE as PROFILE_DECODABLE
from .steps import COMPILE_CHOICES, compile_options
from .tree_registry import TREE_RULES

DEFAULT_KS = "1,2,4,8"
DEFAULT_LENGTHS = "2,4,8"
DEFAULT_VERIFIERS = "kseq,rrs,rrs_without_replacement,block,traversal"
ALL_VERIFIERS = tuple(v.name for v in TOKEN_VERIFIERS.values() if v.decode) + tuple(TREE_RULES)
"""Every verifier the decoder runs: the token-level registry's (:data:`otm.verifiers.VERIFIERS`, ``decode``) and
the tree rules (:data:`otm.decode.tree_registry.TREE_RULES`)."""
WOR_ONLY = tuple(v.name for v in TOKEN_VERIFIERS.values() if v.decode == ("without_replacement",)) + tuple(
    name for name, spec in TREE_RULES.items() if spec.schemes == ("without_replacement",))
"""Verifiers whose default scheme is ``without_replacement``."""


def _verifier_name(text: str) -> str:
    """A registered verifier name, or a tree rule with its option (``layer:kseq``)."""
    import argparse

    from .tree_registry import split_name

    if text in ALL_VERIFIERS or split_name(text)[1]:
        return text
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(ALL_VERIFIERS)}, or layer:STEP)")


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise OtmError(f"--{name} must be comma-separated whole numbers like 1,4,8, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise OtmError(f"--{name} needs whole numbers >= 1, got {text!r}")
    return values


DTYPE_HELP = ("model weights, for every contender alike (default auto: bfloat16 where the CPU has native bfloat16, "
              "avx512_bf16 / amx_bf16, or the GPU supports it; else float32)")


def _dtype_and_vocab(p) -> None:
    from .models import DTYPES

    p.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument("--draft-vocab", default="auto", metavar="S",
                   help="the draft proposes only among the S most frequent tokens (FR-Spec; exact either way): "
                        "a whole number, 'full', or auto (default: 4096 for the embedded pair, full otherwise)")


def draft_vocab_arg(text: str, embedded: bool):
    """``--draft-vocab``: None (whole vocabulary) or S (checked against V when the models load)."""
    from .draft_vocab import DEFAULT_DRAFT_VOCAB

    text = str(text).strip().lower()
    if text == "auto":
        return DEFAULT_DRAFT_VOCAB if embedded else None
    if text == "full":
        return None
    try:
        size = int(text)
    except ValueError:
        raise OtmError(f"--draft-vocab must be a whole number of tokens, 'full' or 'auto', got {text!r}") from None
    if size < 1:
        raise OtmError(f"--draft-vocab must be >= 1 token (or 'full'), got {size}")
    return size


def _common(p) -> None:
    p.add_argument("--target", default=None, help="target model directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft model directory (default: the embedded draft)")
    p.add_argument("--temperature", type=float, default=1.0, help="for both models; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens, 0 = off (default 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass, 1 = off (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    _dtype_and_vocab(p)
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--device-map", default=None, choices=["auto"],
                   help="spread a target larger than one device over the GPUs, the CPU and the disk (accelerate)")
    p.add_argument("--max-memory", default=None,
                   help="with --device-map: the memory each device may take, e.g. 0=20GiB,cpu=60GiB (default: what is free)")
    p.add_argument("--offload-folder", default=None,
                   help="with --device-map: where layers that fit nowhere go (default: OTM cache folder/offload)")
    p.add_argument("--no-progress", action="store_true", help="no live figures / progress bar")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is much faster on a busy shared CPU)")
    p.add_argument("--compile", default=None, choices=COMPILE_CHOICES,
                   help="how the step runs (default auto: whichever of the others the cost model measures fastest "
                        "here, decided once per machine and model and kept in the user cache; none: the eager step; "
                        "onednn: the eager step with the linear layers on oneDNN's prepacked GEMM (CPU, float32 or bfloat16); "
                        "int4: as onednn, the target's block layers on its GGUF's own 4-bit weights (the embedded "
                        "target); "
                        "static: the static shapes, eager kernels; a torch.compile mode: the static-shape step "
                        "compiled in that mode, once per shape)")


def register(sub) -> None:
    """Add ``decode`` and ``bench-decode`` to the ``otm`` subcommands."""
    dec = sub.add_parser("decode", help="multi-draft speculative decoding of one prompt (streams text)")
    dec.add_argument("--prompt", required=True, help="the user message")
    dec.add_argument("-k", type=_int_or_auto, default=4,
                     help="drafts per position, or auto: chosen from this machine's costs (default 4)")
    dec.add_argument("--length", "-L", type=_int_or_auto, default=4,
                     help="draft depth L, or auto: chosen from this machine's costs (default 4)")
    dec.add_argument("--verifier", default="kseq", type=_verifier_name, metavar="{" + ",".join(ALL_VERIFIERS) + "}",
                     help="verification rule (default kseq); layer:STEP runs layer verification with another "
                          "single-step verifier, e.g. layer:kseq")
    dec.add_argument("--delay", type=int, default=0,
                     help="delayed tree (DDTE): one shared draft path of this length, then the k rows branch from its "
                          "end; 0 <= delay < length (default 0: rows from the root)")
    dec.add_argument("--scheme", default=None, choices=["iid", "without_replacement"],
                     help="draft scheme (default: without_replacement for rrs_without_replacement, "
                          "kseq_without_replacement and optimal_embedded, else iid)")
    dec.add_argument("--autoregressive", action="store_true", help="sample from the target alone (baseline)")
    dec.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    dec.add_argument("--quiet", "-q", action="store_true",
                     help="stdout: the generated text only; the figures go to stderr (the default when piped)")
    dec.add_argument("--json", action="store_true", help="print one JSON object: text, tokens, stats")
    _common(dec)
    dec.set_defaults(func=cmd_decode)

    bench = sub.add_parser("bench-decode", help="block efficiency and speed table on a fixed prompt set")
    bench.add_argument("--k", default=DEFAULT_KS, help=f"drafts per position, comma-separated (default {DEFAULT_KS})")
    bench.add_argument("--length", default=DEFAULT_LENGTHS, help=f"draft depths (default {DEFAULT_LENGTHS})")
    bench.add_argument("--delay", type=int, default=0,
                       help="delayed trees for the k >= 2 rows: a shared path of this length first (lengths L > delay "
                            "only; default 0)")
    bench.add_argument("--verifiers", default=DEFAULT_VERIFIERS, help=f"verifiers for k >= 2 (traversal_without_replacement: traversal on roots drafted without "
                       f"replacement), and block for k = 1 (default {DEFAULT_VERIFIERS})")
    bench.add_argument("--prompts", type=int, default=8, help="how many of the fixed prompts (default 8, at most 8)")
    bench.add_argument("--no-hf", action="store_true", help="leave out transformers' assisted generation")
    bench.add_argument("--peer-draft", default=None,
                       help="plain causal-LM draft for the hf assisted row when --draft reads the target's features "
                            "(default then: the embedded token-only draft)")
    _common(bench)
    bench.set_defaults(func=cmd_bench)

    prof = sub.add_parser("profile", help="how much k drafts and each verifier would buy on your pair: alpha*, "
                                          "acceptance at real positions, predicted vs measured block efficiency")
    prof.add_argument("--target", default=None, help="target model directory (default: embedded SmolLM2-135M-Instruct)")
    prof.add_argument("--draft", default=None, help="draft model directory (default: the embedded draft)")
    prof.add_argument("--prompts", default=None, metavar="FILE",
                      help="text file, one prompt (user message) per line (default: the built-in set)")
    prof.add_argument("--num-prompts", type=int, default=None, metavar="N",
                      help="use the first N prompts (default: every line of FILE, or 8 of the 16 built-in prompts)")
    prof.add_argument("-k", default=DEFAULT_KS, help=f"drafts per position, comma-separated (default {DEFAULT_KS})")
    prof.add_argument("--length", "-L", type=int, default=4, help="draft depth L of the block-efficiency figures (default 4)")
    prof.add_argument("--temperature", type=float, default=1.0, help="temperature of both laws, > 0 (default 1)")
    prof.add_argument("--positions", type=int, default=8, help="positions per prompt (default 8)")
    prof.add_argument("--paths", type=int, default=200,
                      help="Monte Carlo paths per position for rrs_without_replacement where its exact sum does not fit "
                           "(default 200)")
    prof.add_argument("--verifier", default="best", choices=["best", *PROFILE_DECODABLE],
                      help="verifier of the decode check for k >= 2 (default: the best mean acceptance per k)")
    prof.add_argument("--check-prompts", type=int, default=2, help="prompts of the decode check (default 2)")
    prof.add_argument("--check-tokens", type=int, default=32, help="new tokens per prompt of the decode check (default 32)")
    prof.add_argument("--no-check", action="store_true", help="skip the decode check (no measured block efficiency)")
    prof.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    prof.add_argument("--plot", default=None, metavar="DIR", help="write profile.png and profile.svg into DIR")
    prof.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    _dtype_and_vocab(prof)
    prof.add_argument("--device", default="cpu", help="torch device (default cpu)")
    prof.add_argument("--threads", type=int, default=None,
                      help="torch CPU threads (default: torch's choice; 1 is much faster on a busy shared CPU)")
    prof.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    prof.set_defaults(func=cmd_profile)


def _sampling(args):
    from .sampling import Sampling

    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def _load(args):
    import torch

    from .models import load_pair, resolve_dtype

    if args.threads is not None:
        if args.threads < 1:
            raise OtmError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    from .allocator import keep_freed_memory

    keep_freed_memory()  # a step's large temporaries are not faulted in again every step (otm.decode.allocator)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Loading weights" bars would sit above the streamed text
    spread = {}
    if getattr(args, "device_map", None):
        from .embedded import cache_dir
        from .models import parse_max_memory

        spread = dict(device_map=args.device_map, max_memory=parse_max_memory(args.max_memory),
                      offload_folder=args.offload_folder or cache_dir() / "offload")
    elif getattr(args, "max_memory", None) or getattr(args, "offload_folder", None):
        raise OtmError("--max-memory and --offload-folder need --device-map auto")
    return load_pair(args.target, args.draft, dtype=resolve_dtype(args.dtype, args.device), device=args.device,
                     draft_vocab=draft_vocab_arg(args.draft_vocab, args.target is None and args.draft is None), **spread)


AUTO_KS = (1, 2, 4)
AUTO_LENGTHS = (1, 2, 3, 4)
"""The grid ``-k auto`` / ``--length auto`` chooses from (:mod:`otm.decode.auto`)."""


def _int_or_auto(text: str):
    """``-k`` / ``--length``: a whole number, or ``auto`` (:mod:`otm.decode.auto`)."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"must be a whole number or auto, got {text!r}") from None


def _warn_refuted(verifiers) -> None:
    """One line on stderr per refuted rule asked for: it runs (to reproduce its refutation), not losslessly."""
    from .tree_registry import refuted

    for v in verifiers:
        if refuted(v):
            print(f"otm: warning: {v} is refuted, its tokens do not follow the target's law ({refuted(v)}); "
                  "it runs to reproduce the refutation", file=sys.stderr)


def _choose_compile(args, target, draft, ids, sampling) -> str:
    """Resolve ``--compile auto`` (:mod:`otm.decode.compile_choice`) for this run's step, with ``--k/--length auto``
    for the grid's largest tree; its line on stderr when a decision was measured or read back, or when
    ``--compile auto`` was given (the default, None, says nothing about a decode too short to matter)."""
    from .bench import measure_costs
    from .compile_choice import choose

    length = 0 if args.autoregressive else max(AUTO_LENGTHS) if args.length == "auto" else args.length
    k = max(AUTO_KS) if args.k == "auto" else args.k

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    picked = choose(target, draft, list(ids), measure=measure_costs, k=k if length else 1, length=length, delay=args.delay or 0,
                    sampling=sampling, new_tokens=args.max_new_tokens, capacity=len(ids) + args.max_new_tokens, out=say)
    if picked.measured or args.compile == "auto":
        from .auto import weighs_eager

        planned = not args.autoregressive and "auto" in (args.k, args.length) and weighs_eager(picked.choice)
        say(picked.line + ("; the plan then weighs every eager step with the tree" if planned else ""))
    return picked.choice


def cmd_decode(args) -> int:
    from .bench import encode_prompt
    from .decoder import autoregressive_decode, check_delay, resolve_verifiers, speculative_decode

    sampling = _sampling(args)
    scheme = args.scheme or ("without_replacement" if args.verifier in WOR_ONLY else "iid")
    if not args.prompt.strip():
        raise OtmError("the prompt is empty: give some text with --prompt")
    auto = not args.autoregressive and "auto" in (args.k, args.length)
    if not args.autoregressive:
        for value, name in ((args.k, "k"), (args.length, "length")):
            if value != "auto" and value < 1:
                raise OtmError(f"{name} must be >= 1, got {value}")
        for k in (AUTO_KS if args.k == "auto" else (args.k,)):
            resolve_verifiers(args.verifier, scheme, k)  # refuse a bad combination before loading models
        if args.delay:
            if args.length == "auto":
                raise OtmError("--delay needs a fixed --length (not auto)")
            check_delay(args.delay, args.length, args.verifier)
    if args.max_new_tokens < 1:
        raise OtmError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    _warn_refuted([] if args.autoregressive else [args.verifier])
    target, draft, tokenizer = _load(args)
    ids = tokenizer(args.prompt)["input_ids"] if args.raw else encode_prompt(tokenizer, args.prompt)
    decided = args.compile in (None, "auto")
    if decided:
        args.compile = _choose_compile(args, target, draft, ids, sampling)
    from .onednn import for_choice

    eos = tokenizer.eos_token_id
    if auto:  # the tree, and (an eager step decided by the machine) how the step runs, by predicted tokens/s
        from .auto import kept_plan, steps_to_weigh

        steps, refine = steps_to_weigh(target, args.compile, decided)  # the winner also timed on a compiled twin
        chosen = kept_plan(target, draft, ids, ks=AUTO_KS if args.k == "auto" else (args.k,),
                           lengths=AUTO_LENGTHS if args.length == "auto" else (args.length,), verifiers=(args.verifier,),
                           scheme=scheme, sampling=sampling, seed=args.seed, compiles=steps, refine=refine,
                           say=None if args.json else lambda line: print(line, file=sys.stderr, flush=True))
        print(chosen.line(), file=sys.stderr, flush=True)
        best = chosen.best
        args.autoregressive = best is None
        if best is not None:  # at k = 1 the plan's verifier is speculative sampling (otm.decode.auto.one_draft)
            args.k, args.length, args.verifier = best.k, best.length, best.verifier
        args.compile = chosen.compile
    for_choice(args.compile, target, draft)  # onednn, int4: the models' layers swapped for the run
    import json
    import time

    from .stream import PlainView, SilentView, TerminalView, json_result

    if args.json:
        view = SilentView()
    elif args.quiet or not sys.stdout.isatty():
        view = PlainView(sys.stdout)  # stdout: the generated text only; the figures go to stderr
    else:
        view = TerminalView(sys.stdout)
    live = isinstance(view, TerminalView) and not args.no_progress
    tokens: list[int] = []
    shown = [""]
    steps = [0]
    start = time.perf_counter()

    def stream(new: list[int]) -> None:  # called once per step, i.e. once per target call
        tokens.extend(new)
        steps[0] += 1
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        if text.startswith(shown[0]):  # show what is new (a merge may rewrite the tail: wait for it)
            view.feed(text[len(shown[0]) :])
            shown[0] = text
        if live:
            rate = len(tokens) / max(time.perf_counter() - start, 1e-9)
            view.status(f"{len(tokens)}/{args.max_new_tokens} tokens, {len(tokens) / steps[0]:.2f} per target call, "
                        f"{rate:.1f} tokens/s")

    if args.autoregressive:
        g = autoregressive_decode(target, ids, sampling=sampling, max_new_tokens=args.max_new_tokens,
                                  eos_token_id=eos, seed=args.seed, on_tokens=stream, **compile_options(args.compile))
    else:
        g = speculative_decode(target, draft, ids, k=args.k, length=args.length, verifier=args.verifier, scheme=scheme,
                               delay=args.delay, sampling=sampling, max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                               seed=args.seed, on_tokens=stream, **compile_options(args.compile))
    final = tokenizer.decode(tokens, skip_special_tokens=True)
    if final.startswith(shown[0]):
        view.feed(final[len(shown[0]) :])
    view.close()
    if args.json:
        print(json.dumps(json_result(final, tokens, g.stats)))
    elif isinstance(view, TerminalView):
        print(g.stats.summary())
    else:
        print(g.stats.summary(), file=sys.stderr)
    return 0


def _dtype_name(args) -> str:
    """The dtype ``--dtype`` resolves to on this machine (``auto`` made explicit), as a name."""
    from .models import resolve_dtype

    return str(resolve_dtype(args.dtype, args.device)).removeprefix("torch.")


def cmd_bench(args) -> int:
    from .bench import PROMPTS, run_bench
    from .bench import SCHEME_VARIANTS
    from .decoder import VERIFIERS, check_delay

    ks = _int_list(args.k, "k")
    lengths = _int_list(args.length, "length")
    verifiers = [v for v in args.verifiers.replace(" ", "").split(",") if v]
    known = sorted(({v for names in VERIFIERS.values() for v in names} | set(SCHEME_VARIANTS)) - {"speculative"})
    bad = [v for v in verifiers if v not in known]
    if bad:
        raise OtmError(f"unknown verifier {bad[0]!r} for bench-decode: choose among {', '.join(known)} (k = 1 rows run anyway)")
    _warn_refuted(verifiers)
    if args.delay:
        if not 0 < args.delay < max(lengths):
            raise OtmError(f"--delay must lie in 0..{max(lengths) - 1} (below the largest --length), got {args.delay}")
        for v in verifiers:
            check_delay(args.delay, max(lengths), v)
    if not 1 <= args.prompts <= len(PROMPTS):
        raise OtmError(f"--prompts must lie in 1..{len(PROMPTS)}, got {args.prompts}")
    if args.max_new_tokens < 1:
        raise OtmError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sampling = _sampling(args)
    command = (
        f"otm bench-decode --k {','.join(map(str, ks))} --length {','.join(map(str, lengths))} "
        f"--verifiers {','.join(verifiers)} --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
        f"--temperature {args.temperature:g} --top-k {args.top_k} --top-p {args.top_p:g} --seed {args.seed} "
        f"--dtype {_dtype_name(args)} --draft-vocab {args.draft_vocab} --device {args.device}"
        + (f" --threads {args.threads}" if args.threads else "")
        + (f" --target {args.target}" if args.target else "") + (f" --draft {args.draft}" if args.draft else "")
        + (" --no-hf" if args.no_hf else "") + (f" --peer-draft {args.peer_draft}" if args.peer_draft else "")
        + (f" --compile {args.compile}" if args.compile not in (None, "auto") else "")
        + (f" --delay {args.delay}" if args.delay else "")
    )
    args.compile = args.compile or "auto"  # resolved by run_bench (otm.decode.compile_choice)
    target, draft, tokenizer = _load(args)
    from .feature_draft import FeatureDraft
    from .embedded import default_token_draft_path
    from .models import load_draft

    peer = None
    if not args.no_hf and (args.peer_draft or isinstance(draft, FeatureDraft)):
        from .models import model_dir

        path = model_dir(args.peer_draft, "peer draft") if args.peer_draft else default_token_draft_path()
        peer = load_draft(path, target)
    run_bench(target, draft, tokenizer, ks=ks, lengths=lengths, verifiers=verifiers, sampling=sampling,
              max_new_tokens=args.max_new_tokens, n_prompts=args.prompts, seed=args.seed, hf=not args.no_hf,
              peer_draft=peer, progress=not args.no_progress, command=command, compile=args.compile, delay=args.delay)
    return 0


def _describe(model, path, default: str) -> str:
    size = sum(p.numel() for p in model.parameters())
    return f"{path if path else default} ({type(model).__name__}, {size:,} parameters)"


def cmd_profile(args) -> int:
    import json
    import time

    from . import profile as pf

    ks = _int_list(args.k, "k")
    pf.check_settings(temperature=args.temperature, positions=args.positions, length=args.length, paths=args.paths,
                      check_prompts=args.check_prompts, check_tokens=args.check_tokens)
    if args.prompts is not None:
        prompts, source = pf.read_prompts(args.prompts), f"{args.prompts}"
    else:
        prompts, source = list(pf.PROMPTS), "the built-in set"
    n = args.num_prompts if args.num_prompts is not None else (len(prompts) if args.prompts else pf.DEFAULT_NUM_PROMPTS)
    if not 1 <= n <= len(prompts):
        raise OtmError(f"--num-prompts must lie in 1..{len(prompts)} ({len(prompts)} prompts in {source}), got {n}")
    source = f"the first {n} of {len(prompts)} in {source}" if n < len(prompts) else f"all of {source}"
    prompts = prompts[:n]
    command = "otm profile" + "".join(
        f" {flag} {value}" for flag, value in (
            ("--target", args.target), ("--draft", args.draft), ("--prompts", args.prompts),
            ("--num-prompts", args.num_prompts), ("-k", ",".join(map(str, ks))), ("--length", args.length),
            ("--temperature", f"{args.temperature:g}"), ("--positions", args.positions), ("--paths", args.paths),
            ("--seed", args.seed), ("--threads", args.threads))
        if value is not None) + (" --no-check" if args.no_check else "")
    start = time.perf_counter()
    target, draft, tokenizer = _load(args)
    loaded = time.perf_counter() - start
    names = {"target": _describe(target, args.target, "embedded SmolLM2-135M-Instruct"),
             "draft": _describe(draft, args.draft, "embedded draft (otm/draft_model)"),
             "prompts": source}
    result = pf.profile(target, draft, tokenizer, prompts, ks=ks, length=args.length, temperature=args.temperature,
                        positions=args.positions, paths=args.paths, seed=args.seed, check=not args.no_check,
                        check_prompts=args.check_prompts, check_tokens=args.check_tokens, verifier=args.verifier,
                        progress=not args.no_progress, names=names, eos_token_id=tokenizer.eos_token_id)
    result.conditions["command"] = command
    result.conditions["seconds"]["load"] = round(loaded, 1)
    plots = pf.plot_profile(result, args.plot) if args.plot else []
    result.conditions["plots"] = [str(p) for p in plots]
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(pf.format_profile(result, command))
        for p in plots:
            print(f"wrote {p}")
    return 0
