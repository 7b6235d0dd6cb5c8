"""The exact OTM LP (otm.lp): value, backends, folding, plan completion, sizes, tiny masses.

Independent references: a brute-force subset formula over all 2^V token sets
(Hu et al., theory section 3.1), POT's exact network simplex on the dense
ordered-tuple problem, and the closed forms for k = 1, identical laws, disjoint
supports and point-mass targets.
"""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from otm.laws import OtmError
from otm.lp import TransportPlan, count_variables, rows_from_tuples_unfolded, solve_lp
from otm.schemes import IID, Greedy, Scheme, SpecHub, Table, WithoutReplacement, rows_from_tuples
from strategies import law, pair
from hyp import examples

SCHEMES = {
    "iid": lambda q, k: IID(q, k),
    "without_replacement": lambda q, k: WithoutReplacement(q, k),
    "greedy": lambda q, k: Greedy(q, k),
    "spechub": lambda q, k: SpecHub(q, 2),
}

BACKENDS = ("highs", "cvxpy", "pot")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


def brute_alpha(scheme, target) -> float:
    """min over all token sets H of target(H) + 1 - Q(H), Q(H) = P(all drafts in H)."""
    tuples, probs = scheme.enumerate()
    V = scheme.V
    tuple_bits = np.bitwise_or.reduce(np.left_shift(1, tuples), axis=1)  # [n] set as bitmask
    subsets = np.arange(1 << V)
    inside = (tuple_bits[None, :] & ~subsets[:, None]) == 0  # [2^V, n]
    q_h = inside.astype(float) @ probs
    p_h = ((subsets[:, None] >> np.arange(V)) & 1).astype(float) @ np.asarray(target)
    return float(np.min(p_h + 1.0 - q_h))


def pot_alpha(scheme, target) -> float:
    """1 - exact OT cost (POT network simplex) with cost 1[y not in tuple], dense over ordered tuples."""
    tuples, probs = scheme.enumerate()
    M = np.ones((tuples.shape[0], scheme.V))
    for j in range(tuples.shape[1]):
        M[np.arange(tuples.shape[0]), tuples[:, j]] = 0.0
    b = np.asarray(target, dtype=np.float64)
    return 1.0 - float(ot.emd2(probs / probs.sum(), b / b.sum(), M, numItermax=1_000_000))


def make(name, q, k):
    try:
        return SCHEMES[name](q, k)
    except OtmError:
        assume(False)  # e.g. fewer than k tokens with positive draft mass


def check_plan(res, scheme, target, tol=1e-12):
    """The completed plan is a coupling of the scheme's law and the target, and its value is the LP's."""
    plan = res.plan
    assert plan.acceptance == res.value
    # the solver's own objective may exceed the optimum by its feasibility tolerance
    # (1e-10 per constraint; 1.2e-9 seen on an unfolded iid case with masses down to 1e-15)
    assert abs(res.solver_value - res.value) < 1e-8
    assert (plan.pi >= 0).all()
    assert (plan.hit_row_sums() <= plan.rows.mass * (1 + 1e-12) + 1e-300).all()
    assert (plan.hit_col_sums() <= target * (1 + 1e-12) + 1e-300).all()
    np.testing.assert_allclose(plan.output_law(), target, rtol=0, atol=tol)
    if res.dual_bound is not None:
        assert res.dual_bound >= plan.acceptance - 1e-12
        assert res.dual_bound - res.value < 1e-8
    # averaged over the scheme's draws, the conditional laws give back the target
    tuples, probs = scheme.enumerate()
    laws = np.array([plan.conditional(t) for t in tuples])
    assert (laws >= 0).all()
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(probs @ laws, target, rtol=0, atol=tol)
    # and the hits of a row are its members only: P(Y in set) under the conditionals = acceptance
    hit = sum(p * law[np.unique(t)].sum() for t, p, law in zip(tuples, probs, laws))
    assert hit >= plan.acceptance - 1e-12


# ---------------------------------------------------------------------------------------------
# value against independent references
# ---------------------------------------------------------------------------------------------


_TINY = np.array([4e-10, 0.25, 0.375, 0.375]) / (1 + 4e-10)  # summing to 1, as the strategy's laws do


@settings(max_examples=examples(150), **SETTINGS)
@given(pair(2, 6), st.integers(1, 3), st.sampled_from(sorted(SCHEMES)))
# a 4e-10 mass: the unfolded cvxpy plan lost 1.09e-9 of acceptance in the repair before its top-up
@example(tq=(_TINY, _TINY), k=3, name="iid")
def test_value_is_the_subset_formula_for_both_backends_and_folds(tq, k, name):
    target, draft = tq
    scheme = make(name, draft, k)
    expected = brute_alpha(scheme, target)
    values = {}
    for backend in BACKENDS:
        for fold in (True, False):
            res = solve_lp(scheme, target, backend=backend, fold=fold)
            assert res.backend == backend and res.folded == fold
            values[backend, fold] = res.value
            assert abs(res.value - expected) < 1e-9, (backend, fold, res.value, expected)
            assert res.n_variables == count_variables(scheme, fold) == res.plan.rows.tokens.size
            assert res.n_constraints == res.plan.rows.n + scheme.V
            check_plan(res, scheme, target)
    assert max(values.values()) - min(values.values()) < 1e-9


@st.composite
def table_case(draw):
    V = draw(st.integers(2, 6))
    k = draw(st.integers(1, 3))
    n = draw(st.integers(1, 8))
    tuples = np.array(draw(st.lists(st.lists(st.integers(0, V - 1), min_size=k, max_size=k), min_size=n, max_size=n)))
    probs = draw(law(n))
    target = draw(law(V))
    return Table(tuples, probs, V), target


@settings(max_examples=examples(80), **SETTINGS)
@given(table_case())
def test_table_scheme_value_and_plan(case):
    scheme, target = case
    expected = brute_alpha(scheme, target)
    for backend in BACKENDS:
        for fold in (True, False):
            res = solve_lp(scheme, target, backend=backend, fold=fold)
            assert abs(res.value - expected) < 1e-9
            assert res.n_variables == count_variables(scheme, fold)
            check_plan(res, scheme, target)


@settings(max_examples=examples(40), **SETTINGS)
@given(pair(2, 5), st.integers(1, 3), st.sampled_from(["iid", "without_replacement", "greedy"]))
def test_lp_agrees_with_pot_network_simplex(tq, k, name):
    target, draft = tq
    scheme = make(name, draft, k)
    res = solve_lp(scheme, target, backend="highs")
    assert abs(res.value - pot_alpha(scheme, target)) < 1e-9


def test_pot_and_brute_force_references_agree_on_a_fixed_case():
    # guards the references themselves: an iid case with a known optimum
    scheme = IID([0.5, 0.3, 0.2], 2)
    target = np.array([0.2, 0.3, 0.5])
    assert brute_alpha(scheme, target) == pytest.approx(0.86, abs=1e-12)  # H = {0, 1}: 0.5 + 1 - 0.64
    assert pot_alpha(scheme, target) == pytest.approx(0.86, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# closed forms
# ---------------------------------------------------------------------------------------------


@settings(max_examples=examples(40), **SETTINGS)
@given(pair(2, 6))
def test_single_draft_is_maximal_coupling(tq):
    target, draft = tq
    res = solve_lp(IID(draft, 1), target, backend="highs")
    assert abs(res.value - np.minimum(target, draft).sum()) < 1e-9


@settings(max_examples=examples(30), **SETTINGS)
@given(st.integers(2, 6).flatmap(law), st.integers(1, 3), st.sampled_from(sorted(SCHEMES)))
def test_identical_laws_accept_everything(q, k, name):
    # every scheme here draws some token set whose law dominates q in the sense Q(H) <= q(H)
    scheme = make(name, q, k)
    for backend in BACKENDS:
        assert abs(solve_lp(scheme, q, backend=backend).value - 1.0) < 1e-9


@settings(max_examples=examples(30), **SETTINGS)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.data())
def test_disjoint_supports_accept_nothing(a, b, k, data):
    target = np.concatenate([data.draw(law(a)), np.zeros(b)])
    draft = np.concatenate([np.zeros(a), data.draw(law(b))])
    for backend in BACKENDS:
        res = solve_lp(IID(draft, k), target, backend=backend)
        assert res.value == 0.0  # no hit can land on a token of target mass 0
        assert abs(res.solver_value) < 1e-9
        check_plan(res, IID(draft, k), target)


@settings(max_examples=examples(30), **SETTINGS)
@given(st.integers(2, 6).flatmap(law), st.integers(1, 3), st.sampled_from(sorted(SCHEMES)), st.data())
def test_point_mass_target_accepts_with_probability_of_being_drafted(q, k, name, data):
    scheme = make(name, q, k)
    y = data.draw(st.integers(0, scheme.V - 1))
    target = np.zeros(scheme.V)
    target[y] = 1.0
    tuples, probs = scheme.enumerate()
    expected = probs[(tuples == y).any(axis=1)].sum()
    assert abs(solve_lp(scheme, target, backend="highs").value - expected) < 1e-9


# ---------------------------------------------------------------------------------------------
# tiny masses (HiGHS presolve regression), sizes, input errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tiny", [1e-7, 1e-9, 1e-12, 0.0])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_masses_solve_without_false_infeasible(tiny, backend):
    tuples = np.array([[0, 1], [2, 2], [1, 3], [3, 3]])
    probs = np.array([0.6 - tiny, tiny, 0.4 - tiny, tiny])
    probs = probs / probs.sum()
    table = Table(tuples, probs, 4)
    target = np.array([0.25 - tiny, 0.25, 0.5, tiny])
    target = target / target.sum()
    draft = np.array([0.5, tiny, 0.3, 0.2 - tiny])
    draft = draft / draft.sum()
    for scheme in (table, IID(draft, 3), WithoutReplacement(draft, 2), Greedy(draft, 3)):
        for fold in (True, False):
            res = solve_lp(scheme, target, backend=backend, fold=fold)
            assert abs(res.value - brute_alpha(scheme, target)) < 1e-9
            check_plan(res, scheme, target)


def test_too_large_lp_is_refused_early_with_a_one_line_message():
    scheme = IID(np.full(64, 1 / 64), 4)
    n = sum(math.comb(64, m) * m for m in range(1, 5))
    assert n > 2_000_000
    with pytest.raises(OtmError) as err:
        solve_lp(scheme, np.full(64, 1 / 64), backend="highs")
    msg = str(err.value)
    assert "\n" not in msg and f"{n:,}" in msg and "max_variables=2,000,000" in msg
    with pytest.raises(OtmError, match=f"{64 * (64**4 - 63**4):,} variables"):
        solve_lp(scheme, np.full(64, 1 / 64), fold=False)


def test_max_variables_is_a_sharp_limit():
    scheme = IID([0.25] * 4, 2)
    assert count_variables(scheme, True) == 16
    assert solve_lp(scheme, [0.25] * 4, backend="highs", max_variables=16).n_variables == 16
    with pytest.raises(OtmError, match="16 variables, more than max_variables=15"):
        solve_lp(scheme, [0.25] * 4, backend="highs", max_variables=15)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(backend="gurobi"), "unknown LP backend"),
        (dict(target=[0.5, 0.5]), "has 2 masses"),
        (dict(target=[0.5, 0.6, -0.1]), "negative mass"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    kwargs = {"target": [0.2, 0.3, 0.5], **kwargs}
    with pytest.raises(OtmError, match=match):
        solve_lp(IID([0.5, 0.3, 0.2], 2), **kwargs)


def test_conditional_of_an_impossible_draft_set_is_refused():
    res = solve_lp(WithoutReplacement([0.5, 0.3, 0.2], 2), [0.2, 0.3, 0.5], backend="highs")
    with pytest.raises(OtmError, match="probability 0"):
        res.plan.conditional([1, 1])  # without replacement never repeats a token


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------


def as_dict(rows, values=None):
    values = rows.mass if values is None else values
    return {tuple(rows.members(r)): values[r] for r in range(rows.n)}


@settings(max_examples=examples(40), **SETTINGS)
@given(st.integers(2, 5).flatmap(law), st.integers(1, 3), st.sampled_from(sorted(SCHEMES)))
def test_vectorised_rows_and_plan_folding_match_the_schemes(q, k, name):
    scheme = make(name, q, k)
    tuples, probs = scheme.enumerate()
    mine, theirs = rows_from_tuples_unfolded(tuples, probs), rows_from_tuples(tuples, probs, fold=False)
    np.testing.assert_array_equal(mine.ptr, theirs.ptr)
    np.testing.assert_array_equal(mine.tokens, theirs.tokens)
    # folding an (arbitrary) unfolded plan merges rows exactly like the scheme's own folding
    pi = np.random.default_rng(0).random(mine.tokens.size)
    folded = TransportPlan(mine, pi, np.full(scheme.V, 1 / scheme.V), folded=False).fold()
    want = as_dict(scheme.rows(fold=True))
    got = as_dict(folded.rows)
    assert got.keys() == want.keys()
    assert max(abs(got[s] - want[s]) for s in want) < 1e-14
    assert abs(folded.pi.sum() - pi.sum()) < 1e-12


def test_plan_repair_makes_an_infeasible_solution_feasible():
    scheme = IID([0.5, 0.5], 2)  # rows {0}, {1}, {0, 1} with masses 1/4, 1/4, 1/2
    rows = scheme.rows(fold=True)
    target = np.array([0.9, 0.1])
    x = np.array([0.3, -1e-9, 0.4, 0.3])  # row {0} over its mass, a negative, token 0 over target
    plan = TransportPlan.from_solution(rows, x, target)
    assert (plan.pi >= 0).all()
    assert (plan.hit_row_sums() <= rows.mass + 1e-15).all()
    assert (plan.hit_col_sums() <= target + 1e-15).all()
    assert plan.acceptance < x.clip(0).sum()
    np.testing.assert_allclose(plan.output_law(), target, atol=1e-15)
    coupling = plan.coupling()
    np.testing.assert_allclose(coupling.sum(axis=1), rows.mass, atol=1e-15)
    np.testing.assert_allclose(coupling.sum(axis=0), target, atol=1e-15)


class _Pairs(Scheme):
    """A scheme class otm.lp does not know: two drafts, (i, i+1 mod V) with probability 1/V."""

    name = "pairs"

    def __init__(self, V: int):
        self.V, self.k, self.draft = V, 2, None

    def n_tuples(self) -> int:
        return self.V

    def n_sets(self) -> int:
        return self.V

    def _enumerate(self):
        i = np.arange(self.V)
        return np.stack([i, (i + 1) % self.V], axis=1), np.full(self.V, 1 / self.V)


def test_a_scheme_class_without_a_variable_count_is_counted_from_its_rows():
    scheme = _Pairs(5)
    assert count_variables(scheme) is None
    target = np.array([0.5, 0.5, 0.0, 0.0, 0.0])
    res = solve_lp(scheme, target, backend="highs")
    assert res.n_variables == 10
    # rows {0,1}, {1,2}, {4,0} reach tokens 0 and 1: 3/5 of the draft mass, all of it usable
    assert abs(res.value - brute_alpha(scheme, target)) < 1e-12 and abs(res.value - 0.6) < 1e-12
    with pytest.raises(OtmError, match="would have 10 variables, more than max_variables=9"):
        solve_lp(scheme, target, max_variables=9)
    with pytest.raises(OtmError, match="at least 5 variables"):
        solve_lp(scheme, target, max_variables=4)
