"""The precompiled step's attention over a window of the cache (``otm.decode.static.window``) against the whole cache:
T(n), one target call on n positions after a context, the same graph both ways, calls interleaved, medians.

The graph of ``--compile int4-compiled`` takes its mask's width as a dynamic size, so the one graph per size serves
both: ``window``, the decoder's, reads the first ``window(used + n)`` slots (a multiple of 64); ``whole`` reads every
slot of the cache, as the step did before windows (its cost grew with ``--max-new-tokens``, which sets the capacity).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/window_ab.py [--capacity 512] [--context 66] [--sizes 1,2,3,5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from analysis.int4_ab import interleaved_calls, swapped_target


class Windowed:
    """One runner, called with the step's window set to ``window`` (a function of needed slots and capacity)."""

    def __init__(self, runner, window):
        self.runner, self.window = runner, window
        self.dtype, self.device = runner.dtype, runner.device

    def forward(self, *args, **kwargs):
        import otm.decode.static as static

        real = static.window
        static.window = self.window
        try:
            return self.runner.forward(*args, **kwargs)
        finally:
            static.window = real

    def truncate(self, length: int) -> None:
        self.runner.truncate(length)

    def length(self) -> int:
        return self.runner.length()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=512, help="cache slots (the decoder's: prompt + new tokens, "
                    "rounded up to 512; default 512)")
    ap.add_argument("--context", type=int, default=66, help="context tokens before the call (default 66)")
    ap.add_argument("--sizes", default="1,2,3,5", help="positions per call (default 1,2,3,5)")
    ap.add_argument("--rounds", type=int, default=25, help="interleaved rounds; the first 3 are not counted")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import otm.decode.static as static
    from otm.decode.static import StaticRunner

    sizes = tuple(int(s) for s in args.sizes.split(","))
    target, context = swapped_target("the GGUF's 4-bit blocks compiled ahead of time", args.context)
    with torch.inference_mode():
        runner = StaticRunner(target, "target", capacity=args.capacity, buckets=sizes, compile="precompiled")
        runner.feed(context[:-1])
        start = time.perf_counter()
        runner.warm()
        print(f"{len(sizes)} sizes ready in {time.perf_counter() - start:.0f} s")
        runners = {"window": Windowed(runner, static.window), "whole": Windowed(runner, lambda needed, capacity: capacity)}
        times = interleaved_calls(runners, context, sizes, args.rounds)
    for n in sizes:
        w, a = (statistics.median(times[(name, n)]) for name in ("window", "whole"))
        print(f"capacity {args.capacity}, T({n}) after {args.context} tokens, median ms: window of "
              f"{static.window(args.context - 1 + n, args.capacity)} slots {w:.2f}, whole cache {a:.2f} ({w / a:.2f})")


if __name__ == "__main__":
    main()
