"""Tokens per target call of one step (exact, every draft tree enumerated) for layer verification with
kseq / rrs / optimal, level-by-level with the same verifier, traversal, against the tree LP optimum.

Run from the repository root:  OMP_NUM_THREADS=1 .venv/bin/python analysis/research/tree_rules/layer_sweep.py [cases]
Rule values: the numpy laws given the tree (otm.tree_verifiers.layer.layer_law / level_by_level_law,
otm.tree_verification.traversal_law), summed over every ordered draft tuple of
otm.analysis.tree_optimum.draft_rows; cross-checked against the decoder's exact first step
(rule_tokens_per_call) on a few cases by tests/test_tree_rules_layer.py.
"""
import sys, time, json
import torch
torch.set_num_threads(1)
from otm.analysis.tree_optimum import draft_rows, solve_tree_lp
from otm.decode import Sampling
from otm.decode.toy import ToyLM, model_law
from otm.decode.tree import DraftTree
from otm.tree_verification import traversal_law
from otm.tree_verifiers.layer import layer_law, step_laws, level_by_level_law as level_law
from otm.verifiers import VERIFIERS

PROMPT = [0, 2]


def prefixes_of(tree):
    pre = {0: ()}
    for n in range(1, tree.size):
        pre[n] = pre[int(tree.parent[n])] + (int(tree.tokens[n]),)
    return pre


def tokens_per_call(P, Q, k, L, scheme, rules):
    """{rule: E|B|} over every draft tree; rules: name -> f(tree, target_of, draft_of) -> block law."""
    tot = {r: 0.0 for r in rules}
    mass = 0.0
    for rows, pr in draft_rows(Q, k, L, scheme):
        tree = DraftTree.from_rows(rows, root_token=0)
        pre = prefixes_of(tree)
        t_of = lambda n: P(pre[n])
        d_of = lambda n: Q(pre[n])
        mass += pr
        for r, f in rules.items():
            law = f(tree, t_of, d_of)
            tot[r] += pr * sum(len(b) * w for b, w in law.items())
    return tot, mass


def rules_for(scheme, memo):
    out = {}
    for step in ("kseq", "rrs", "optimal"):
        root, deep, name = step_laws(step, scheme)
        out[f"layer:{step}"] = (lambda rt, dp: lambda tr, t, d: layer_law(tr, t, d, rt, dp, ))(root, deep)
        out[f"level:{step}"] = (lambda rt, dp: lambda tr, t, d: level_law(tr, t, d, rt, dp))(root, deep)
    wor = scheme == "without_replacement"
    out["traversal"] = lambda tr, t, d: traversal_law(tr, t, d, root_without_replacement=wor)
    if wor:  # the exact WOR optimum as single-step rule (numpy, small V)
        root = VERIFIERS["optimal_without_replacement"].module.law
        deep = VERIFIERS["speculative"].module.law
        out["layer:optimal_wor"] = lambda tr, t, d: layer_law(tr, t, d, root, deep)
        out["level:optimal_wor"] = lambda tr, t, d: level_law(tr, t, d, root, deep)
    return out


def run(V, k, L, scheme, temp, seed):
    sampling = Sampling(temperature=temp)
    P = model_law(ToyLM(V, seed=2 * seed), PROMPT, sampling)
    Q = model_law(ToyLM(V, seed=2 * seed + 1), PROMPT, sampling)
    t0 = time.time()
    opt = solve_tree_lp(P, Q, k, L, scheme)
    t1 = time.time()
    vals, mass = tokens_per_call(P, Q, k, L, scheme, rules_for(scheme, {}))
    t2 = time.time()
    return dict(V=V, k=k, L=L, scheme=scheme, T=temp, seed=seed, lp=opt.value, dual=opt.dual_bound, mass=mass,
                lp_s=t1 - t0, rules_s=t2 - t1, **vals)


if __name__ == "__main__":
    cases = json.loads(sys.argv[1]) if len(sys.argv) > 1 else [[3, 2, 2, "iid", 1.0, 0]]
    for c in cases:
        r = run(*c)
        print(json.dumps(r), flush=True)
