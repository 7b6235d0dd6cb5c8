"""The embedded pair's call costs with MKL's GEMM (torch's default for float32 on a CPU) and with the linear
layers on oneDNN (``--compile onednn``, :mod:`otm.decode.onednn`), side by side in one run.

Prints the machine line, then for each GEMM the target's T(n) (ms and units of T(1)) and the draft's d(b),
each the fastest of ``--repeats`` interleaved rounds (:func:`otm.decode.bench.measure_costs`) after a
200-token context; and the LM head alone, ``[n, 576] x [576, 49152]``, best of 15.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/onednn_costs.py [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import time

import torch


def head_ms(weight: torch.Tensor, n: int, reps: int = 15) -> tuple[float, float]:
    from otm.decode.onednn import OneDnnLinear

    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    lin.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    one = OneDnnLinear(lin)
    x = torch.randn(n, weight.shape[1], dtype=weight.dtype)
    out = []
    for f in (lin, one):
        f(x)
        best = float("inf")
        for _ in range(reps):
            s = time.perf_counter()
            f(x)
            best = min(best, time.perf_counter() - s)
        out.append(best * 1e3)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from otm.decode.allocator import keep_freed_memory
    from otm.decode.bench import measure_costs
    from otm.decode.models import load_pair
    from otm.machine import machine

    keep_freed_memory()  # as the CLI runs (otm.decode.allocator)
    print(machine().line("one torch thread"))
    target, draft, tok = load_pair(dtype=args.dtype)
    print(f"embedded pair in {args.dtype}")
    context = tok("The quick brown fox jumps over the lazy dog. " * 20)["input_ids"][:200]
    sizes, batches = [1, 3, 5, 9, 17], [1, 4]
    print("| GEMM | T(1) ms | " + " | ".join(f"T({n})/T(1)" for n in sizes[1:]) + " | " +
          " | ".join(f"d({b}) ms" for b in batches) + " |")
    print("|---|---|" + "---|" * (len(sizes) - 1 + len(batches)))
    with torch.inference_mode():
        for name, choice in (("torch's own (eager)", "none"), ("oneDNN prepacked (eager)", "onednn")):
            c = measure_costs(target, draft, context, sizes, batches, repeats=args.repeats, compile=choice)
            t1 = c.target_ms[1]
            print(f"| {name} | {t1:.1f} | " + " | ".join(f"{c.target_ms[n] / t1:.2f}" for n in sizes[1:]) + " | " +
                  " | ".join(f"{c.draft_ms[b]:.2f}" for b in batches) + " |", flush=True)
        head = target.get_output_embeddings().weight
        print("\nLM head alone, ms (torch's own / oneDNN prepacked): " + ", ".join(
            "n = %d: %.1f / %.1f" % (n, *head_ms(head, n)) for n in sizes))


if __name__ == "__main__":
    main()
