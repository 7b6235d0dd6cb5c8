"""Benchmark and accuracy check of the closed-form optimum (otm.optimum) at V = 49152.

Timing. For each law and k in (2, 4, 8), ``optimal_acceptance_of(make_scheme(...), target)``
is called once to warm up, then ``--repeats`` rounds call every (law, scheme, k, method)
case once each (interleaved, so a slow spell of the shared machine hits all
cases alike); the table gives the median and range of the wall times, the median CPU time
(``time.process_time``, less sensitive to other jobs on a shared machine), the value
alpha*, the size of the minimising prefix, the method, how many of the V + 1 prefixes
had Q computed, the race grid size G and the quadrature error estimate
``|T_h - T_2h|`` (the error of the *coarser* rule). Without replacement with k >= 3 is
timed twice: ``method="reference"`` (the scan of every prefix, the method before
otm.race_window) and the default ``method="auto"`` (the window method). The load average
of the machine (other jobs) is printed before and after.

Laws (seeded numpy Generator, ``--seed``):

peaked
    ``target = softmax(3 z)``, ``draft = softmax(3 (0.9 z + 0.436 e))`` with z, e
    standard normal: a peaked target and a draft correlated with it, as a small
    draft model's logits are (draft masses from 3e-13 to 0.10 at seed 0).
dirichlet
    ``target``, ``draft`` independent Dirichlet(1) draws (flat; draft masses from 1.7e-10 to 2.1e-4).
dirichlet0.05
    ``target``, ``draft`` independent Dirichlet(0.05) draws (sparse: draft masses from 1.2e-98
    to 3.2e-3 at seed 0, 11666 of them above 1e-6).
dominant1e-14
    the slowest case class met for the window method: one dominant draft token (mass 1 - 2.5e-10)
    and every other draft mass ``1e-14 * U(0.1, 10)``; target Dirichlet(0.2).
dominant1e-14-flat
    the same draft with a Dirichlet(1) target (the minimiser then lies near the end of the
    order, at complement masses ~1e-12).
two-dominant1e-14
    two heavy draft tokens (0.6, 0.4) and every other mass ``1e-14 * U(0.1, 10)``; target Dirichlet(0.2).
draft-squared
    a Dirichlet(0.05) draft and ``target`` proportional to ``draft**2`` (thousands of prefixes tied
    with alpha* = 1 at k = 8).
four-heavy1e-14
    four draft tokens of mass 0.25 and every other mass ``1e-14 * U(0.1, 10)``; target
    Dirichlet(0.2): more heavy tokens than the heavy-token bounds follow (3), the slowest class
    left after them.

After the table, the slowest case of the default method (largest median CPU time) is named.

Accuracy (``--accuracy``), on the same laws, without_replacement:

* k = 2: the race quadrature (``method="race"``) against the exact closed form,
  whose value at a few prefixes is itself checked against a 40-digit mpmath sum;
* k = 3, 4, 8: the default step ``h`` against ``h / 2`` (self-convergence), and
  against an independent evaluation at 4 prefixes: scipy's adaptive
  Gauss-Kronrod ``quad`` in ``y = log t`` with the count law computed by a
  pairwise (tree) product of truncated generating functions (this reference
  is itself limited to about 1e-13 by quad's roundoff);
* k = 3, 4, 8 on a law of five mass classes over 49152 tokens, where Q(H) is an
  exact finite recursion over the number of tokens drawn from each class
  (200 prefixes);
* k = 3, 4, 8, every law: the window method (default) against the reference scan:
  alpha*, every prefix both computed, and whether every prefix the window method
  skipped lies above alpha* in the reference.

Usage: ``.venv/bin/python analysis/bench_closed_form.py [--repeats 5] [--seed 0] [--accuracy]``
(``--laws peaked,dirichlet`` to pick laws, ``--ks 8`` to pick k, ``--no-reference`` to skip the
slow reference scans in the timing).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import sys
import time
import warnings
from functools import lru_cache

import numpy as np
from scipy.special import softmax
import scipy

from otm.optimum import (
    _race_inside,
    default_step,
    optimal_acceptance_of,
    prefix_membership,
    race_grid,
    ratio_order,
)
from otm.schemes import make_scheme

V = 49152
KS = (2, 4, 8)
SCHEMES = ("iid", "without_replacement")


def make_laws(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(V)
    e = rng.standard_normal(V)
    peaked = (softmax(3 * z), softmax(3 * (0.9 * z + math.sqrt(0.19) * e)))
    dirichlet = (rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V)))
    sparse = (rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05)))
    laws = {"peaked": peaked, "dirichlet": dirichlet, "dirichlet0.05": sparse}
    # the slowest case classes met by the window method: tiny masses beside heavy draft tokens
    dominant = np.full(V, 1e-14) * rng.uniform(0.1, 10, V)
    dominant[rng.integers(V)] = 1.0
    dominant /= dominant.sum()
    laws["dominant1e-14"] = (rng.dirichlet(np.full(V, 0.2)), dominant)
    laws["dominant1e-14-flat"] = (rng.dirichlet(np.ones(V)), dominant)
    two = np.full(V, 1e-14) * rng.uniform(0.1, 10, V)
    two[rng.choice(V, 2, replace=False)] = [0.6, 0.4]
    laws["two-dominant1e-14"] = (rng.dirichlet(np.full(V, 0.2)), two / two.sum())
    draft = rng.dirichlet(np.full(V, 0.05))
    laws["draft-squared"] = (draft**2 / np.sum(draft**2), draft)
    four = np.full(V, 1e-14) * rng.uniform(0.1, 10, V)
    four[rng.choice(V, 4, replace=False)] = 0.25
    laws["four-heavy1e-14"] = (rng.dirichlet(np.full(V, 0.2)), four / four.sum())
    return laws


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        aff = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        aff = os.cpu_count()
    return f"{platform.platform()}, {cpu}, {os.cpu_count()} cores (affinity {aff})"


# -----------------------------------------------------------------------------
# timing
# -----------------------------------------------------------------------------
def load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "load average unknown"


def timing(laws, repeats: int, ks=KS, reference: bool = True) -> None:
    cases = []
    for law in laws:
        for name in SCHEMES:
            for k in ks:
                slow = name == "without_replacement" and k >= 3
                methods = (("reference", "auto") if reference else ("auto",)) if slow else ("auto",)
                cases += [(law, name, k, m) for m in methods]
    times: dict = {c: [] for c in cases}
    cpu: dict = {c: [] for c in cases}
    results: dict = {}
    print(f"- before: {load()}")
    for c in cases:  # warm-up
        target, draft = laws[c[0]]
        results[c] = optimal_acceptance_of(make_scheme(c[1], draft, c[2]), target, method=c[3])
    for _ in range(repeats):
        for c in cases:
            target, draft = laws[c[0]]
            t0, c0 = time.perf_counter(), time.process_time()
            optimal_acceptance_of(make_scheme(c[1], draft, c[2]), target, method=c[3])
            times[c].append(time.perf_counter() - t0)
            cpu[c].append(time.process_time() - c0)
    print(f"- after: {load()}\n")
    print(
        "| law | scheme | k | method | median ms | min-max ms | median CPU ms | alpha* | prefix | prefixes computed "
        "| G | error estimate |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        law, name, k, _ = c
        r = results[c]
        target, draft = laws[law]
        G = "-"
        qs = draft[r.order]
        if r.method == "prefix+race":  # the grid reaches 45 / (mass of the last positive draft token)
            G = race_grid(k, float(qs[qs > 0][-1]), default_step(k)).size
        elif r.method == "prefix+race-window":  # ... 45 / (complement mass of the last candidate prefix)
            G = re.search(r"G = (\d+) nodes", r.note).group(1)
        computed = int(np.count_nonzero(~np.isnan(r.prefix_values)))
        ts = np.array(times[c]) * 1e3
        print(
            f"| {law} | {name} | {k} | {r.method} | {np.median(ts):.1f} | {ts.min():.1f}-{ts.max():.1f} "
            f"| {1e3 * np.median(cpu[c]):.1f} | {r.value:.12f} | {r.prefix} | {computed} | {G} | {r.error_estimate:.1e} |"
        )
    default = [c for c in cases if c[3] == "auto" and results[c].method == "prefix+race-window"]
    if default:
        worst = max(default, key=lambda c: np.median(cpu[c]))
        print(
            f"\nSlowest window-method case: {worst[0]}, k = {worst[2]}: median {1e3 * np.median(times[worst]):.1f} ms "
            f"wall, {1e3 * np.median(cpu[worst]):.1f} ms CPU ({repeats} repeats)."
        )


# -----------------------------------------------------------------------------
# accuracy
# -----------------------------------------------------------------------------
def tree_count_law(stay: np.ndarray, rung: np.ndarray, k: int) -> np.ndarray:
    """Law of min(N, k) for independent Bernoulli(rung), by a pairwise product (absorbing top cell)."""
    polys = np.zeros((stay.size, k + 1))
    polys[:, 0] = stay
    polys[:, 1] = rung
    while polys.shape[0] > 1:
        if polys.shape[0] % 2:
            polys = np.vstack([polys, np.eye(1, k + 1)])
        a, b = polys[0::2], polys[1::2]
        out = np.zeros_like(a)
        for i in range(k + 1):
            for j in range(k + 1):
                out[:, min(i + j, k)] += a[:, i] * b[:, j]
        polys = out
    return polys[0]


def quad_reference(qH: np.ndarray, c: float, k: int) -> float:
    """Q(H) by scipy's adaptive quad in y = log t, the count law by the tree product."""
    from scipy import integrate

    def f(y):
        t = math.exp(y)
        x = qH * t
        law = tree_count_law(np.exp(-x), -np.expm1(-x), k)
        return c * t * math.exp(-c * t) * law[k]

    lo, hi = math.log(1e-4), math.log(60.0 / c)
    with warnings.catch_warnings():  # quad reports its own roundoff floor (~1e-13 here)
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        val, _ = integrate.quad(f, lo, hi, epsabs=1e-15, epsrel=1e-14, limit=400)
    return val


def class_inside(u, n_in, c_out, k) -> float:
    @lru_cache(maxsize=None)
    def rec(drawn):
        if sum(drawn) == k:
            return 1.0
        left = [n - d for n, d in zip(n_in, drawn)]
        remaining = c_out + math.fsum(l_ * m for l_, m in zip(left, u))
        total = 0.0
        for ci, l_ in enumerate(left):
            if l_ > 0:
                nxt = list(drawn)
                nxt[ci] += 1
                total += l_ * u[ci] / remaining * rec(tuple(nxt))
        return total

    return rec((0,) * len(u))


def accuracy(laws, seed: int) -> None:
    import mpmath

    mpmath.mp.dps = 40
    print("\n| law | k | check | max abs difference | error estimate (default step) |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(seed + 1)
    for law, (target, draft) in laws.items():
        order = ratio_order(target, draft)
        qs = draft[order]
        # k = 2: race vs closed form, closed form vs mpmath at 5 prefixes
        exact = prefix_membership(draft, 2, order)
        race = prefix_membership(draft, 2, order, method="race")
        Q = [mpmath.mpf(float(x)) for x in qs]
        total = mpmath.fsum(Q)
        worst = 0.0
        for j in [1000, 10000, 25000, 40000, V - 1]:
            qH = mpmath.fsum(Q[:j])
            ref = mpmath.fsum(a * (qH - a) / (total - a) for a in Q[:j]) / total
            worst = max(worst, abs(exact.inside[j] - float(ref)))
        print(f"| {law} | 2 | closed form vs 40-digit mpmath (5 prefixes) | {worst:.1e} | - |")
        print(
            f"| {law} | 2 | race vs closed form (all {V + 1} prefixes) "
            f"| {np.abs(race.inside - exact.inside).max():.1e} | {race.error.max():.1e} |"
        )
        for k in (3, 4, 8):
            h = default_step(k)
            a, ea = _race_inside(qs[qs > 0], k, h)
            b, _ = _race_inside(qs[qs > 0], k, h / 2)
            print(f"| {law} | {k} | step h vs h/2 (all prefixes) | {np.abs(a - b).max():.1e} | {ea.max():.1e} |")
            worst = 0.0
            c_suffix = np.concatenate([np.cumsum(qs[::-1])[::-1], [0.0]])
            for j in sorted(rng.choice(np.arange(k + 1, V - 1), size=3, replace=False).tolist()) + [V - 1]:
                worst = max(worst, abs(a[j] - quad_reference(qs[:j], float(c_suffix[j]), k)))
            print(f"| {law} | {k} | vs adaptive quad + tree product (4 prefixes) | {worst:.1e} | {ea.max():.1e} |")
    # the window method against the reference scan, every law
    for law, (target, draft) in laws.items():
        for k in (3, 4, 8):
            scheme = make_scheme("without_replacement", draft, k)
            fast = optimal_acceptance_of(scheme, target)
            ref = optimal_acceptance_of(scheme, target, method="reference")
            done = ~np.isnan(fast.prefix_values)
            sound = bool(np.all(ref.prefix_values[~done] >= fast.value - 2e-13))
            print(
                f"| {law} | {k} | window vs reference: alpha* / every prefix both computed ({done.sum()}) "
                f"/ skipped prefixes >= window alpha* - 2e-13 in the reference: {sound} "
                f"| {abs(fast.value - ref.value):.1e} / {np.abs(fast.prefix_values[done] - ref.prefix_values[done]).max():.1e} "
                f"| {fast.error_estimate:.1e} |"
            )
    # five mass classes over V tokens: exact finite recursion
    counts = np.array([3, 29, 420, 8700, V - 3 - 29 - 420 - 8700])
    weights = np.array([0.5, 0.25, 0.15, 0.1 - 1e-6, 1e-6])
    cls = rng.permutation(np.repeat(np.arange(5), counts))
    draft = (weights / counts)[cls]
    target = rng.dirichlet(np.ones(V))
    order = ratio_order(target, draft)
    u = [float(draft[np.flatnonzero(cls == c)[0]]) for c in range(5)]
    onehot = np.eye(5, dtype=np.int64)[cls[order]]
    n_in = np.vstack([np.zeros(5, dtype=np.int64), np.cumsum(onehot, axis=0)])
    js = np.unique(np.concatenate([rng.choice(V + 1, 196, replace=False), [0, 1, V - 1, V]]))
    for k in (3, 4, 8):
        m = prefix_membership(draft, k, order)
        worst = 0.0
        for j in js:
            c_out = math.fsum((counts - n_in[j]) * np.array(u))
            ref = 1.0 if c_out == 0 else class_inside(tuple(u), tuple(map(int, n_in[j])), c_out, k)
            worst = max(worst, abs(m.inside[j] - ref))
        print(f"| 5 mass classes | {k} | vs exact class recursion ({js.size} prefixes) | {worst:.1e} | {m.error.max():.1e} |")
        # the window method on the same law: every prefix it computed, against the exact recursion
        fast = optimal_acceptance_of(make_scheme("without_replacement", draft, k), target)
        done = np.flatnonzero(~np.isnan(fast.prefix_values))
        P = np.concatenate([[0.0], np.cumsum(target[order])])
        worst = 0.0
        exact_best = np.inf
        for j in done:
            c_out = math.fsum((counts - n_in[j]) * np.array(u))
            ref = 1.0 if c_out == 0 else class_inside(tuple(u), tuple(map(int, n_in[j])), c_out, k)
            worst = max(worst, abs(1.0 - (fast.prefix_values[j] - P[j]) - ref))
            exact_best = min(exact_best, P[j] + 1 - ref)
        print(
            f"| 5 mass classes | {k} | window method vs exact class recursion ({done.size} prefixes it computed; "
            f"alpha* {abs(fast.value - exact_best):.1e} from the exact minimum over them) | {worst:.1e} | {fast.error_estimate:.1e} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--accuracy", action="store_true", help="also run the accuracy checks (about three minutes)")
    ap.add_argument(
        "--laws",
        default="peaked,dirichlet,dirichlet0.05,dominant1e-14,dominant1e-14-flat,two-dominant1e-14,draft-squared,"
        "four-heavy1e-14",
        help="comma-separated subset of the laws",
    )
    ap.add_argument("--ks", default=",".join(map(str, KS)), help="comma-separated k values for the timing")
    ap.add_argument("--no-reference", action="store_true", help="time the default method only (no reference scans)")
    args = ap.parse_args()
    laws = {name: law for name, law in make_laws(args.seed).items() if name in args.laws.split(",")}
    print(f"- command: {' '.join(['python'] + sys.argv)}")
    print(f"- machine: {machine()}")
    print(f"- python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}")
    print(
        f"- V = {V}, seed {args.seed}, repeats {args.repeats} after one warm-up call, "
        "cases interleaved round by round (median and range shown)\n"
    )
    timing(laws, args.repeats, tuple(int(k) for k in args.ks.split(",")), not args.no_reference)
    if args.accuracy:
        accuracy(laws, args.seed)


if __name__ == "__main__":
    main()
