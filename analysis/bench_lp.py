"""Benchmark of the exact OTM LP (otm.lp.solve_lp) against POT's network simplex.

For each (V, k) and scheme, a Dirichlet(1) target and draft are drawn with a
fixed seed; every method is called once to warm up, then ``--repeats`` rounds
call every method once each (interleaved, so a slow spell of a shared machine
hits all methods alike). The table gives the median and range of the wall
times and the value each method found, so one sees they agree.

Methods
-------
cvxpy unfolded / cvxpy folded
    ``solve_lp(..., backend="cvxpy", fold=False/True)``: the general cvxpy formulation.
highs unfolded / highs folded
    ``solve_lp(..., backend="highs", fold=False/True)``: the CSC matrix passed to highspy.
pot folded
    ``solve_lp(..., backend="pot", fold=True)``: the folded LP as a sparse min-cost flow
    (one dummy row, one dummy token) for POT's network simplex.
pot emd2 dense tuples
    ``1 - ot.emd2(P, target, M)`` on the dense ordered-tuple problem (V^k x V,
    ``M[s, y] = 1[y not in tuple s]``); the time is the ``emd2`` call only (the
    enumeration and ``M`` are built outside the timer; their time is listed apart).

LP times are ``LPResult.seconds``: the whole call (rows of the scheme, matrix
build, solve, plan repair and dual bound). ``closed form`` is the sort-by-ratio prefix
formula of Hu et al. (docs/theory.md section 2; iid only), an independent check of the values.

Usage: ``.venv/bin/python analysis/bench_lp.py [--repeats 5] [--seed 0]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import cvxpy
import highspy
import numpy as np
import ot

from otm.lp import solve_lp
from otm.schemes import IID, WithoutReplacement

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a project dependency
    tqdm = None

CASES = [
    ("iid", 8, 3),
    ("iid", 16, 3),
    ("iid", 32, 3),
    ("iid", 10, 4),
    ("without_replacement", 16, 3),
    ("without_replacement", 10, 4),
]
LP_METHODS = {
    "iid": [("cvxpy", False), ("cvxpy", True), ("highs", False), ("highs", True), ("pot", True)],
    "without_replacement": [("cvxpy", True), ("highs", True), ("pot", True)],
}
DENSE_POT = ("pot-dense", None)
SCHEMES = {"iid": IID, "without_replacement": WithoutReplacement}


def closed_form_iid(target: np.ndarray, draft: np.ndarray, k: int) -> float:
    """alpha* = 1 + min_j [p(H_j) - q(H_j)^k], H_j = first j tokens by target/draft ascending."""
    ratio = np.divide(target, draft, out=np.full_like(target, np.inf), where=draft > 0)
    order = np.argsort(ratio, kind="stable")
    p_prefix = np.concatenate([[0.0], np.cumsum(target[order])])
    q_prefix = np.concatenate([[0.0], np.cumsum(draft[order])])
    return float(1.0 + np.min(p_prefix - np.minimum(q_prefix, 1.0) ** k))


def pot_problem(scheme):
    tuples, probs = scheme.enumerate()
    M = np.ones((tuples.shape[0], scheme.V))
    for j in range(scheme.k):
        M[np.arange(tuples.shape[0]), tuples[:, j]] = 0.0
    return probs, M


def method_runner(scheme, target, method):
    """A zero-argument callable returning (seconds, value, note) for one run of ``method``."""
    if method == DENSE_POT:
        t = time.perf_counter()
        probs, M = pot_problem(scheme)
        build = time.perf_counter() - t
        note = f"M {probs.size:,}x{scheme.V}, built in {build:.3f} s (not timed)"

        def run():
            t = time.perf_counter()
            value = 1.0 - float(ot.emd2(probs, target, M, numItermax=10_000_000))
            return time.perf_counter() - t, value, note

        return run
    backend, fold = method

    def run():
        res = solve_lp(scheme, target, backend=backend, fold=fold)
        gap = res.dual_bound - res.value if res.dual_bound is not None else float("nan")
        return res.seconds, res.value, f"{res.n_variables:,} vars, dual gap {gap:.0e}"

    return run


def conditions(args) -> list[str]:
    return [
        f"- machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores (affinity {len(os.sched_getaffinity(0))})",
        f"- python {platform.python_version()}, numpy {np.__version__}, cvxpy {cvxpy.__version__}, "
        f"highspy {highspy.Highs().version()}, POT {ot.__version__}",
        f"- seed {args.seed}, repeats {args.repeats} after one warm-up call, methods interleaved round by round "
        "(median and range shown), laws Dirichlet(1) drawn per case "
        "from one numpy Generator in the order of the table",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    instances = []
    for name, V, k in CASES:
        target, draft = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
        instances.append((name, V, k, target, draft))

    # per case: one warm-up call of every method, then `repeats` rounds running every
    # method once per round (interleaved, so a slow spell of the machine hits all alike)
    jobs = [(i, r) for i in range(len(instances)) for r in range(args.repeats + 1)]
    bar = tqdm(jobs, desc="bench", unit="round") if tqdm else jobs
    runners: dict = {}
    times: dict = {}
    results: dict = {}
    for i, r in bar:
        name, V, k, target, draft = instances[i]
        methods = LP_METHODS[name] + [DENSE_POT]
        if r == 0:
            scheme = SCHEMES[name](draft, k)
            runners = {m: method_runner(scheme, target, m) for m in methods}
            if tqdm is None:
                print(f"{name} V={V} k={k}", flush=True)
        for m in methods:
            secs, value, note = runners[m]()
            if r > 0:
                times.setdefault((i, m), []).append(secs)
            results[i, m] = (value, note)

    lines = conditions(args)
    lines += [
        "",
        "| scheme | V | k | method | median s | min-max s | value | closed form | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (name, V, k, target, draft) in enumerate(instances):
        ref = f"{closed_form_iid(target, draft, k):.12f}" if name == "iid" else ""
        for method in LP_METHODS[name] + [DENSE_POT]:
            val, note = results[i, method]
            ts = times[i, method]
            label = "pot emd2 dense tuples" if method == DENSE_POT else f"{method[0]} {'folded' if method[1] else 'unfolded'}"
            lines.append(
                f"| {name} | {V} | {k} | {label} | {statistics.median(ts):.4f} | {min(ts):.4f}-{max(ts):.4f} "
                f"| {val:.12f} | {ref} | {note} |"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
