import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otm.laws import OtmError
from otm.schemes import IID, Greedy, SpecHub, Table, WithoutReplacement, make_scheme, rows_from_tuples
from otm.testing import chi2_gof, chi2_power
from strategies import law
from hyp import examples

SCHEMES = {
    "iid": lambda q, k: IID(q, k),
    "without_replacement": lambda q, k: WithoutReplacement(q, k),
    "greedy": lambda q, k: Greedy(q, k),
    "spechub": lambda q, k: SpecHub(q, 2),
}


def as_dict(rows):
    return {tuple(rows.members(r)): rows.mass[r] for r in range(rows.n)}


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(2, 5).flatmap(law), st.integers(1, 4), st.sampled_from(sorted(SCHEMES)))
def test_enumeration_is_a_law_and_folding_agrees(q, k, name):
    try:
        scheme = SCHEMES[name](q, k)
    except OtmError:
        return  # e.g. fewer than k tokens with positive mass: refused, tested below
    tuples, probs = scheme.enumerate()
    assert tuples.shape[1] == scheme.k
    assert abs(probs.sum() - 1.0) < 1e-12
    assert (probs > 0).all() and (scheme.draft[tuples] > 0).all()
    direct = as_dict(scheme.rows(fold=True))
    folded = as_dict(rows_from_tuples(tuples, probs, fold=True))
    assert direct.keys() == folded.keys()
    assert max(abs(direct[s] - folded[s]) for s in direct) < 1e-14
    assert scheme.n_tuples() == tuples.shape[0]
    assert scheme.n_sets() >= len(direct)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(2, 5).flatmap(law), st.integers(1, 3))
def test_iid_marginals(q, k):
    tuples, probs = IID(q, k).enumerate()
    for i in range(k):
        marg = np.bincount(tuples[:, i], weights=probs, minlength=q.size)
        assert np.abs(marg - q).max() < 1e-12


def test_without_replacement_tiny_masses_keep_precision():
    q = np.array([1 - 1e-12, 0.5e-12, 0.5e-12])
    tuples, probs = WithoutReplacement(q, 2).enumerate()
    got = dict(zip(map(tuple, tuples), probs))
    assert abs(got[(0, 1)] - 0.5 * (1 - 1e-12)) < 1e-15
    assert abs(got[(1, 0)] - 0.5e-12 * (1 - 1e-12) / (1 - 0.5e-12)) < 1e-24


def test_greedy_and_spechub_structure():
    q = np.array([0.1, 0.4, 0.2, 0.3])
    g = Greedy(q, 3)
    assert g.fixed.tolist() == [1, 3]
    t, p = g.enumerate()
    assert sorted(t[:, 2].tolist()) == [0, 2] and abs(p.sum() - 1) < 1e-15
    h = SpecHub(q)
    t, p = h.enumerate()
    assert h.hub == 1 and all(1 in row for row in t.tolist())
    sets = as_dict(h.rows())
    assert abs(sets[(0, 1)] - 0.1 / 0.6) < 1e-15


def test_ties_break_towards_lower_index():
    assert Greedy([0.25, 0.25, 0.25, 0.25], 3).fixed.tolist() == [0, 1]
    assert SpecHub([0.4, 0.4, 0.2]).hub == 0


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: WithoutReplacement([0.5, 0.5, 0.0], 3), "at least k=3"),
        (lambda: Greedy([1.0, 0.0, 0.0], 2), "outside the top"),
        (lambda: SpecHub([1.0, 0.0], 2), "two tokens"),
        (lambda: SpecHub([0.5, 0.5], 3), "exactly k=2"),
        (lambda: IID([0.5, 0.5], 0), "k must be >= 1"),
        (lambda: make_scheme("beam", [0.5, 0.5], 2), "unknown scheme"),
        (lambda: Table([[0, 1], [1, 5]], [0.5, 0.5], 3), "must lie in"),
        (lambda: Table([[0, 1]], [0.5, 0.5], 3), "one per tuple"),
        (lambda: IID(np.full(64, 1 / 64), 4).enumerate(), "more than the limit"),
    ],
)
def test_bad_schemes_refused(make, fragment):
    with pytest.raises(OtmError) as exc:
        make()
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_table_merges_duplicates():
    t = Table([[0, 1], [0, 1], [2, 2]], [0.25, 0.25, 0.5], 3)
    tuples, probs = t.enumerate()
    assert dict(zip(map(tuple, tuples), probs)) == {(0, 1): 0.5, (2, 2): 0.5}
    assert math.isclose(as_dict(t.rows())[(2,)], 0.5)


# -- samplers against the exact tuple law ----------------------------------------------

N_DRAWS = 20_000
ALPHA = 1e-3


def tuple_counts(sample, tuples, n, seed):
    rng = np.random.default_rng(seed)
    index = {tuple(t): i for i, t in enumerate(tuples.tolist())}
    counts = np.zeros(len(index) + 1)  # last cell: a tuple outside the support
    for _ in range(n):
        counts[index.get(tuple(sample(rng).tolist()), len(index))] += 1
    return counts


Q = np.array([0.05, 0.4, 0.25, 0.2, 0.1])


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_sampler_matches_enumeration(name):
    k = 2
    scheme = SCHEMES[name](Q, k)
    tuples, probs = scheme.enumerate()
    p0 = np.append(probs, 0.0)
    counts = tuple_counts(scheme.sample, tuples, N_DRAWS, seed=1)
    result = chi2_gof(counts, p0, alpha=ALPHA)
    assert not result.reject, str(result)


def test_sampler_test_has_power_negative_control():
    """Without-replacement drafts tested against the law of iid drafts: the same test
    (power stated and checked) rejects them."""
    iid = IID(Q, 2)
    tuples, probs = iid.enumerate()
    wo = WithoutReplacement(Q, 2)
    wo_t, wo_p = wo.enumerate()
    wo_law = dict(zip(map(tuple, wo_t.tolist()), wo_p))
    p1 = np.append([wo_law.get(tuple(t), 0.0) for t in tuples.tolist()], 0.0)
    p0 = np.append(probs, 0.0)
    power = chi2_power(N_DRAWS, p0, p1, alpha=ALPHA)
    assert power > 0.99
    result = chi2_gof(tuple_counts(wo.sample, tuples, N_DRAWS, seed=2), p0, alpha=ALPHA)
    assert result.reject, str(result)


def test_top_scheme_fixed_drafts_optimum_and_torch_twin():
    """``top``: the k most probable draft tokens (decreasing, ties to the lower index), probability 1;
    alpha* = target mass of the set (closed form = brute force = LP); torch twin gives the same tuple."""
    torch = pytest.importorskip("torch")  # the core's tests also run without torch (make check-versions)
    import otm.torch as ot
    from otm.lp import solve_lp
    from otm.optimum import brute_force_optimum, optimal_acceptance_of
    from otm.schemes import Top

    draft = np.array([0.1, 0.3, 0.1, 0.3, 0.2, 0.0])
    target = np.array([0.25, 0.05, 0.3, 0.1, 0.2, 0.1])
    scheme = Top(draft, 3)
    tuples, probs = scheme.enumerate()
    assert tuples.tolist() == [[1, 3, 4]] and probs.tolist() == [1.0]
    assert scheme.sample(np.random.default_rng(0)).tolist() == [1, 3, 4]
    opt = optimal_acceptance_of(scheme, target).value
    assert abs(opt - 0.35) < 1e-12
    assert abs(brute_force_optimum(scheme, target) - opt) < 1e-12
    assert abs(solve_lp(scheme, target).value - opt) < 1e-9
    assert ot.sample_top(torch.tensor(draft)[None], 3).tolist() == [[1, 3, 4]]
    with pytest.raises(OtmError, match="support"):
        Top(draft, 6)
