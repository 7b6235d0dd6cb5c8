"""SpecTr-GBV against the one-step tree LP and other rules, exact values on toy LMs (issue 28).

Run from the repository root:  OMP_NUM_THREADS=1 .venv/bin/python analysis/research/tree_rules/spectr_gbv_table.py [--quick] [V,K,L ...]
Prints a markdown table: per (V, K, L, seed) the LP optimum (i.i.d. rows), SpecTr-GBV's exact tokens per
call (numpy law summed over every draft tuple; cross-checked with the real decoder's exact first step
where that enumeration is small), the two candidate closed forms (1 + E[tau]), block (K = 1), traversal,
kseq (and optimal) level by level (real decoder, exact) where cheap.
"""
import sys
import time

import torch

torch.set_num_threads(1)
from otm.analysis.tree_optimum import draft_rows, rule_tokens_per_call, solve_tree_lp  # noqa: E402
from otm.decode.toy import ToyLM, model_law  # noqa: E402
from otm.decode.tree import DraftTree  # noqa: E402
from otm.tree_verification import traversal_law  # noqa: E402
from otm.tree_verifiers.spectr_gbv import closed_form_table, spectr_gbv_law  # noqa: E402

PROMPT = [0, 2]


def numpy_value(P, Q, k, L, scheme="iid", rule=spectr_gbv_law):
    total = 0.0
    for rows, w in draft_rows(Q, k, L, scheme):
        tree = DraftTree.from_rows(rows, root_token=0)
        prefix = {0: ()}
        for n in range(1, tree.size):
            prefix[n] = prefix[int(tree.parent[n])] + (int(tree.tokens[n]),)
        law = rule(tree, lambda n: P(prefix[n]), lambda n: Q(prefix[n]),
                             root_without_replacement=scheme == "without_replacement")
        total += w * sum(len(b) * x for b, x in law.items())
    return total


def main(quick: bool, only=None):
    cases = [(2, K, L) for K in (2, 3, 4) for L in (1, 2, 3)] + [(3, 2, 1), (3, 2, 2), (3, 2, 3), (3, 3, 1), (3, 3, 2), (3, 4, 1), (3, 4, 2)]
    if not quick:
        cases += [(3, 3, 3)]
    if only:
        cases = [c for c in cases if c in only]
    seeds = (0, 1, 2)
    print("| V | K | L | seed | LP optimum | spectr_gbv | spectr_gbv / LP | closed form 'running' | closed form 'prefix' | block (K=1) | traversal | kseq | optimal (token level) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for V, K, L in cases:
        for s in seeds:
            t0 = time.time()
            tg, dr = ToyLM(V, seed=2 * s), ToyLM(V, seed=2 * s + 1)
            prompt = [0, 1] if V == 2 else PROMPT
            P, Q = model_law(tg, prompt), model_law(dr, prompt)
            lp = solve_tree_lp(P, Q, K, L, "iid").value
            mine = numpy_value(P, Q, K, L)
            cf = closed_form_table(P, Q, K, L)
            cheap = V ** (K * L) <= 729
            dec = rule_tokens_per_call(tg, dr, prompt, K, L, "spectr_gbv") if cheap else None
            if dec is not None:
                assert abs(dec - mine) < 1e-12, (dec, mine)
            block = rule_tokens_per_call(tg, dr, prompt, 1, L, "block")
            others = {}
            others["traversal"] = numpy_value(P, Q, K, L, rule=traversal_law)  # the decoder's rule's own arithmetic
            if cheap:
                assert abs(others["traversal"] - rule_tokens_per_call(tg, dr, prompt, K, L, "traversal")) < 1e-12
            for rule in ("kseq", "optimal"):
                others[rule] = rule_tokens_per_call(tg, dr, prompt, K, L, rule) if cheap else float("nan")
            assert mine <= lp + 1e-9, (V, K, L, s, mine, lp)
            print(f"| {V} | {K} | {L} | {s} | {lp:.6f} | {mine:.6f} | {mine / lp:.4f} | {cf['running']:.6f} | {cf['prefix']:.6f} "
                  f"| {block:.6f} | {others['traversal']:.6f} | {others['kseq']:.6f} | {others['optimal']:.6f} |", flush=True)
            print(f"<!-- {time.time() - t0:.1f} s, decoder check {'yes' if dec is not None else 'no'} -->", file=sys.stderr, flush=True)


if __name__ == "__main__":
    only = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:] if not a.startswith("--")]
    main("--quick" in sys.argv, only)
