"""Set-up and per-verification time of the ``optimal`` iid verifier vs K-SEQ, and acceptance vs alpha*.

Run: PYTHONPATH=. OMP_NUM_THREADS=1 python analysis/bench_optimal.py [--reps N] [--part numpy|torch|all]

numpy part: batch 1, the grouped set-up (``optimal.rule``, what the rule uses), the token-level
set-up (``optimal.build_tokens``, the reference construction) and one verification. torch part:
``otm.torch.optimal`` beside ``otm.torch.kseq`` per batched call at V = 49152, k = 2, 4, 8, batch 1
and 32 (distinct peaked rows), torch CPU, float32 laws, ``validate=False``; the optimal set-up
(``otm.torch._optimal._plans``: the grouped rules of all rows, solved together) is also timed alone.
``analysis/bench_verify.py --optimal-only`` gives the per-position / per-row figures of the goal.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
from scipy.special import softmax

from otm.optimum import optimal_acceptance
from otm.verifiers import kseq, optimal


def peaked(rng, V, scale=3.0, noise=1.0):
    z = rng.standard_normal(V) * scale
    zd = z + rng.standard_normal(V) * noise
    return softmax(z), softmax(zd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--part", choices=["numpy", "torch", "all"], default="all")
    args = ap.parse_args()
    if args.part in ("numpy", "all"):
        numpy_part(args)
    if args.part in ("torch", "all"):
        torch_part(args)


def torch_part(args) -> None:
    import torch

    import otm.torch as ot
    from otm.torch import _optimal

    V = 49152
    torch.set_num_threads(1)
    print(f"\ntorch {torch.__version__} CPU, {torch.get_num_threads()} thread; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; V={V}; laws float32 (peaked: scale 3, noise 1, a fresh pair per row); "
          f"validate=False; seed {args.seed}; reps {args.reps} (batch 1) / 1 (batch 32) after one warm-up call")
    print("command:", " ".join(sys.argv))
    print(f"{'batch':>5} {'k':>2} {'optimal ms/call':>15} {'of which set-up':>15} {'kseq ms/call':>12} {'ratio':>6}")
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    for batch in (1, 32):
        pairs = [peaked(rng, V, 3.0, 1.0) for _ in range(batch)]
        p = torch.tensor(np.array([a for a, _ in pairs]), dtype=torch.float32)
        q = torch.tensor(np.array([b for _, b in pairs]), dtype=torch.float32)
        reps = args.reps if batch == 1 else 1
        for k in (2, 4, 8):
            d = ot.sample_iid(q, k, generator=gen)

            def timed(f):
                f()  # warm-up
                t0 = time.perf_counter()
                for _ in range(reps):
                    f()
                return (time.perf_counter() - t0) / reps * 1e3

            t_opt = timed(lambda: ot.optimal(p, q, d, generator=gen, validate=False))
            p64 = (p.double() / p.double().sum(-1, keepdim=True)).numpy()
            q64 = (q.double() / q.double().sum(-1, keepdim=True)).numpy()  # as otm.torch.optimal passes them
            t_setup = timed(lambda: _optimal._plans(p64, q64, d.numpy(), k))
            t_kseq = timed(lambda: ot.kseq(p, q, d, generator=gen, validate=False))
            print(f"{batch:>5} {k:>2} {t_opt:15.1f} {t_setup:15.1f} {t_kseq:12.2f} {t_opt / t_kseq:6.1f}", flush=True)


def numpy_part(args) -> None:
    V = 49152
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}, "
          f"numpy {np.__version__}; V={V}; dtype float64; seed {args.seed}; batch 1 (numpy)")
    print("command:", " ".join(sys.argv))
    rng = np.random.default_rng(args.seed)
    print(f"{'scale/noise':>11} {'k':>2} {'rule ms':>8} {'tokens ms':>9} {'verify us':>9} {'kseq setup ms':>13} "
          f"{'alpha*':>8} {'opt acc':>8} {'gap':>8} {'kseq acc':>8}")
    for scale, noise in [(2.0, 0.5), (3.0, 1.0), (4.0, 2.0)]:
        p, q = peaked(rng, V, scale, noise)
        for k in (2, 4, 8):
            optimal.rule(p, q, k)  # warm-up (scipy import)
            t0 = time.perf_counter()
            for _ in range(args.reps):
                rl = optimal.rule(p, q, k)
            t_rule = (time.perf_counter() - t0) / args.reps
            t0 = time.perf_counter()
            optimal.build_tokens(p, q, k)
            t_tok = time.perf_counter() - t0
            d = rng.choice(V, size=k, p=q)
            t0 = time.perf_counter()
            for _ in range(200):
                optimal._sample_rule(rl, d, rng)
            t_ver = (time.perf_counter() - t0) / 200
            t0 = time.perf_counter()
            for _ in range(args.reps):
                kseq.rho_star(p, q, k)
            t_k = (time.perf_counter() - t0) / args.reps
            a = optimal_acceptance(p, q, k)
            print(f"{scale:>5}/{noise:<5} {k:>2} {t_rule*1e3:8.2f} {t_tok*1e3:9.1f} {t_ver*1e6:9.1f} {t_k*1e3:13.2f} "
                  f"{a:8.5f} {rl.acceptance:8.5f} {a - rl.acceptance:8.1e} {kseq.acceptance(p, q, k):8.5f}")


if __name__ == "__main__":
    main()
