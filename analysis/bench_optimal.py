"""Set-up and per-verification time of the ``optimal`` iid verifier vs K-SEQ, and acceptance vs alpha*.

Run: PYTHONPATH=. OMP_NUM_THREADS=1 python analysis/bench_optimal.py [--reps N]
numpy only (batch 1); the torch twin is not written yet.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import numpy as np

from otm.optimum import optimal_acceptance
from otm.verifiers import kseq, optimal


def peaked(rng, V, scale=3.0, noise=1.0):
    z = rng.standard_normal(V) * scale
    p = np.exp(z - z.max())
    zd = z + rng.standard_normal(V) * noise
    q = np.exp(zd - zd.max())
    return p / p.sum(), q / q.sum()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    V = 49152
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}, "
          f"numpy {np.__version__}; V={V}; dtype float64; seed {args.seed}; batch 1 (numpy)")
    print("command:", " ".join(sys.argv))
    rng = np.random.default_rng(args.seed)
    print(f"{'scale/noise':>11} {'k':>2} {'opt setup ms':>12} {'opt verify us':>13} {'kseq setup ms':>13} "
          f"{'alpha*':>8} {'opt acc':>8} {'kseq acc':>8}")
    for scale, noise in [(2.0, 0.5), (3.0, 1.0), (4.0, 2.0)]:
        p, q = peaked(rng, V, scale, noise)
        for k in (2, 4, 8):
            t0 = time.perf_counter()
            for _ in range(args.reps):
                plan = optimal.build(p, q, k)
            t_setup = (time.perf_counter() - t0) / args.reps
            d = rng.choice(V, size=k, p=q)
            t0 = time.perf_counter()
            for _ in range(200):
                optimal._sample(plan, p, d, rng)
            t_ver = (time.perf_counter() - t0) / 200
            t0 = time.perf_counter()
            for _ in range(args.reps):
                kseq.rho_star(p, q, k)
            t_k = (time.perf_counter() - t0) / args.reps
            a = optimal_acceptance(p, q, k)
            print(f"{scale:>5}/{noise:<5} {k:>2} {t_setup*1e3:12.1f} {t_ver*1e6:13.1f} {t_k*1e3:13.1f} "
                  f"{a:8.5f} {plan.acceptance:8.5f} {kseq.acceptance(p, q, k):8.5f}")


if __name__ == "__main__":
    main()
