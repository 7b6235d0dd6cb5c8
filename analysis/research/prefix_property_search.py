"""Adversarial search for a counterexample to the prefix property of alpha* for drafts without replacement.

Claim (proved in ``otm.optimum``, docs/closed_form.md section 1): for k drafts drawn without
replacement (successive sampling) from q, the minimum of ``p(H) + 1 - Q(H)`` over all subsets H is
attained on a prefix of the tokens sorted by ``p/q`` ascending. The proof rests on the exchange
inequality (E): for every set S and tokens a, b outside S with positive draft mass,

    (Q(S + a + b) - Q(S + b)) / q_a  >=  (Q(S + b) - Q(S)) / q_b.

This script checks both by brute force, independently of ``otm.optimum``'s fast paths: Q(H) for
every subset from a dynamic programme over ordered draws (P(first m draws form the set M) for every
bitmask M), then the zeta (subset-sum) transform. It reports, over random laws of many families and
over laws optimised (Nelder-Mead on logits) to break the claim:

* ``prefix gap`` = min over the prefixes of the ratio order - min over all 2^V subsets (>= 0;
  a positive value beyond rounding would be a counterexample);
* ``slack(E)`` = min over (S, a, b) of the two sides' difference in (E), relative to their size
  (>= 0 up to rounding; a negative value beyond rounding would refute the lemma).

Usage: ``python analysis/research/prefix_property_search.py [--seconds 600] [--seed 0]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.special import softmax
from scipy.optimize import minimize

from otm.optimum import ratio_order


def set_law(q: np.ndarray, k: int) -> np.ndarray:
    """f[T] = P(the set of the first k successive draws is T), by bitmask (V <= 12); positive sums only."""
    V = q.size
    n = 1 << V
    bits = (np.arange(n)[:, None] >> np.arange(V)) & 1
    pop = bits.sum(axis=1)
    rest = 1.0 - bits @ q  # mass left after drawing the set M ...
    for M in range(n):  # ... summed directly from the masses outside M (no 1 - q(M) cancellation)
        rest[M] = q[bits[M] == 0].sum()
    dp = np.zeros(n)
    dp[0] = 1.0
    for m in range(k):
        for M in np.flatnonzero(pop == m):
            if dp[M] == 0.0 or rest[M] <= 0:
                continue
            for x in range(V):
                if not (M >> x) & 1 and q[x] > 0:
                    dp[M | (1 << x)] += dp[M] * q[x] / rest[M]
    return np.where(pop == k, dp, 0.0)


def zeta(f: np.ndarray, V: int) -> np.ndarray:
    """g[H] = sum over subsets S of H of f[S]."""
    f = f.copy()
    for bit in range(V):
        view = f.reshape(-1, 2, 1 << bit)
        view[:, 1, :] += view[:, 0, :]
    return f


def q_table(q: np.ndarray, k: int) -> np.ndarray:
    """Q[H] = P(first k successive draws all in H) for every bitmask H."""
    return zeta(set_law(q, k), q.size)


def prefix_gap(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, float]:
    """(min over prefixes - min over all subsets, relative slack of (E)).

    The marginal gains in (E) are computed directly as sums of positive terms,
    Delta_b(S) = P(drafts in S + b, b drafted) = zeta(f * [b in T])(S + b), not as differences of Q,
    so the check keeps its relative precision; pairs whose gains fall below 1e-250 (products of
    masses that may have underflowed) are skipped. A float slack of -1e-15 is rounding: the tightest
    case found, re-run in exact rational arithmetic, has slack +3e-23.
    """
    V = p.size
    n = 1 << V
    f = set_law(q, k)
    Q = zeta(f, V)
    bits = (np.arange(n)[:, None] >> np.arange(V)) & 1
    values = bits @ p + 1.0 - Q
    order = ratio_order(p, q)
    masks = np.concatenate([[0], np.cumsum(1 << order)])
    gap = float(values[masks].min() - values.min())
    gain = [zeta(f * bits[:, x], V) for x in range(V)]  # gain[x][H] = P(drafts in H, x drafted)
    slack = np.inf
    allm = np.arange(n)
    for a in range(V):
        for b in range(V):
            if a == b or q[a] < 1e-300 or q[b] < 1e-300:
                continue
            S = allm[(((allm >> a) & 1) == 0) & (((allm >> b) & 1) == 0)]
            Sb = S | (1 << b)
            ga, gb = gain[a][Sb | (1 << a)], gain[b][Sb]
            lhs, rhs = ga / q[a], gb / q[b]
            scale = np.maximum(lhs, rhs)
            # a gain below 1e-250 is a product of masses that may have lost digits to underflow
            # (softmax attacks reach masses of 1e-85): such pairs are not judged
            ok = (scale > 0) & (np.minimum(ga, gb) > 1e-250)
            if ok.any():
                slack = min(slack, float(((lhs - rhs)[ok] / scale[ok]).min()))
    return gap, slack


FAMILIES = ("dirichlet0.05", "dirichlet0.3", "dirichlet1", "dirichlet5", "peaked", "near-tied", "zeros", "tiny", "point", "identical")


def draw(rng: np.random.Generator, family: str, V: int) -> tuple[np.ndarray, np.ndarray]:
    def dirichlet(a):
        x = rng.dirichlet(np.full(V, a))
        return x / x.sum()

    if family.startswith("dirichlet"):
        a = float(family[len("dirichlet") :])
        return dirichlet(a), dirichlet(a)
    if family == "peaked":
        z = rng.standard_normal(V)
        return softmax(4 * z), softmax(4 * (0.8 * z + 0.6 * rng.standard_normal(V)))
    if family == "near-tied":  # ratios within 1e-6 of each other, or exactly equal on groups
        q = dirichlet(1.0)
        p = q * (1 + rng.choice([0.0, 1e-9, 1e-6, 0.3], V) * rng.standard_normal(V))
        p = np.abs(p)
        return p / p.sum(), q
    if family == "zeros":
        p, q = dirichlet(0.5), dirichlet(0.5)
        p[rng.random(V) < 0.3] = 0
        q[rng.random(V) < 0.3] = 0
        if p.sum() == 0:
            p[0] = 1
        if q.sum() == 0:
            q[-1] = 1
        return p / p.sum(), q / q.sum()
    if family == "tiny":
        p, q = dirichlet(1.0), dirichlet(1.0)
        q[rng.random(V) < 0.4] = 1e-12
        p[rng.random(V) < 0.4] = 1e-12
        return p / p.sum(), q / q.sum()
    if family == "point":
        p, q = dirichlet(0.2), dirichlet(0.2)
        q[rng.integers(V)] += 50.0  # one dominant draft token
        return p / p.sum(), q / q.sum()
    q = dirichlet(0.5)  # identical up to a tiny perturbation
    p = q * (1 + 1e-3 * rng.standard_normal(V))
    p = np.abs(p)
    return p / p.sum(), q


def attack(rng, V, k, x0=None) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Maximise the prefix gap (and minimise the slack of (E)) over logits by Nelder-Mead."""

    def objective(x):
        p, q = softmax(x[:V]), softmax(x[V:])
        gap, slack = prefix_gap(p, q, k)
        return -gap + min(slack, 1.0)

    x0 = rng.normal(0, 3, 2 * V) if x0 is None else x0
    res = minimize(objective, x0, method="Nelder-Mead", options={"maxiter": 400, "xatol": 1e-6, "fatol": 1e-15})
    p, q = softmax(res.x[:V]), softmax(res.x[V:])
    gap, slack = prefix_gap(p, q, k)
    return gap, slack, p, q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    n_random = n_attack = 0
    worst_gap, worst_slack = -np.inf, np.inf
    worst_gap_case = worst_slack_case = None
    while time.perf_counter() - t0 < args.seconds:
        V = int(rng.integers(3, 9))
        k = int(rng.integers(2, min(V - 1, 5) + 1))
        if rng.random() < 0.85:
            family = FAMILIES[rng.integers(len(FAMILIES))]
            p, q = draw(rng, family, V)
            if np.count_nonzero(q) < k:
                continue
            gap, slack = prefix_gap(p, q, k)
            n_random += 1
        else:
            family = "attack"
            gap, slack, p, q = attack(rng, V, k)
            n_attack += 1
        if gap > worst_gap:
            worst_gap, worst_gap_case = gap, (family, V, k, p.tolist(), q.tolist())
        if slack < worst_slack:
            worst_slack, worst_slack_case = slack, (family, V, k, p.tolist(), q.tolist())
    print(f"seed {args.seed}, {time.perf_counter() - t0:.0f} s: {n_random} random laws, {n_attack} Nelder-Mead attacks, V 3..8, k 2..min(V-1, 5)")
    print(f"largest prefix gap (min over prefixes - min over all subsets): {worst_gap:.3e}  case {worst_gap_case[:3]}")
    print(f"smallest relative slack of (E): {worst_slack:.3e}  case {worst_slack_case[:3]}")
    print(f"  worst-slack laws: p = {worst_slack_case[3]}, q = {worst_slack_case[4]}")
    print(f"  worst-gap laws: p = {np.round(worst_gap_case[3], 6).tolist()}, q = {np.round(worst_gap_case[4], 6).tolist()}")


if __name__ == "__main__":
    main()
