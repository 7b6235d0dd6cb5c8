"""HSD (arXiv 2601.05724) against block verification and the one-chain tree LP, on toy LMs, exactly.

Run from the repository root:  OMP_NUM_THREADS=1 .venv/bin/python analysis/research/tree_rules/hsd_sweep.py [--quick]

Per step: tokens per target call of the decoder's first step (every random choice enumerated,
``rule_tokens_per_call``) for block, hsd, hsd_code; the LP optimum at k = 1 (``tree_optimum``); the law
error / TV of the first L + 1 tokens (exact mode). Whole decode: T / E[target calls] over a T-token
decode, enumerated exactly. Writes docs/results/hsd_sweep.csv and prints markdown tables.
"""

from __future__ import annotations

import csv
import sys
import time

import numpy as np
import torch

from otm.analysis.tree_optimum import rule_tokens_per_call, tree_optimum
from otm.decode import Sampling, speculative_decode
from otm.decode.chance import Enumerated
from otm.decode.exact_mode import exact_decode_law, law_error, target_law, total_variation
from otm.decode.toy import ToyLM, model_law

torch.set_num_threads(1)
QUICK = "--quick" in sys.argv
PROMPT = [0, 1]
RULES = ("block", "hsd", "hsd_code")


def whole_decode(target, draft, T, L, rule, sampling):
    """(E[target calls], law) of a T-token decode, every run enumerated (as otm.decode.exact_mode does)."""
    stack, memo, calls, law = [()], {}, 0.0, {}
    while stack:
        forced = stack.pop()
        door = Enumerated(forced, memo)
        out = speculative_decode(target, draft, PROMPT, k=1, length=L, verifier=rule, sampling=sampling,
                                 max_new_tokens=T, chance=door, law_dtype=torch.float64)
        for i in range(len(forced), len(door.taken)):
            stack.extend(tuple(door.taken[:i]) + (alt,) for alt in range(door.sizes[i] - 1, 0, -1))
        calls += door.probability * out.stats.target_calls
        law[tuple(out.tokens)] = law.get(tuple(out.tokens), 0.0) + door.probability
    return calls, law


def main():
    rows = []
    Vs, Ls, seeds, temps = ((2, 3), (1, 2), range(2), (1.0,)) if QUICK else ((2, 3, 4), (1, 2, 3), range(4), (0.5, 1.0, 2.0))
    start = time.time()
    for V in Vs:
        for L in Ls:
            for s in seeds if (V, L) != (4, 3) else range(2):
                for temp in temps:
                    t, d = ToyLM(V, seed=2 * s), ToyLM(V, seed=2 * s + 1)
                    smp = Sampling(temperature=temp)
                    row = dict(V=V, L=L, seed=s, T=temp, lp=tree_optimum(t, d, PROMPT, k=1, L=L, sampling=smp).value)
                    ref = target_law(model_law(t, PROMPT, smp), L + 1)
                    for rule in RULES:
                        row[rule] = rule_tokens_per_call(t, d, PROMPT, 1, L, rule, "iid", smp)
                    for rule in ("hsd",) if L == 3 else ("block", "hsd"):  # hsd_code's law = hsd's (tested, 1e-12)
                        law = exact_decode_law(t, d, PROMPT, max_new_tokens=L + 1, k=1, length=L, verifier=rule,
                                               sampling=smp)
                        row[f"{rule}_err"], row[f"{rule}_tv"] = law_error(law, ref), total_variation(law, ref)
                    rows.append(row)
                    print(f"{time.time() - start:6.0f}s", {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()},
                          flush=True)
    with open("docs/results/hsd_sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), restval="")
        w.writeheader()
        w.writerows(rows)
    print("\n| V | L | temperature | LP = block (mean) | hsd mean | hsd - LP: mean, max | cases hsd > LP + 1e-9 | hsd law error of L+1 tokens: max | TV max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for V in Vs:
        for L in Ls:
            for temp in temps:
                g = [r for r in rows if r["V"] == V and r["L"] == L and r["T"] == temp]
                gap = np.array([r["hsd"] - r["lp"] for r in g])
                print(f"| {V} | {L} | {temp} | {np.mean([r['lp'] for r in g]):.4f} | {np.mean([r['hsd'] for r in g]):.4f} | "
                      f"{gap.mean():.2e}, {gap.max():.2e} | {(gap > 1e-9).sum()}/{len(g)} | "
                      f"{max(r['hsd_err'] for r in g):.2e} | {max(r['hsd_tv'] for r in g):.2e} |")
    print("\nchecks: max |block - LP| =", max(abs(r["block"] - r["lp"]) for r in rows),
          " max |hsd - hsd_code| =", max(abs(r["hsd"] - r["hsd_code"]) for r in rows),
          " max block law error (L <= 2) =", max(r.get("block_err", 0.0) for r in rows))
    # whole decode: T tokens, tokens per target call = T / E[calls]
    print("\n| V | L | T tokens | seed | block: T / E[calls] | hsd: T / E[calls] | hsd law error (T tokens) | TV |")
    print("|---|---|---|---|---|---|---|---|")
    for V, L, T in ((2, 2, 5), (3, 2, 4)) if not QUICK else ((2, 2, 4),):
        for s in range(2):
            t, d = ToyLM(V, seed=2 * s), ToyLM(V, seed=2 * s + 1)
            smp = Sampling(temperature=1.0)
            ref = target_law(model_law(t, PROMPT, smp), T)
            cb, lb = whole_decode(t, d, T, L, "block", smp)
            ch, lh = whole_decode(t, d, T, L, "hsd", smp)
            print(f"| {V} | {L} | {T} | {s} | {T / cb:.4f} | {T / ch:.4f} | {law_error(lh, ref):.2e} | "
                  f"{total_variation(lh, ref):.2e} |  (block law error {law_error(lb, ref):.1e})", flush=True)
    print(f"\n{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
