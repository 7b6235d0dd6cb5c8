"""Time per call of ``otm.torch.kseq_without_replacement`` and ``otm.torch.optimal_embedded``: the host set-up
(numpy, row by row) beside the sync-free device path (``otm.torch._rho.FORCE_DEVICE_PATH``) run on the CPU.

Run: PYTHONPATH=. OMP_NUM_THREADS=1 python analysis/bench_wor_device.py [--reps 3] [--batch 1 32] [--k 2 4]

Rows: V = 49152, LLM-like (target softmax(8 z), draft softmax(8 (0.9 z + 0.44 e))), a distinct pair per row
(so the host path builds one rule per row), drafts drawn without replacement; the median of ``--reps``
calls after one warm-up call, one torch thread. For ``kseq_without_replacement`` the device path also
reports its rows' rho against the host's (largest relative difference) and how many rows reached the
host's stop within ``ROOT_STEPS``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import otm.torch as ot
from otm.torch import _rho
from otm.torch import _wor_trials
from otm.verifiers import kseq_without_replacement as npk


def rows(batch: int, V: int, seed: int):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((batch, V))
    p = np.exp(8 * (z - z.max(1, keepdims=True)))
    q = np.exp(8 * (0.9 * z + 0.44 * rng.standard_normal((batch, V))) - 8 * z.max(1, keepdims=True))
    return torch.tensor(p / p.sum(1, keepdims=True)), torch.tensor(q / q.sum(1, keepdims=True))


def timed(fn, reps: int) -> float:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--V", type=int, default=49152)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("| verifier | batch | k | host ms | device path ms | max rel. rho diff | rows at the host's stop |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batch:
        for k in args.k:
            p, q = rows(batch, args.V, 100 * batch + k)
            g = torch.Generator().manual_seed(k)
            d = ot.sample_without_replacement(q, k, generator=g)
            for name, width in (("kseq_without_replacement", 2 * k), ("optimal_embedded", 2 * k + 1)):
                fn = ot.VERIFIERS[name]
                u = torch.rand(batch, width, generator=g, dtype=torch.float64)
                host = timed(lambda: fn(p, q, d, uniforms=u, validate=False), args.reps)
                _rho.FORCE_DEVICE_PATH = True
                try:
                    dev = timed(lambda: fn(p, q, d, uniforms=u, validate=False), args.reps)
                    extra = ["", ""]
                    if name == "kseq_without_replacement":
                        r = _wor_trials.root(p, q, k)
                        want = np.array([npk.rule(p[i].numpy(), q[i].numpy(), k).rho for i in range(batch)])
                        extra = [f"{float(np.max(np.abs(r.rho.numpy() - want) / want)):.1e}",
                                 f"{int(r.converged.sum())}/{batch}"]
                finally:
                    _rho.FORCE_DEVICE_PATH = False
                row = f"| {name} | {batch} | {k} | {1e3 * host:.0f} | {1e3 * dev:.0f} | {extra[0]} | {extra[1]} |"
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
