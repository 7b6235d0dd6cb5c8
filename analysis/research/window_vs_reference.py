"""Random stress test of the window method (otm.race_window) against the reference scan.

Draws (target, draft) pairs of nine families — Dirichlet(0.05) and Dirichlet(1), peaked softmax laws,
one dominant draft token with the rest down to 1e-15, targets proportional to the draft on groups
(ratio ties), exact zeros and 1e-12 masses, near-identical laws, a few large draft tokens among
1e-15 ones, a target correlated with a sparse draft — at V = 10^U(1, --max-log10-V) and
k = 3..8, and compares ``optimal_acceptance_of`` (the window method, the default) with
``method="reference"``: the value (a mismatch is reported above 1e-11) and whether a prefix the
window method skipped beats its value by more than 2e-13 in the reference (a pruning error; the
window method may skip prefixes within TIE = 1e-13 of its minimum). Prints the number
of cases and the largest difference.

Usage: ``python analysis/research/window_vs_reference.py [--seed 1] [--seconds 300] [--max-log10-V 3.3]``
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from scipy.special import softmax

from otm.optimum import optimal_acceptance_of
from otm.schemes import WithoutReplacement


def family(rng: np.random.Generator, V: int) -> tuple[np.ndarray, np.ndarray]:
    kind = int(rng.integers(9))
    if kind == 0:
        return rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05))
    if kind == 1:
        return rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    if kind == 2:  # peaked, the draft correlated with the target
        z = rng.standard_normal(V)
        s = rng.uniform(1, 6)
        return softmax(s * z), softmax(s * (0.9 * z + 0.44 * rng.standard_normal(V)))
    if kind == 3:  # one dominant draft token, the rest down to 1e-15
        q = rng.dirichlet(np.ones(V)) * 10 ** rng.uniform(-14, -1)
        q[rng.integers(V)] += 1
        return rng.dirichlet(np.full(V, 0.3)), q / q.sum()
    if kind == 4:  # ratio ties: target proportional to the draft on groups
        q = rng.dirichlet(np.full(V, 0.5))
        p = q * rng.choice([0, 0.5, 1, 3], 3)[rng.integers(3, size=V)]
        if p.sum() == 0:
            p = q.copy()
        return p / p.sum(), q
    if kind == 5:  # exact zeros and 1e-12 masses
        q = rng.dirichlet(np.full(V, 0.3))
        q[rng.random(V) < 0.3] = 0
        q[rng.random(V) < 0.3] = 1e-12
        p = rng.dirichlet(np.full(V, 0.3))
        p[rng.random(V) < 0.3] = 0
        if q.sum() == 0:
            q[0] = 1
        if p.sum() == 0:
            p[0] = 1
        return p / p.sum(), q / q.sum()
    if kind == 6:  # near-identical laws
        q = rng.dirichlet(np.full(V, rng.uniform(0.05, 2)))
        p = np.abs(q * (1 + rng.uniform(0, 1e-3) * rng.standard_normal(V)))
        return p / p.sum(), q
    if kind == 7:  # one large draft token among masses of 1e-15
        q = np.full(V, 1e-15) * rng.uniform(0.1, 10, V)
        q[rng.integers(V)] = 1.0
        return rng.dirichlet(np.full(V, 0.2)), q / q.sum()
    q = rng.dirichlet(np.full(V, 0.05))  # a target correlated with a sparse draft
    p = 0.5 * q + 0.5 * rng.dirichlet(np.full(V, 0.05))
    return p / p.sum(), q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--max-log10-V", type=float, default=3.3)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    n = bad = 0
    worst, worst_case = 0.0, None
    while time.perf_counter() - t0 < args.seconds:
        V = int(10 ** rng.uniform(1, args.max_log10_V))
        k = int(rng.integers(3, 9))
        p, q = family(rng, V)
        if np.count_nonzero(q) < k:
            continue
        scheme = WithoutReplacement(q, k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast = optimal_acceptance_of(scheme, p)
            ref = optimal_acceptance_of(scheme, p, method="reference")
        n += 1
        d = abs(fast.value - ref.value)
        skipped = np.isnan(fast.prefix_values)
        unsound = bool(np.any(ref.prefix_values[skipped] < fast.value - 2e-13))  # beats it beyond TIE
        if d > worst:
            worst, worst_case = d, (V, k, fast.method)
        if d > 1e-11 or unsound:
            bad += 1
            print(f"MISMATCH case {n}: V={V} k={k} |diff|={d:.2e} unsound pruning={unsound} {fast.method}: {fast.note}")
    print(f"seed {args.seed}, {time.perf_counter() - t0:.0f} s: {n} cases, {bad} mismatches, "
          f"largest |window - reference| {worst:.1e} at (V, k, method) = {worst_case}")


if __name__ == "__main__":
    main()
