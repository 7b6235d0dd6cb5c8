"""The 4-bit GEMMs of the target's 30 blocks on M rows: torch's kernel against inductor's generated ones.

What a tree of M positions costs in the block layers of ``--compile int4`` / ``int4-compiled`` (the embedded target's
four GEMMs a layer, siblings merged: q/k/v 960 x 576, o 576 x 576, gate/up 3072 x 576, down 576 x 1536; group 32, as the
GGUF's Q4_1 blocks), with random 4-bit weights and nothing else of the model (no attention, norms or head):

* ``eager``: ``torch.ops.aten._weight_int4pack_mm_for_cpu``, what otm calls (it decodes the weights once per 4 rows);
* ``autotune``: the same graph compiled by inductor with weight freezing and ``max_autotune``, which lowers each GEMM
  to its C++ templates where they apply (``CppMicroGemmWoQInt4Avx512``, and ``CppMicroGemmWoQInt4Amx`` on CPUs with
  AMX) or keeps torch's kernel, whichever its autotuning times faster, per shape.

Prints T(M) in ms and in units of T(1), fastest of ``--rounds`` interleaved rounds. The templates need the weights as
graph constants (freezing), which the ahead-of-time step (``otm/decode/precompile.py``) cannot save; this measures
whether they would be worth it. One thread:

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/int4_kernels.py --mode eager|autotune [--rows 1,2,3,5,9,17]
"""

from __future__ import annotations

import argparse
import time

import torch

GROUP = 32
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def packed(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random 4-bit weights [n, k] in torch's CPU layout, and bfloat16 scales and zeros per group of 32."""
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    scale_zero = (torch.randn(k // GROUP, n, 2, generator=gen) * 0.01).to(torch.bfloat16)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), scale_zero


class Blocks(torch.nn.Module):
    """The block layers' GEMMs in the order a layer calls them (the weights as buffers, so freezing folds them)."""

    def __init__(self, layers: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.layers = layers
        for i in range(layers):
            for name, (n, k) in SHAPES.items():
                w, sz = packed(n, k, gen)
                self.register_buffer(f"w{i}_{name}", w)
                self.register_buffer(f"s{i}_{name}", sz)

    def mm(self, x: torch.Tensor, i: int, name: str) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, getattr(self, f"w{i}_{name}"), GROUP,
                                                          getattr(self, f"s{i}_{name}"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.layers):
            a = self.mm(x, i, "qkv")[:, :576].contiguous()
            x = x + self.mm(a, i, "o")
            g = self.mm(x, i, "gate_up")
            h = (torch.nn.functional.silu(g[:, :1536]) * g[:, 1536:]).contiguous()
            x = x + self.mm(h, i, "down")
        return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("eager", "autotune"), default="eager")
    ap.add_argument("--rows", default="1,2,3,5,9,17", help="M, the rows of each call (comma-separated)")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [int(m) for m in args.rows.split(",")]
    model = Blocks(args.layers).eval()
    if args.mode == "autotune":
        import torch._inductor.config as inductor

        inductor.freezing = True
        inductor.max_autotune = True
        inductor.max_autotune_gemm_backends = "CPP,ATEN"
    calls = {}
    with torch.no_grad():
        for m in rows:
            x = torch.randn(m, 576).to(torch.bfloat16)
            if args.mode == "eager":
                calls[m] = model
                continue
            torch._dynamo.reset()
            t0 = time.perf_counter()
            calls[m] = torch.compile(model, dynamic=False)
            calls[m](x)
            print(f"compiled M = {m} in {time.perf_counter() - t0:.1f} s", flush=True)
        best = {m: float("inf") for m in rows}
        for _ in range(args.rounds):
            for m in rows:
                x = torch.randn(m, 576).to(torch.bfloat16)
                t0 = time.perf_counter()
                calls[m](x)
                best[m] = min(best[m], time.perf_counter() - t0)
    from otm.machine import machine

    print(machine().line(f"{args.mode}: {args.layers} layers' 4-bit GEMMs, bfloat16 rows, fastest of {args.rounds} "
                         f"rounds, torch {torch.__version__}"))
    for m in rows:
        print(f"  T({m}) {best[m] * 1e3:7.2f} ms  {best[m] / best[rows[0]]:5.2f} T({rows[0]})")


if __name__ == "__main__":
    main()
