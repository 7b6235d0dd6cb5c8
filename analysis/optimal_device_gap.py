"""Acceptance and time of the device path of ``otm.torch.optimal`` (``otm.torch._optimal_device``) beside alpha*.

The device set-up races fixed ratio groups (no refinement rounds, no value read back), so its acceptance
``sum min(x, p)`` can fall short of alpha* (``otm.optimum.optimal_acceptance``), where the numpy rule
(``otm.verifiers.optimal``, the host path) refines straddling groups until the gap is below 1e-12. Printed:

* per law family at V = 49152 (``peaked``: softmax(3 z), softmax(3 (0.9 z + 0.44 e)) as
  analysis/bench_closed_form.py; ``lognormal``: exp(3 z) and exp(3 z + e) as analysis/bench_optimal.py;
  ``dirichlet1``, ``dirichlet0.05``: independent Dirichlet rows) and k = 2, 4, 8: the largest and mean gap
  alpha* - acceptance of the device rule over ``--rows`` rows, and the numpy rule's largest gap;
* small adversarial laws (Dirichlet 0.1-3, V = 2-13, k = 2-8): the share of cases with a gap above 1e-9 and
  the largest gap;
* the time per call of ``otm.torch.optimal`` at V = 49152, float32 laws, ``validate=False``, uniforms given,
  batch 1 and 32 (distinct lognormal rows), k = 2, 4, 8: the host path (the CPU default) and the device path
  forced on the CPU (``otm.torch._rho.FORCE_DEVICE_PATH``), median of ``--reps``; with the load average.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/optimal_device_gap.py [--rows 8] [--reps 7]
        [--skip-timing | --timing-only]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np
import torch

import otm.torch as ot
from otm.optimum import optimal_acceptance
from otm.torch import _optimal_device as od
from otm.torch import _rho
from otm.verifiers import optimal as npo

V = 49152
KS = (2, 4, 8)


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def family(name: str, rng):
    z, e = rng.standard_normal(V), rng.standard_normal(V)
    if name == "peaked":
        return softmax(3 * z), softmax(3 * (0.9 * z + math.sqrt(0.19) * e))
    if name == "lognormal":
        return softmax(3 * z), softmax(3 * z + e)
    if name == "dirichlet1":
        return rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    return rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05))


def device_acceptance(p, q, k):
    P, Q = torch.from_numpy(p)[None], torch.from_numpy(q)[None]
    return float(od.acceptance(od.setup(P, Q, k), P)[0])


def gaps(rows: int) -> None:
    print("| laws (V = 49152) | k | alpha* (mean) | device gap: max | mean | numpy rule gap: max |")
    print("|---|---|---|---|---|---|")
    for name in ("peaked", "lognormal", "dirichlet1", "dirichlet0.05"):
        for k in KS:
            rng = np.random.default_rng(k)
            a, dev, host = [], [], []
            for _ in range(rows):
                p, q = family(name, rng)
                alpha = optimal_acceptance(p, q, k)
                a.append(alpha)
                dev.append(alpha - device_acceptance(p, q, k))
                host.append(alpha - npo.acceptance(p, q, k))
            print(f"| {name} | {k} | {np.mean(a):.4f} | {max(dev):.1e} | {np.mean(dev):.1e} | {max(host):.1e} |")


def small(cases: int) -> None:
    rng = np.random.default_rng(0)
    g = []
    for _ in range(cases):
        size, k = int(rng.integers(2, 14)), int(rng.integers(2, 9))
        a = rng.choice([0.1, 0.3, 1.0, 3.0])
        p, q = rng.dirichlet(np.full(size, a)), rng.dirichlet(np.full(size, a))
        g.append(optimal_acceptance(p, q, k) - device_acceptance(p, q, k))
    g = np.array(g)
    print(f"\nsmall adversarial laws ({cases} cases, Dirichlet 0.1-3, V = 2-13, k = 2-8): "
          f"gap > 1e-9 in {int((g > 1e-9).sum())}, largest {g.max():.1e}")


def timing(reps: int) -> None:
    print("\n| batch | k | host path (ms) | device path forced on the CPU (ms) |")
    print("|---|---|---|---|")
    rng = np.random.default_rng(3)
    for batch in (1, 32):
        laws = [family("lognormal", rng) for _ in range(batch)]
        P = torch.tensor(np.array([p for p, _ in laws]), dtype=torch.float32)
        Q = torch.tensor(np.array([q for _, q in laws]), dtype=torch.float32)
        for k in KS:
            d = ot.sample_iid(Q, k, generator=torch.Generator().manual_seed(0))
            u = torch.rand(batch, k + 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
            ms = []
            for force in (False, True):
                _rho.FORCE_DEVICE_PATH = force
                ot.optimal(P, Q, d, uniforms=u, validate=False)  # warm
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    ot.optimal(P, Q, d, uniforms=u, validate=False)
                    ts.append(time.perf_counter() - t0)
                ms.append(1e3 * float(np.median(ts)))
            _rho.FORCE_DEVICE_PATH = False
            print(f"| {batch} | {k} | {ms[0]:.1f} | {ms[1]:.1f} |")
    print(f"\nload average after the timing: {os.getloadavg()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--timing-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, one thread; "
          f"device groups: {od.GROUPS}\n")
    if not args.timing_only:
        gaps(args.rows)
        small(args.small)
    if not args.skip_timing:
        timing(args.reps)


if __name__ == "__main__":
    main()
