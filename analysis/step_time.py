"""Where a decode step's time goes on the embedded pair: per step, the target's calls, the draft's, and the time
between them (sampling, the verifier's walk, rollback, bookkeeping), for autoregressive sampling and one
speculative configuration, as the bench runs them (its prompts, ``validate=False``); then, with ``--profile N``,
cProfile's N heaviest functions of one more speculative run.

    PYTHONPATH=. .venv/bin/python analysis/step_time.py [--compile int4-compiled] [-k 1] [--length 1] [--profile 35]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", default="int4-compiled", help="a --compile choice other than auto")
    ap.add_argument("-k", type=int, default=1)
    ap.add_argument("--length", type=int, default=1)
    ap.add_argument("--verifier", default="kseq")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's N heaviest functions (0: no profile)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from otm.decode.bench import PROMPTS, encode_prompt
    from otm.decode.decoder import autoregressive_decode, speculative_decode
    from otm.decode.models import load_pair
    from otm.decode.onednn import for_choice
    from otm.decode.static import warm_all
    from otm.decode.steps import EAGER, SWAPS, compile_options, step_of

    target, draft, tokenizer = load_pair(dtype="auto", draft_vocab=4096)
    if args.compile in SWAPS:
        for_choice(args.compile, target, draft)
    step = compile_options(args.compile)
    prompts = [encode_prompt(tokenizer, p) for p in PROMPTS[: args.prompts]]
    eos = tokenizer.eos_token_id

    def speculative(seed: int, n: int):
        return [speculative_decode(target, draft, ids, k=args.k, length=args.length, verifier=args.verifier,
                                   max_new_tokens=n, seed=seed * 10 + j, validate=False, eos_token_id=eos, **step).stats
                for j, ids in enumerate(prompts)]

    def autoregressive(seed: int, n: int):
        return [autoregressive_decode(target, ids, max_new_tokens=n, seed=seed * 10 + j, validate=False,
                                      eos_token_id=eos, **step).stats for j, ids in enumerate(prompts)]

    speculative(0, 4)
    autoregressive(0, 4)
    if args.compile not in EAGER + ("static",):
        warm_all(target, draft, mode=step_of(args.compile))
    from otm.machine import machine

    print(machine().line(f"--compile {args.compile}"))
    print(f"embedded pair, bfloat16 where native, draft over 4096 tokens, --compile {args.compile}, one thread; "
          f"{args.prompts} prompts x {args.max_new_tokens} tokens, the second of two runs")
    for name, run in (("autoregressive", autoregressive), (f"{args.verifier} k={args.k} L={args.length}", speculative)):
        for r in range(2):
            stats = run(r + 1, args.max_new_tokens)
        wall = sum(s.wall_seconds for s in stats)
        target_s = sum(s.target_seconds for s in stats)
        draft_s = sum(getattr(s, "draft_seconds", 0.0) for s in stats)
        steps = sum(s.steps for s in stats)
        calls = sum(s.target_calls for s in stats)
        new = sum(s.new_tokens for s in stats)
        print(f"  {name}: {new / wall:.1f} tokens/s, {new / steps:.2f} tokens a step; per step: target "
              f"{1e3 * target_s / steps:.2f} ms ({calls} calls, prefills included), draft {1e3 * draft_s / steps:.2f} ms, "
              f"between the calls {1e3 * (wall - target_s - draft_s) / steps:.2f} ms")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        speculative(9, args.max_new_tokens)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
