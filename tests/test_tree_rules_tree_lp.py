"""The tree LP as a verifier (otm.decode.tree_rules_tree_lp.TreeLP) and the rules-against-the-LP table.

Exact: the REAL decoder with ``verifier=TreeLP(target, draft, sampling)`` in its exact mode (every run
enumerated, one LP solved per context) gives the target's law of the first T tokens to 1e-12 on toy LMs
(V 3-4, k 1-3, L 1-2, T 2-3, both schemes, temperature / top-k / top-p, EOS, both rollbacks).

Optimal: its exact tokens per target call in the first step (every random choice of the real decoder
enumerated, ``rule_tokens_per_call`` with the TreeLP instance) equals the LP's value
(``tree_optimum(...).value``) to 1e-9; on a chain (k = 1) it equals block verification, optimal there.

Negative controls, each caught by the same exact check (law error stated in each test's docstring):
the plan of the previous context reused (stale cache keyed without the context), the i.i.d. plan used
under drafts without replacement (the scheme ignored), and the plan of a neighbouring node set (the
node set of all rows but the last). The law guard refuses a stale plan, wrong sampling or wrong models
in one line before any draw.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from otm.analysis.tree_optimum import rule_tokens_per_call, solve_tree_plan, tree_optimum
from otm.analysis.tree_rules_table import ToyCase, markdown, rules_for, tree_rules_table
from otm.decode import Sampling, speculative_decode
from otm.decode.exact_mode import exact_decode, law_error, target_law, total_variation
from otm.decode.toy import ToyLM, model_law
from otm.decode.tree_rules_tree_lp import TreeLP, shared_tree_lp
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [0, 2]


def _exact(V, k, L, T, scheme, sampling, seeds, eos=None, rollback="gather"):
    """(law error, TV, the rule) of the decoder with TreeLP against the target's law of T tokens."""
    target, draft = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
    rule = TreeLP(target, draft, sampling)
    ex = exact_decode(target, draft, PROMPT, max_new_tokens=T, k=k, length=L, verifier=rule, scheme=scheme,
                      sampling=sampling, eos_token_id=eos, target_rollback=rollback)
    reference = target_law(model_law(target, PROMPT, sampling), T, eos=eos)
    return law_error(ex.law, reference), total_variation(ex.law, reference), rule


@pytest.mark.parametrize("V,k,L,T,scheme,sampling,seeds,eos,rollback", [
    (3, 2, 2, 3, "iid", Sampling(), (0, 1), None, "gather"),
    (3, 2, 2, 3, "without_replacement", Sampling(temperature=0.7), (2, 3), None, "refeed"),
    (3, 1, 2, 3, "iid", Sampling(), (4, 5), None, "gather"),
    (4, 2, 1, 3, "iid", Sampling(top_k=2), (6, 7), 1, "gather"),
    (4, 3, 1, 2, "iid", Sampling(), (8, 9), None, "refeed"),
    (4, 2, 2, 2, "without_replacement", Sampling(top_p=0.8, temperature=1.3), (1, 2), None, "gather"),
    (3, 2, 1, 3, "without_replacement", Sampling(temperature=2.0), (0, 1), 2, "gather"),
])
def test_tree_lp_decoder_is_exact(V, k, L, T, scheme, sampling, seeds, eos, rollback):
    err, _, rule = _exact(V, k, L, T, scheme, sampling, seeds, eos, rollback)
    assert err < 1e-12
    assert rule.plans  # the LP was solved (once per context and step shape, cached)


@pytest.mark.parametrize("V,k,L,scheme,sampling,seeds", [
    (3, 2, 2, "iid", Sampling(), (0, 1)),
    (3, 2, 2, "without_replacement", Sampling(temperature=0.7), (2, 3)),
    (4, 2, 2, "iid", Sampling(temperature=0.5), (4, 5)),  # a node set of mass 6e-14: seeded by the polish
    (4, 3, 1, "iid", Sampling(top_k=3), (8, 9)),
])
def test_tree_lp_first_step_reaches_the_lp_value(V, k, L, scheme, sampling, seeds):
    """The decoder's exact first-step tokens per call with TreeLP = the LP's value (to 1e-9)."""
    target, draft = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
    got = rule_tokens_per_call(target, draft, PROMPT, k, L, TreeLP(target, draft, sampling), scheme, sampling)
    assert abs(got - tree_optimum(target, draft, PROMPT, k, L, scheme, sampling).value) < 1e-9


def test_tree_lp_is_block_verification_on_a_chain():
    """k = 1: block verification is optimal for one chain (Sun et al., ICLR 2025), so the two agree."""
    target, draft = ToyLM(4, seed=3), ToyLM(4, seed=4)
    lp = rule_tokens_per_call(target, draft, PROMPT, 1, 2, TreeLP(target, draft), "iid")
    assert abs(lp - rule_tokens_per_call(target, draft, PROMPT, 1, 2, "block", "iid")) < 1e-9


def test_the_polished_plan_meets_the_rows_and_the_raw_vertex_may_not():
    """The raw HiGHS vertex leaves a node set of mass 5.9e-14 with no block at all (V = 4, T = 0.5,
    seeds 4/5); the polished plan gives every node set a law and meets the rows to 1e-13."""
    s = Sampling(temperature=0.5)
    t, d = model_law(ToyLM(4, seed=4), PROMPT, s), model_law(ToyLM(4, seed=5), PROMPT, s)
    plan = solve_tree_plan(t, d, 2, 2)
    raw = solve_tree_plan(t, d, 2, 2, polish=False)
    assert plan.residual < 1e-13 and set(plan.conditional) == set(plan.tree_law)
    assert min(plan.tree_law.values()) < 1e-13 and len(raw.conditional) < len(raw.tree_law)
    assert all(w.min() > 0 and abs(w.sum() - 1) < 1e-15 for _, w in plan.conditional.values())
    assert abs(plan.value - plan.solver_value) < 1e-9


# -- planted bugs: caught by the exact check --------------------------------------------------------


def test_planted_stale_plan_is_caught_by_the_exact_mode():
    """Planted bug: the plan cache keyed without the context (the first context's plan reused at every
    later step), the law guard switched off: law error 0.068 (TV 0.17) at V = 3, k = 2, L = 1, T = 3."""
    with mock.patch.object(TreeLP, "plan_key", lambda self, context, k, L, scheme, delay=0: (k, L, scheme, delay)), \
            mock.patch.object(TreeLP, "check_laws", lambda *args: None):
        err, tv, _ = _exact(3, 2, 1, 3, "iid", Sampling(), (0, 1))
    assert err > 0.05 and tv > 0.1


def test_the_law_guard_refuses_a_stale_plan():
    """The same stale cache with the guard on: the decoder's laws are not those the plan was built from."""
    with mock.patch.object(TreeLP, "plan_key", lambda self, context, k, L, scheme, delay=0: (k, L, scheme, delay)):
        with pytest.raises(OtmError, match="differs from TreeLP's"):
            _exact(3, 2, 1, 3, "iid", Sampling(), (0, 1))


def test_planted_scheme_ignored_is_caught_by_the_exact_mode():
    """Planted bug: the i.i.d. scheme's plan used for drafts without replacement (every node set of the
    latter is one of the former, so it runs): law error 0.085 (TV 0.40) at V = 3, k = 2, L = 1, T = 3."""
    original = TreeLP.plan
    with mock.patch.object(TreeLP, "plan", lambda self, context, k, L, _, delay=0: original(self, context, k, L, "iid", delay)):
        err, tv, _ = _exact(3, 2, 1, 3, "without_replacement", Sampling(), (0, 1))
    assert err > 0.05 and tv > 0.3


def test_planted_neighbouring_node_set_is_caught_by_the_exact_mode():
    """Planted bug: the plan of the node set of all rows but the last (an off-by-one over the rows; with
    i.i.d. rows that set has mass, both rows alike): law error 0.134 (TV 0.40) at V = 3, k = 2, L = 2, T = 2."""
    def rows_but_last(self, tree, prefixes):
        return frozenset(prefixes[n] for n in set(tree.node_of[:-1, 1:].flatten().tolist()))

    with mock.patch.object(TreeLP, "node_set", rows_but_last):
        err, tv, _ = _exact(3, 2, 2, 2, "iid", Sampling(), (0, 1))
    assert err > 0.05 and tv > 0.1


# -- the rule in the decoder, its context and its refusals --------------------------------------------


def test_tree_lp_runs_sampled_and_follows_the_context_over_many_steps():
    """A sampled run of 24 tokens: every step's context is checked against the target cache and the
    decoder's laws at every node (the guard); the counters are those of a whole-tree rule."""
    target, draft = ToyLM(3, seed=10), ToyLM(3, seed=11)
    rule = TreeLP(target, draft, Sampling(temperature=0.8))
    for rollback in ("gather", "refeed"):
        out = speculative_decode(target, draft, PROMPT, k=2, length=2, verifier=rule, sampling=Sampling(temperature=0.8),
                                 max_new_tokens=24, seed=5, target_rollback=rollback)
        assert len(out.tokens) == 24 and out.stats.method == "tree_lp iid k=2 L=2"
        v, a = out.stats.verified_by_depth, out.stats.accepted_by_depth
        assert 0 < v[0] <= out.stats.steps
        assert all(x <= y for x, y in zip(a, v)) and a[0] > 0
    contexts = {key[0] for key in rule.plans}
    assert len(contexts) > 5 and all(c[:2] == tuple(PROMPT) for c in contexts)


def test_context_is_the_committed_tokens_ending_at_the_root():
    """The step context's committed tokens are the LP's context; a context not ending at the tree's root is refused."""
    rule = TreeLP(ToyLM(3, seed=0), ToyLM(3, seed=1))
    tree = SimpleNamespace(size=3, tokens=torch.tensor([2, 0, 1]))
    assert rule.context(SimpleNamespace(committed=[0, 1, 2]), tree) == (0, 1, 2)
    with pytest.raises(OtmError, match="does not end at the tree's root"):
        rule.context(SimpleNamespace(committed=[0, 2, 1]), tree)


def test_tree_lp_refuses_other_models_or_sampling_and_missing_models():
    target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
    with pytest.raises(OtmError, match="differs from TreeLP's"):
        speculative_decode(target, draft, PROMPT, k=2, length=1, verifier=TreeLP(target, draft, Sampling(temperature=0.5)),
                           max_new_tokens=3, seed=0)
    with pytest.raises(OtmError, match="draft law at node 0 differs"):
        speculative_decode(target, draft, PROMPT, k=2, length=1, verifier=TreeLP(target, ToyLM(3, seed=2)),
                           max_new_tokens=3, seed=0)
    with pytest.raises(OtmError, match="needs the run's target and draft models"):
        TreeLP(target, None)
    with pytest.raises(OtmError, match="needs the run's target and draft models"):
        TreeLP()  # what `otm certify otm.decode.tree_rules_tree_lp:TreeLP --kind decoder` builds: one line, no traceback
    with pytest.raises(OtmError, match="max_trees"):
        speculative_decode(target, draft, PROMPT, k=2, length=2, verifier=TreeLP(target, draft, max_trees=10),
                           max_new_tokens=3, seed=0)


def test_shared_tree_lp_is_one_rule_per_models_and_sampling():
    target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
    rule = shared_tree_lp(target, draft)
    assert shared_tree_lp(target, draft, Sampling()) is rule
    assert shared_tree_lp(target, draft, Sampling(temperature=0.5)) is not rule
    assert shared_tree_lp(target, ToyLM(3, seed=1)) is not rule


# -- the table of the rules against the LP -------------------------------------------------------------


def test_rules_table_puts_every_rule_under_the_lp():
    """Chain: speculative <= block = tree_lp = LP; tree (k = 2): kseq below the LP, tree_lp on it."""
    rows = tree_rules_table([ToyCase(V=3, k=1, L=2, seeds=(0, 1)), ToyCase(V=3, k=2, L=1, seeds=(0, 1))],
                            rules=("speculative", "block", "kseq"))
    got = {(r.case.k, r.rule): r for r in rows}
    assert set(got) == {(1, "speculative"), (1, "block"), (1, "kseq"), (1, "tree_lp"), (2, "kseq"), (2, "tree_lp")}
    assert abs(got[1, "kseq"].tokens_per_call - got[1, "speculative"].tokens_per_call) < 1e-12  # one draft
    assert got[1, "speculative"].ratio < 1 - 1e-3 and abs(got[1, "block"].ratio - 1) < 1e-9
    assert abs(got[1, "tree_lp"].ratio - 1) < 1e-9 and abs(got[2, "tree_lp"].ratio - 1) < 1e-9
    assert got[2, "kseq"].ratio < 1 - 1e-3 and not any(r.note for r in rows)
    assert "| V=3 k=2 L=1 iid seeds 0/1 T=1 | kseq |" in markdown(rows)
    assert "speculative" in rules_for("iid", 1) and "speculative" not in rules_for("iid", 2)
    with pytest.raises(OtmError, match="unknown scheme"):
        rules_for("greedy", 2)


# -- wider sweeps (make test-slow) ---------------------------------------------------------------------


@pytest.mark.research
@pytest.mark.parametrize("V,k,L,T,scheme,seeds,temperature", [
    (4, 2, 2, 3, "iid", (2, 3), 1.0), (4, 2, 2, 3, "without_replacement", (2, 3), 0.5),
    (3, 2, 3, 3, "iid", (4, 5), 1.0), (3, 3, 2, 3, "without_replacement", (6, 7), 1.5),
    (3, 2, 2, 4, "iid", (8, 9), 0.7), (4, 1, 3, 4, "iid", (10, 11), 1.0),
])
def test_tree_lp_decoder_is_exact_wider(V, k, L, T, scheme, seeds, temperature):
    err, _, _ = _exact(V, k, L, T, scheme, Sampling(temperature=temperature), seeds)
    assert err < 1e-12


@pytest.mark.research
@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_tree_lp_first_step_reaches_the_lp_in_the_table(scheme):
    """TreeLP's row of the table equals the LP on 16 cases per scheme (V 3-4, k 2-3, two seeds, two temperatures)."""
    rows = tree_rules_table([ToyCase(V=V, k=k, L=4 - k, scheme=scheme,
                                     seeds=(2 * s, 2 * s + 1), temperature=t)
                             for V in (3, 4) for k in (2, 3) for s in range(2) for t in (0.5, 1.0)], rules=())
    assert len(rows) == 16 and all(r.rule == "tree_lp" and abs(r.ratio - 1) < 1e-9 for r in rows)
