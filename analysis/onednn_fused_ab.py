"""oneDNN's layers alone against sibling projections (q/k/v, gate/up) and Llama's RMSNorm fused
(:func:`otm.decode.onednn.use_onednn`), A/B on two copies of the embedded target, calls interleaved.

Each round times T(1), T(5) and T(9) (the decoder's target call after a 200-token context) on both copies in
turn; medians and minima of 22 rounds after 3 of warm-up.

    PYTHONPATH=. .venv/bin/python analysis/onednn_fused_ab.py [--dtype bfloat16|float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from otm.decode import onednn
    from otm.decode.allocator import keep_freed_memory
    from otm.decode.models import load_pair
    from otm.decode.runner import Runner
    from otm.decode.tree import DraftTree, tree_inputs
    from otm.machine import machine

    keep_freed_memory()
    print(machine().line("eager step, oneDNN linears"))
    alone, _, tok = load_pair(dtype=args.dtype)
    fused, _, _ = load_pair(dtype=args.dtype)
    onednn.use_onednn(alone, fuse=False)  # every layer alone
    onednn.use_onednn(fused)
    context = tok("The quick brown fox jumps over the lazy dog. " * 20)["input_ids"][:200]
    times: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        runners = {}
        for name, model in (("alone", alone), ("fused", fused)):
            runners[name] = Runner(model, "target")
            runners[name].feed(context[:-1])
        past = runners["alone"].length()

        def call(runner, n: int) -> None:
            tree = DraftTree.from_rows([context[-1:] * (n - 1)], context[-1]) if n > 1 else DraftTree.root_only(context[-1])
            ids, positions, mask = tree_inputs(tree, context[-1:], past, dtype=runner.dtype, device=runner.device)
            runner.forward(ids, positions, mask, keep=tree.size)
            runner.truncate(past)

        for round_ in range(args.rounds):
            for n in (1, 5, 9):
                for name, runner in runners.items():
                    start = time.perf_counter()
                    call(runner, n)
                    if round_ >= 3:
                        times.setdefault((name, n), []).append(1e3 * (time.perf_counter() - start))
    for n in (1, 5, 9):
        a, b = (statistics.median(times[(name, n)]) for name in ("alone", "fused"))
        print(f"{args.dtype} T({n}) median ms: alone {a:.2f}, fused {b:.2f} (x{b / a:.3f}); minimum "
              f"{min(times[('alone', n)]):.2f} / {min(times[('fused', n)]):.2f}")


if __name__ == "__main__":
    main()
