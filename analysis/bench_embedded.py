"""The rules for drafts without replacement at V = 49152 (``optimal_embedded``, ``kseq_without_replacement``):
time per position and acceptance vs alpha*_wor, alpha*_iid, RRSw.

Run: PYTHONPATH=. OMP_NUM_THREADS=1 python analysis/bench_embedded.py [--seeds 3] [--reps 20] [--mc 400]

Per law family, seed and k = 2, 4, 8 (numpy, float64, batch 1):

* ``setup ms``: the iid rule (``optimal.checked_rule``), what one position costs before any draft is read;
* ``verify ms``: one verification (``optimal_embedded._sample``: rest mass, walk, race, accept, the
  O(V) residual on a rejection), mean over ``--reps`` draft sets drawn without replacement;
* ``law ms``: the exact conditional law (Bell(k) walk paths), one draft set;
* acceptances: ``sel`` the selection acceptance sum min(x_iid, p) (exact), ``member`` P(output in S)
  (Rao-Blackwellised Monte Carlo over ``--mc`` draft sets, with its standard error), ``a*_iid`` and
  ``a*_wor`` the optima (closed form; race quadrature for wor), ``rrsw`` the RRSw acceptance
  (Monte Carlo, ``--mc`` paths, with its standard error);
* ``kw setup``/``kw ver`` ms and ``kseq_w``: ``kseq_without_replacement``, its set-up (K-SEQ's rho*, then
  the root search of E[N_rho] = rho, each evaluation one race quadrature), one verification
  (``_sample``: the walk's phases, the residual on a rejection; same draft sets) and its acceptance
  (beta E[N_rho], exact up to the quadrature's ~1e-13).

Laws (as ``analysis/bench_closed_form.py``): ``peaked`` softmax(3 z), softmax(3 (0.9 z + 0.44 e));
``sharp`` the same at scale 8 (a few heavy tokens: iid drafts repeat them);
``dirichlet0.05`` target and draft independent Dirichlet(0.05); ``draft-squared`` draft
Dirichlet(0.05), target proportional to its square.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time

import numpy as np
from scipy.special import softmax

from otm.optimum import optimal_acceptance
from otm.verifiers import kseq_without_replacement as kw
from otm.verifiers import optimal
from otm.verifiers import optimal_embedded as oe
from otm.verifiers import rrs_without_replacement as rrsw

V = 49152


def laws(rng):
    z, e = rng.standard_normal(V), rng.standard_normal(V)
    out = {"peaked": (softmax(3 * z), softmax(3 * (0.9 * z + math.sqrt(0.19) * e)))}
    out["sharp"] = (softmax(8 * z), softmax(8 * (0.9 * z + math.sqrt(0.19) * e)))
    out["dirichlet0.05"] = (rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05)))
    d = rng.dirichlet(np.full(V, 0.05))
    out["draft-squared"] = (d**2 / np.sum(d**2), d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mc", type=int, default=400)
    ap.add_argument("--ks", default="2,4,8")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    print(f"numpy {np.__version__}, {platform.processor() or platform.machine()}, V={V}, float64, batch 1, "
          f"1 thread; command: {' '.join(sys.argv)}")
    print(f"{'law':<14}{'seed':>4}{'k':>3}{'setup ms':>9}{'verify ms':>10}{'law ms':>8}{'sel':>8}{'member':>8}"
          f"{'(se)':>8}{'a*_iid':>8}{'a*_wor':>8}{'rrsw':>8}{'(se)':>8}{'kw setup':>9}{'kw ver':>8}{'kseq_w':>8}")
    for seed in range(args.seeds):
        for name, (p, q) in laws(np.random.default_rng(seed)).items():
            logq = np.log(q)
            for k in ks:
                rng = np.random.default_rng(100 + seed)
                t0 = time.perf_counter()
                for _ in range(3):
                    rl = optimal.checked_rule(p, q, k)
                setup = (time.perf_counter() - t0) / 3 * 1e3
                sets = [oe._wor_sample(rng, logq, k) for _ in range(args.reps)]
                t0 = time.perf_counter()
                for d in sets:
                    oe._sample(rl, p, q, d, rng)
                verify = (time.perf_counter() - t0) / len(sets) * 1e3
                t0 = time.perf_counter()
                oe._law(rl, p, q, sets[0])
                law_ms = (time.perf_counter() - t0) * 1e3
                sel = rl.acceptance
                mem = oe.membership_acceptance(p, q, k, samples=args.mc, rng=seed)
                a_iid = optimal_acceptance(p, q, k, "iid")
                a_wor = optimal_acceptance(p, q, k, "without_replacement")
                rr = rrsw.acceptance_monte_carlo(p, q, k, paths=args.mc, rng=seed)
                t0 = time.perf_counter()
                kr = kw.rule(p, q, k)
                kw_setup = (time.perf_counter() - t0) * 1e3
                t0 = time.perf_counter()
                for d in sets:
                    kw._sample(kr, d, oe.mass_outside(q, d), rng)
                kw_verify = (time.perf_counter() - t0) / len(sets) * 1e3
                print(f"{name:<14}{seed:>4}{k:>3}{setup:>9.2f}{verify:>10.3f}{law_ms:>8.2f}{sel:>8.4f}{mem.value:>8.4f}"
                      f"{mem.se:>8.1e}{a_iid:>8.4f}{a_wor:>8.4f}{rr.value:>8.4f}{rr.se:>8.1e}{kw_setup:>9.1f}"
                      f"{kw_verify:>8.3f}{kr.acceptance:>8.4f}", flush=True)


if __name__ == "__main__":
    main()
