"""Benchmark of the exact OTM LP (otm.lp.solve_lp) against POT's network simplex.

For each (V, k) and scheme, a Dirichlet(1) target and draft are drawn with a
fixed seed and every method is run ``--repeats`` times; the table gives the
median wall time and the value each method found, so one sees they agree.

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
build, HiGHS solve, plan repair). ``closed form`` is the sort-by-ratio prefix
formula of theory section 3.2 (iid only), an independent check of the values.

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


def time_it(fn, repeats: int):
    """Median seconds and last result of ``fn`` (which returns (seconds or None, value)), after one warm-up call."""
    fn()
    times, value = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        seconds, value = fn()
        times.append(time.perf_counter() - t if seconds is None else seconds)
    return statistics.median(times), value


def conditions(args) -> list[str]:
    return [
        f"- machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores (affinity {len(os.sched_getaffinity(0))})",
        f"- python {platform.python_version()}, numpy {np.__version__}, cvxpy {cvxpy.__version__}, "
        f"highspy {highspy.Highs().version()}, POT {ot.__version__}",
        f"- seed {args.seed}, repeats {args.repeats} after one warm-up call (median shown), laws Dirichlet(1) drawn per case "
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

    jobs = [(i, m) for i, (name, *_rest) in enumerate(instances) for m in LP_METHODS[name] + [DENSE_POT]]
    bar = tqdm(jobs, desc="bench", unit="run") if tqdm else jobs
    results: dict = {}
    for i, method in bar:
        name, V, k, target, draft = instances[i]
        scheme = SCHEMES[name](draft, k)
        if tqdm is None:
            print(f"{name} V={V} k={k} {method}", flush=True)
        if method == DENSE_POT:
            t = time.perf_counter()
            probs, M = pot_problem(scheme)
            build = time.perf_counter() - t
            secs, val = time_it(lambda: (None, 1.0 - float(ot.emd2(probs, target, M, numItermax=10_000_000))), args.repeats)
            results[i, method] = (secs, val, f"M {probs.size:,}x{V}, built in {build:.3f} s")
        else:
            backend, fold = method

            def run(backend=backend, fold=fold):
                res = solve_lp(scheme, target, backend=backend, fold=fold)
                return res.seconds, res

            secs, res = time_it(run, args.repeats)
            gap = res.dual_bound - res.value if res.dual_bound is not None else float("nan")
            results[i, method] = (secs, res.value, f"{res.n_variables:,} vars, dual gap {gap:.0e}")

    lines = conditions(args)
    lines += [
        "",
        "| scheme | V | k | method | median s | value | closed form | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (name, V, k, target, draft) in enumerate(instances):
        ref = f"{closed_form_iid(target, draft, k):.12f}" if name == "iid" else ""
        for method in LP_METHODS[name] + [DENSE_POT]:
            secs, val, note = results[i, method]
            label = "pot emd2 dense tuples" if method == DENSE_POT else f"{method[0]} {'folded' if method[1] else 'unfolded'}"
            lines.append(f"| {name} | {V} | {k} | {label} | {secs:.4f} | {val:.12f} | {ref} | {note} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
