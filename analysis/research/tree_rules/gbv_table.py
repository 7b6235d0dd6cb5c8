"""GBV (greedy multi-path block verification) against block verification, traversal and the tree LP on toy LMs.

Exact tokens per target call of one decoding step (first step, prompt [0, 2]), every draft tree
enumerated (otm.analysis.tree_optimum.draft_rows, i.i.d. rows) and each rule's exact block law
given the tree (otm.tree_verifiers.gbv.gbv_law, otm.tree_verification.traversal_law / block_law);
the LP is otm.analysis.tree_optimum.solve_tree_lp on the same laws. Cross-checked against the real
decoder (rule_tokens_per_call) where that is cheap (--check).

Run from the repository root:  .venv/bin/python analysis/research/tree_rules/gbv_table.py [a|b|c|check]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

torch.set_num_threads(1)

from otm.analysis.tree_optimum import draft_rows, rule_tokens_per_call, solve_tree_lp  # noqa: E402
from otm.decode import Sampling  # noqa: E402
from otm.decode.toy import ToyLM, model_law  # noqa: E402
from otm.decode.tree import DraftTree  # noqa: E402
from otm.laws import OtmError  # noqa: E402
from otm.tree_verification import traversal_law  # noqa: E402
from otm.tree_verifiers.gbv import gbv_law  # noqa: E402

PROMPT = [0, 2]


def laws(V, seeds, regime, sampling=None):
    """(target, draft) as prefix -> [V] functions. regime "toy": two ToyLMs; "close": the draft is the
    mixture 0.5 target + 0.5 other ToyLM (a draft much closer to the target)."""
    prompt = PROMPT if V > 2 else [1, 0]
    t = model_law(ToyLM(V, seed=seeds[0]), prompt, sampling)
    d = model_law(ToyLM(V, seed=seeds[1]), prompt, sampling)
    if regime == "toy":
        return t, d
    memo = {}

    def mix(prefix):
        if prefix not in memo:
            memo[prefix] = 0.5 * t(prefix) + 0.5 * d(prefix)
        return memo[prefix]

    return t, mix


def tokens_per_call(target, draft, k, L, rule):
    """Exact E|block| of one step: every ordered tuple of k i.i.d. rows, the rule's exact law given the tree."""
    total, cache = 0.0, {}
    for rows, w in draft_rows(draft, k, L, "iid"):
        key = tuple(rows) if rule == "traversal" else frozenset(rows)
        if key not in cache:
            tree = DraftTree.from_rows([list(r) for r in rows], root_token=0)
            prefix = {0: ()}
            for n in range(1, tree.size):
                prefix[n] = prefix[int(tree.parent[n])] + (int(tree.tokens[n]),)
            if rule == "traversal":
                law = traversal_law(tree, lambda n: target(prefix[n]), lambda n: draft(prefix[n]))
            else:  # gbv; k = 1 is block verification
                law = gbv_law(tree, lambda n: target(prefix[n]), lambda n: draft(prefix[n]), k)
            cache[key] = sum(len(b) * p for b, p in law.items())
        total += w * cache[key]
    return total


def lp(target, draft, k, L):
    try:
        return solve_tree_lp(target, draft, k, L, "iid").value
    except OtmError as exc:
        return f"refused: {exc}"


def claim_a():
    print("| V | L | seeds | sampling | block (K=1) | LP (K=1) | LP - block |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for V in (2, 3, 4):
        for L in (1, 2, 3):
            for seeds in ((0, 1), (2, 3), (6, 7)):
                for regime, sampling in (("toy", None), ("toy", Sampling(temperature=0.7)), ("close", None)):
                    t, d = laws(V, seeds, regime, sampling)
                    b = tokens_per_call(t, d, 1, L, "gbv")
                    v = lp(t, d, 1, L)
                    worst = max(worst, abs(v - b))
                    label = ("T=0.7" if sampling else "T=1") + (", close draft" if regime == "close" else "")
                    print(f"| {V} | {L} | {seeds} | {label} | {b:.12f} | {v:.12f} | {v - b:.1e} |", flush=True)
    print(f"\nlargest |LP - block| = {worst:.2e}")


CASES_B = [(V, K, L) for V in (2, 3, 4) for K in (2, 3, 4) for L in (1, 2, 3)]


def claim_b(seeds=(0, 1), regimes=("toy", "close")):
    print("| V | K | L | draft | block K=1 | GBV | traversal | LP | GBV/block | GBV/LP | trav/LP |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for regime in regimes:
        for V, K, L in CASES_B:
            if V ** (K * L) > 600_000:
                continue
            t0 = time.time()
            t, d = laws(V, seeds, regime)
            b = tokens_per_call(t, d, 1, L, "gbv")
            g = tokens_per_call(t, d, K, L, "gbv")
            tr = tokens_per_call(t, d, K, L, "traversal") if V ** (K * L) <= 70_000 else float("nan")
            v = lp(t, d, K, L) if V ** (K * L) <= 70_000 else "not run (> 70,000 draft tuples)"
            if isinstance(v, str):
                lpcols = f"{v} | - | -"
            else:
                lpcols = f"{v:.4f} | {g / v:.4f} | {tr / v:.4f}"
                assert g <= v + 1e-9 and tr <= v + 1e-9, (V, K, L, g, tr, v)
            print(f"| {V} | {K} | {L} | {regime} | {b:.4f} | {g:.4f} | {tr:.4f} | {lpcols.split(' | ')[0]} | "
                  f"{g / b:.4f} | {' | '.join(lpcols.split(' | ')[1:])} |  <!-- {time.time() - t0:.1f} s -->", flush=True)


def claim_c(seeds=range(20)):
    """GBV / block (K = 1, same L) over many toy pairs: min, median, max and how often GBV loses."""
    print("| V | K | L | draft | pairs | GBV/block min | median | max | GBV < block |")
    print("|---|---|---|---|---|---|---|---|---|")
    for regime in ("toy", "close", "same"):
        for V in (2, 3, 4):
            for K in (2, 3, 4):
                for L in (1, 2, 3):
                    if V ** (K * L) > 5_000:
                        continue
                    ratios = []
                    for s in seeds:
                        if regime == "same":
                            t, _ = laws(V, (100 + s, 100 + s), "toy")
                            d = t
                        else:
                            t, d = laws(V, (100 + 2 * s, 101 + 2 * s), regime)
                        ratios.append(tokens_per_call(t, d, K, L, "gbv") / tokens_per_call(t, d, 1, L, "gbv"))
                    r = np.array(ratios)
                    print(f"| {V} | {K} | {L} | {regime} | {r.size} | {r.min():.4f} | {np.median(r):.4f} | "
                          f"{r.max():.4f} | {(r < 1 - 1e-12).sum()} |", flush=True)


def check():
    """The enumeration above against the real decoder's exact first step (rule_tokens_per_call)."""
    for V, K, L, seeds in ((3, 2, 2, (0, 1)), (3, 3, 1, (2, 3)), (2, 3, 2, (6, 7))):
        prompt = PROMPT if V > 2 else [1, 0]
        tl, dl = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
        t, d = model_law(tl, prompt), model_law(dl, prompt)
        for rule in ("gbv", "traversal"):
            mine = tokens_per_call(t, d, K, L, rule)
            dec = rule_tokens_per_call(tl, dl, prompt, K, L, rule)
            print(V, K, L, rule, mine, dec, abs(mine - dec))
        mine = tokens_per_call(t, d, 1, L, "gbv")
        dec = rule_tokens_per_call(tl, dl, prompt, 1, L, "block")
        print(V, 1, L, "block", mine, dec, abs(mine - dec))


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "b"
    {"a": claim_a, "b": claim_b, "c": claim_c, "check": check}[what]()
