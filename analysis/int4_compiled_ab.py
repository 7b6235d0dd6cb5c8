"""The embedded target on its GGUF's 4-bit blocks, eager (``--compile int4``) against the compiled static step
(``--compile int4-compiled``, compiled ahead of time: :mod:`otm.decode.precompile`) and the same step under dynamo
with freezing (``compile="default"``): T(n), a decoder call on n positions after a context, calls interleaved,
medians.

One swapped copy of the target serves both: a :class:`~otm.decode.runner.Runner` (transformers' growing cache) and a
:class:`~otm.decode.static.StaticRunner` compiled by inductor (the decoder's static step: 512 cache slots, one graph per
size; the first run compiles, about 27 s a size on 2 cores, later processes trace again, 15-17 s a size), and a
:class:`~otm.decode.static.StaticRunner` compiled ahead of time (about 20 s a size once, loaded in about 1-2 s later).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/int4_compiled_ab.py [--context 66] [--rounds 25]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from analysis.int4_ab import interleaved_calls, swapped_target

SIZES = (1, 2, 3, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=66, help="context tokens before the call (default 66)")
    ap.add_argument("--rounds", type=int, default=25, help="interleaved rounds; the first 3 are not counted")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from otm.decode.runner import Runner
    from otm.decode.static import StaticRunner

    target, context = swapped_target("the GGUF's 4-bit blocks, eager against the compiled static step", args.context)
    with torch.inference_mode():
        runners = {"eager": Runner(target, "target"),
                   "compiled": StaticRunner(target, "target", capacity=512, buckets=SIZES, compile="default"),
                   "precompiled": StaticRunner(target, "target", capacity=512, buckets=SIZES, compile="precompiled")}
        for r in runners.values():
            r.feed(context[:-1])
        for name in ("compiled", "precompiled"):
            start = time.perf_counter()
            runners[name].warm()
            print(f"{name}: {len(SIZES)} sizes ready in {time.perf_counter() - start:.0f} s")
        times = interleaved_calls(runners, context, SIZES, args.rounds)
    for n in SIZES:
        e, c, p = (statistics.median(times[(name, n)]) for name in ("eager", "compiled", "precompiled"))
        print(f"T({n}) after {args.context} tokens, median ms: eager {e:.2f}, compiled (dynamo, frozen) {c:.2f} "
              f"({c / e:.2f}), compiled ahead of time {p:.2f} ({p / e:.2f})")


if __name__ == "__main__":
    main()
