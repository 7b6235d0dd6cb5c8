"""The closed-form optimum (otm.optimum) against the brute-force minimum cut and exact laws.

References used here, each independent of the code under test:

* :func:`brute_force_optimum` -- all 2^V subsets, Q(H) summed from the scheme's
  enumeration (itself tested in test_schemes.py); guarded by a negative control;
* P(first k draws in H) from :meth:`WithoutReplacement.enumerate`, for any H;
* at V = 2000, a law with four mass classes, whose Q(H) is an exact recursion
  over how many tokens of each class have been drawn.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from otm.laws import OtmError
from otm.optimum import (
    QUADRATURE_TOLERANCE,
    QuadratureWarning,
    brute_force_optimum,
    optimal_acceptance,
    optimal_acceptance_of,
    prefix_membership,
    ratio_order,
)
from otm.schemes import IID, Greedy, SpecHub, Table, WithoutReplacement, make_scheme
from strategies import law, pair
from hyp import examples

TOL = 1e-10
SETTINGS = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def q_inside(scheme, H: np.ndarray) -> float:
    """P(all drafts in H) from the scheme's enumeration."""
    tuples, probs = scheme.enumerate()
    return float(probs[H[tuples].all(axis=1)].sum())


def check_against_brute_force(scheme, target) -> None:
    opt = optimal_acceptance_of(scheme, target)
    ref = brute_force_optimum(scheme, target)
    assert abs(opt.value - ref) <= TOL, (opt.value, ref)
    # the returned set attains the value: it is a minimum cut
    assert abs(target[opt.H].sum() + 1 - q_inside(scheme, opt.H) - opt.value) <= TOL
    assert opt.error_estimate <= QUADRATURE_TOLERANCE


@st.composite
def tied_pair(draw, min_V: int = 3, max_V: int = 7):
    """Target proportional to the draft on groups of tokens: ties in the ratio."""
    V = draw(st.integers(min_V, max_V))
    draft = draw(law(V))
    groups = np.array(draw(st.lists(st.integers(0, 2), min_size=V, max_size=V)))
    factor = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=3, max_size=3)))
    target = draft * factor[groups]
    assume(target.sum() > 0)
    return target / target.sum(), draft


# -----------------------------------------------------------------------------
# closed form == brute force
# -----------------------------------------------------------------------------
@SETTINGS
@given(pair(2, 6), st.integers(1, 4))
def test_iid_matches_brute_force(laws, k):
    target, draft = laws
    check_against_brute_force(IID(draft, k), target)


@SETTINGS
@given(pair(2, 8), st.integers(1, 5))
def test_without_replacement_matches_brute_force(laws, k):
    target, draft = laws
    if np.count_nonzero(draft) < k:
        with pytest.raises(OtmError, match="at least k="):
            WithoutReplacement(draft, k)
        return
    check_against_brute_force(WithoutReplacement(draft, k), target)


@SETTINGS
@given(pair(2, 7), st.integers(1, 4))
def test_greedy_matches_brute_force(laws, k):
    target, draft = laws
    try:
        scheme = Greedy(draft, k)
    except OtmError:
        scheme = None  # k > V or no draft mass outside the fixed tokens: refused by the scheme
    assume(scheme is not None)
    check_against_brute_force(scheme, target)


@SETTINGS
@given(pair(2, 8))
def test_spechub_matches_brute_force(laws):
    target, draft = laws
    try:
        scheme = SpecHub(draft)
    except OtmError:
        scheme = None  # a point-mass draft: refused by the scheme
    assume(scheme is not None)
    check_against_brute_force(scheme, target)


@SETTINGS
@given(tied_pair(), st.integers(1, 4), st.sampled_from(["iid", "without_replacement"]))
def test_ties_in_the_ratio(laws, k, name):
    target, draft = laws
    assume(name != "without_replacement" or np.count_nonzero(draft) >= k)
    check_against_brute_force(make_scheme(name, draft, k), target)


def test_table_scheme_goes_through_brute_force():
    scheme = Table([[0, 1], [2, 2], [1, 3]], [0.5, 0.25, 0.25], V=4)
    target = np.array([0.4, 0.1, 0.2, 0.3])
    opt = optimal_acceptance_of(scheme, target)
    assert opt.method == "brute_force"
    assert abs(opt.value - brute_force_optimum(scheme, target)) <= 1e-15


# -----------------------------------------------------------------------------
# properties of alpha*
# -----------------------------------------------------------------------------
@SETTINGS
@given(pair(2, 12), st.sampled_from(["iid", "without_replacement", "greedy"]))
def test_one_draft_is_one_minus_total_variation(laws, name):
    target, draft = laws
    assert abs(optimal_acceptance(target, draft, 1, name) - np.minimum(target, draft).sum()) <= 1e-12


@SETTINGS
@given(pair(2, 12))
def test_iid_optimum_grows_with_k(laws):
    target, draft = laws
    values = [optimal_acceptance(target, draft, k, "iid") for k in range(1, 7)]
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:])), values


@SETTINGS
@given(pair(2, 10))
def test_without_replacement_optimum_grows_with_k(laws):
    # the first k of k+1 successive draws are k successive draws
    target, draft = laws
    ks = range(1, min(6, np.count_nonzero(draft)) + 1)
    values = [optimal_acceptance(target, draft, k, "without_replacement") for k in ks]
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:])), values


def test_identical_laws_and_disjoint_supports():
    law_ = np.array([0.5, 0.25, 0.125, 0.125])
    for name in ("iid", "without_replacement", "greedy"):
        assert abs(optimal_acceptance(law_, law_, 2, name) - 1.0) <= 1e-15
    target = np.array([0.6, 0.4, 0.0, 0.0])
    draft = np.array([0.0, 0.0, 0.7, 0.3])
    for name in ("iid", "without_replacement", "greedy", "spechub"):
        assert optimal_acceptance(target, draft, 2, name) <= 1e-15


def test_descending_order_is_wrong_negative_control():
    # the brute force sees the difference between the ratio order and its reverse
    target = np.array([0.5, 0.3, 0.2])
    draft = np.array([0.2, 0.2, 0.6])
    scheme = IID(draft, 2)
    ref = brute_force_optimum(scheme, target)
    order = ratio_order(target, draft)
    assert order.tolist() == [2, 1, 0]
    for o, agrees in ((order, True), (order[::-1].copy(), False)):
        m = prefix_membership(draft, 2, o, "iid")
        value = float(np.min(np.concatenate([[0.0], np.cumsum(target[o])]) + m.outside))
        assert (abs(value - ref) <= 1e-12) == agrees, (value, ref)
    assert abs(ref - 0.84) <= 1e-15  # H = {2}: 0.2 + 1 - 0.6^2


# -----------------------------------------------------------------------------
# the without-replacement membership law Q(H) for arbitrary H
# -----------------------------------------------------------------------------
@settings(max_examples=examples(150), deadline=None)
@given(st.integers(3, 9).flatmap(law), st.integers(2, 5), st.randoms(use_true_random=False))
def test_race_quadrature_matches_enumeration(draft, k, rnd):
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    tuples, probs = scheme.enumerate()
    V = draft.size
    for _ in range(6):  # several H per law; H is a prefix of an order that puts it first
        order = np.array(rnd.sample(range(V), V))
        m = prefix_membership(draft, k, order, method="race")
        assert m.method == "race" and m.error.max() <= QUADRATURE_TOLERANCE
        for j in range(V + 1):
            H = np.zeros(V, dtype=bool)
            H[order[:j]] = True
            exact = float(probs[H[tuples].all(axis=1)].sum())
            assert abs(m.inside[j] - exact) <= 1e-12, (j, m.inside[j], exact)


def peaked(rng, V, scale=3.0):
    x = scale * rng.standard_normal(V)
    w = np.exp(x - x.max())
    return w / w.sum()


@pytest.mark.parametrize("kind", ["peaked", "dirichlet", "tiny"])
def test_race_k2_matches_closed_form_at_V1000(kind):
    rng = np.random.default_rng(7)
    V = 1000
    if kind == "peaked":
        draft, target = peaked(rng, V), peaked(rng, V)
    elif kind == "dirichlet":
        draft, target = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    else:  # one dominant token, the rest around 1e-12 (the 1 - q_a near 0 corner)
        draft = np.full(V, 1e-12) * rng.uniform(0.5, 1.5, V)
        draft[3] = 1 - draft.sum() + draft[3]
        target = rng.dirichlet(np.ones(V))
    order = ratio_order(target, draft)
    exact = prefix_membership(draft, 2, order)
    race = prefix_membership(draft, 2, order, method="race")
    assert exact.method == "exact" and race.method == "race"
    assert np.abs(exact.inside - race.inside).max() <= 1e-12
    assert race.error.max() <= QUADRATURE_TOLERANCE


def classes_inside(u, n_in, c_out, k):
    """P(first k successive draws in H): H holds n_in[c] tokens of mass u[c]; the rest has mass c_out."""

    @lru_cache(maxsize=None)
    def rec(drawn):
        if sum(drawn) == k:
            return 1.0
        left = [n - d for n, d in zip(n_in, drawn)]
        remaining = c_out + math.fsum(l_ * m for l_, m in zip(left, u))
        total = 0.0
        for c, l_ in enumerate(left):
            if l_ > 0:
                nxt = list(drawn)
                nxt[c] += 1
                total += l_ * u[c] / remaining * rec(tuple(nxt))
        return total

    return rec((0,) * len(u))


@pytest.mark.parametrize("k", [3, 4])
def test_race_at_V2000_matches_exact_class_recursion(k):
    rng = np.random.default_rng(11)
    counts = np.array([4, 96, 900, 1000])
    weights = np.array([0.55, 0.3, 0.15 - 1e-9, 1e-9])  # the last class has masses 1e-12
    cls = rng.permutation(np.repeat(np.arange(4), counts))
    draft = (weights / counts)[cls]
    target = rng.dirichlet(np.ones(cls.size))
    order = ratio_order(target, draft)
    u = [float(draft[np.flatnonzero(cls == c)[0]]) for c in range(4)]
    m = prefix_membership(draft, k, order)
    assert m.method == "race" and m.error.max() <= QUADRATURE_TOLERANCE
    onehot = np.eye(4, dtype=np.int64)[cls[order]]
    n_in = np.vstack([np.zeros(4, dtype=np.int64), np.cumsum(onehot, axis=0)])  # class counts in H_j
    exact = np.empty(cls.size + 1)
    for j in range(cls.size + 1):
        c_out = math.fsum((counts - n_in[j]) * np.array(u))
        exact[j] = 1.0 if c_out == 0 else classes_inside(tuple(u), tuple(map(int, n_in[j])), c_out, k)
    assert np.abs(m.inside - exact).max() <= 1e-12
    # and the optimum is the exact prefix minimum
    opt = optimal_acceptance_of(WithoutReplacement(draft, k), target)
    best = np.min(np.concatenate([[0.0], np.cumsum(target[order])]) + 1 - exact)
    assert abs(opt.value - best) <= 1e-12


def test_full_vocabulary_runs_and_is_accurate():
    rng = np.random.default_rng(0)
    V = 49152
    draft, target = peaked(rng, V), peaked(rng, V)
    floor = np.minimum(target, draft).sum()
    previous = floor
    for k in (2, 4):
        opt = optimal_acceptance_of(WithoutReplacement(draft, k), target)
        assert opt.error_estimate <= QUADRATURE_TOLERANCE
        assert previous - 1e-12 <= opt.value <= 1.0
        previous = opt.value
        assert opt.prefix_values.shape == (V + 1,) and opt.H.sum() == opt.prefix


# -----------------------------------------------------------------------------
# edges and refusals
# -----------------------------------------------------------------------------
def test_draft_zeros_are_never_drawn_and_full_support_is_certain():
    draft = np.array([0.4, 0.0, 0.3, 0.2, 0.1, 0.0])
    order = np.arange(6)
    for k, scheme in ((3, "without_replacement"), (2, "without_replacement"), (3, "iid")):
        m = prefix_membership(draft, k, order, scheme)
        assert m.inside[1] == m.inside[2]  # token 1 has no draft mass
        assert m.inside[5] == m.inside[6] == 1.0 > m.inside[4]  # H holds the whole draft support
        assert np.all(np.diff(m.inside) >= -1e-15)


@pytest.mark.parametrize("tiny", [1e-30, 1e-200, 1e-310, 5e-324])
def test_extreme_masses_down_to_the_smallest_subnormal(tiny):
    # two tokens of draft mass `tiny` close the ratio order: the race grid reaches t ~ 1/tiny
    draft = np.array([0.5, 0.3, 0.2, tiny, tiny])
    target = np.array([0.1, 0.1, 0.1, 0.35, 0.35])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in (2, 3, 4):
            for name in ("iid", "without_replacement"):
                check_against_brute_force(make_scheme(name, draft, k), target)
        m = prefix_membership(draft, 4, np.arange(5))
    assert abs(m.inside[4] - 0.5) <= 1e-12  # after the three big tokens, token 3 before token 4


def test_fewer_positive_tokens_than_k_is_refused():
    draft = np.array([0.5, 0.5, 0.0, 0.0])
    with pytest.raises(OtmError, match="at least k=3"):
        prefix_membership(draft, 3, np.arange(4))
    with pytest.raises(OtmError, match="at least k=3"):
        optimal_acceptance([0.25] * 4, draft, 3, "without_replacement")
    assert optimal_acceptance([0.25] * 4, draft, 3, "iid") <= 1.0


def test_brute_force_refuses_large_vocabularies():
    draft = np.full(21, 1 / 21)
    with pytest.raises(OtmError) as err:
        brute_force_optimum(IID(draft, 1), draft)
    assert "V=21" in str(err.value) and "20" in str(err.value) and "\n" not in str(err.value)


def test_bad_inputs():
    with pytest.raises(OtmError, match="draft has 3 masses but the target has 2"):
        optimal_acceptance([0.5, 0.5], [0.2, 0.3, 0.5], 2)
    with pytest.raises(OtmError, match="target has 2 masses but the iid scheme.s draft law has 3"):
        optimal_acceptance_of(IID([0.2, 0.3, 0.5], 2), [0.5, 0.5])
    with pytest.raises(OtmError, match="negative"):
        optimal_acceptance([0.5, 0.5], [1.2, -0.2], 2)
    with pytest.raises(OtmError, match="unknown scheme"):
        optimal_acceptance([0.5, 0.5], [0.5, 0.5], 2, "beam")
    with pytest.raises(OtmError, match="expected a draft scheme"):
        optimal_acceptance_of("iid", [0.5, 0.5])
    with pytest.raises(OtmError, match="permutation"):
        prefix_membership([0.5, 0.5], 2, [0, 0])


def test_a_coarse_step_is_refined_or_warned():
    rng = np.random.default_rng(3)
    draft, target = peaked(rng, 300), peaked(rng, 300)
    good = optimal_acceptance_of(WithoutReplacement(draft, 4), target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refined = optimal_acceptance_of(WithoutReplacement(draft, 4), target, step=0.4)  # halved to 0.2
    assert abs(refined.value - good.value) <= 1e-12
    with pytest.warns(QuadratureWarning, match="error estimate"):
        coarse = optimal_acceptance_of(WithoutReplacement(draft, 4), target, step=2.0)
    assert coarse.error_estimate > QUADRATURE_TOLERANCE


def test_ratio_overflow_is_not_tied_with_zero_draft_mass():
    # target / draft overflows for a subnormal draft mass: it used to tie (as inf) with the
    # zero-draft token 0, which the stable sort put first; k = 3 then gave 1.0 instead of 0.7
    x = 1e-310
    draft = np.array([0.0, 0.5, 0.5 - x, x])
    target = np.array([0.3, 0.0, 0.0, 0.7])
    assert ratio_order(target, draft).tolist() == [1, 2, 3, 0]
    scheme = WithoutReplacement(draft, 3)
    assert abs(optimal_acceptance_of(scheme, target).value - 0.7) <= 1e-15
    assert abs(brute_force_optimum(scheme, target) - 0.7) <= 1e-15
    # two overflowed ratios are ordered by their true ratio, not by index
    draft = np.array([0.0, 0.5, 0.5 - 2 * x, x, x])
    target = np.array([0.0, 0.0, 0.3, 0.6, 0.1])
    assert ratio_order(target, draft).tolist() == [1, 2, 4, 3, 0]
    scheme = WithoutReplacement(draft, 3)
    ref = brute_force_optimum(scheme, target)
    assert abs(ref - 0.9) <= 1e-12  # H = {1, 2, 4}: 0.4 + 1 - 1/2
    assert abs(optimal_acceptance_of(scheme, target).value - ref) <= 1e-12


# -----------------------------------------------------------------------------
# the prefix property, without replacement: proved by the exchange inequality (E)
# -----------------------------------------------------------------------------
def marginal_gains(scheme) -> list[np.ndarray]:
    """gain[x][H] = P(every draft in H and x drafted), every bitmask H, from the enumerated set law.

    Summed from positive terms (a zeta transform of the set law restricted to sets holding x), so
    Q(S + x) - Q(S) = gain[x][S + x] keeps its relative precision for tiny masses.
    """
    tuples, probs = scheme.enumerate()
    V = scheme.V
    masks = np.bitwise_or.reduce(np.left_shift(np.int64(1), tuples), axis=1)
    f = np.bincount(masks, weights=probs, minlength=1 << V)
    bits = (np.arange(1 << V)[:, None] >> np.arange(V)) & 1
    gains = []
    for x in range(V):
        g = f * bits[:, x]
        for bit in range(V):
            view = g.reshape(-1, 2, 1 << bit)
            view[:, 1, :] += view[:, 0, :]
        gains.append(g)
    return gains


def exchange_slack(scheme, draft) -> float:
    """min over S, a, b (a, b outside S, positive masses) of the relative slack of
    (E): gain_a(S + a + b) / q_a >= gain_b(S + b) / q_b."""
    V = scheme.V
    gains = marginal_gains(scheme)
    every = np.arange(1 << V)
    worst = np.inf
    for a in range(V):
        for b in range(V):
            if a == b or draft[a] <= 0 or draft[b] <= 0:
                continue
            S = every[(((every >> a) & 1) == 0) & (((every >> b) & 1) == 0)]
            lhs = gains[a][S | (1 << a) | (1 << b)] / draft[a]
            rhs = gains[b][S | (1 << b)] / draft[b]
            scale = np.maximum(lhs, rhs)
            ok = scale > 0
            if ok.any():
                worst = min(worst, float(((lhs - rhs)[ok] / scale[ok]).min()))
    return worst


@SETTINGS
@given(pair(3, 7), st.integers(2, 5))
def test_exchange_inequality_and_prefix_property(laws, k):
    # (E) is the lemma the prefix property rests on (otm.optimum, docs/closed_form.md): checked on
    # every (S, a, b); then the prefix minimum of the reference scan equals the minimum over all 2^V sets
    target, draft = laws
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    assert exchange_slack(scheme, draft) >= -1e-12
    ref = optimal_acceptance_of(scheme, target, method="reference")
    assert abs(ref.value - brute_force_optimum(scheme, target)) <= 1e-12


def test_exchange_inequality_fails_for_greedy_drafts_negative_control():
    # the check above can fail: greedy drafts (top-(k-1) fixed + one draw) break (E), as their prefix
    # property breaks (theory 3.3)
    draft = np.array([0.39034466808734636, 0.09292507872991655, 0.10068414878895443, 0.4160461043937826])
    assert exchange_slack(Greedy(draft, 2), draft) < -0.1
    assert exchange_slack(WithoutReplacement(draft, 2), draft) > 0


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(3, 9).flatmap(law), st.integers(2, 4), st.randoms(use_true_random=False))
def test_q_is_convex_in_the_draft_mass_along_any_order(draft, k, rnd):
    # a consequence of (E) used by the window method's chords: along any order, the slope
    # (Q(H_j) - Q(H_{j-1})) / q_{x_j} never decreases
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    gains = marginal_gains(scheme)
    positive = [x for x in range(draft.size) if draft[x] > 0]
    order = rnd.sample(positive, len(positive))
    mask, slopes = 0, []
    for x in order:
        mask |= 1 << x
        slopes.append(gains[x][mask] / draft[x])
    assert all(b >= a * (1 - 1e-12) - 1e-300 for a, b in zip(slopes, slopes[1:])), slopes


# -----------------------------------------------------------------------------
# the window method (otm.race_window) against brute force and the reference scan
# -----------------------------------------------------------------------------
@SETTINGS
@given(pair(3, 8), st.integers(3, 5))
def test_window_matches_brute_force(laws, k):
    target, draft = laws
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    opt = optimal_acceptance_of(scheme, target, method="window")
    assert opt.method == "prefix+race-window"
    check_against_brute_force(scheme, target)  # the default path (auto) is the window method too
    assert abs(opt.value - brute_force_optimum(scheme, target)) <= 1e-12


def law_family(kind: str, rng, V: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "peaked":
        z = rng.standard_normal(V)
        e = rng.standard_normal(V)
        w = np.exp(3 * z - 3 * z.max())
        d = np.exp(3 * (0.9 * z + 0.436 * e))
        return w / w.sum(), d / d.sum()
    if kind == "dirichlet0.05":
        return rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05))
    if kind == "dirichlet1":
        return rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    # a target correlated with a sparse draft, 1e-12 masses and exact zeros
    d = rng.dirichlet(np.full(V, 0.05))
    d[rng.random(V) < 0.2] = 0.0
    d[rng.random(V) < 0.2] = 1e-12
    d /= d.sum()
    t = 0.7 * d + 0.3 * rng.dirichlet(np.ones(V))
    return t / t.sum(), d


@pytest.mark.parametrize("kind", ["peaked", "dirichlet0.05", "dirichlet1", "sparse"])
@pytest.mark.parametrize("k", [3, 4, 8])
def test_window_matches_reference_at_V3000(kind, k):
    rng = np.random.default_rng(100 + k)
    target, draft = law_family(kind, rng, 3000)
    scheme = WithoutReplacement(draft, k)
    fast = optimal_acceptance_of(scheme, target)
    ref = optimal_acceptance_of(scheme, target, method="reference")
    assert fast.method == "prefix+race-window" and ref.method == "prefix+race"
    assert abs(fast.value - ref.value) <= 1e-12
    computed = ~np.isnan(fast.prefix_values)
    assert np.abs(fast.prefix_values[computed] - ref.prefix_values[computed]).max() <= 1e-12
    # every prefix the window method skipped cannot beat its value by more than TIE = 1e-13 in the
    # reference (3e-13 allows for the two quadratures' rounding): the pruning is sound
    assert np.all(ref.prefix_values[~computed] >= fast.value - 3e-13)
    assert computed.sum() < 3001 // 4  # and it skipped most of them
    assert abs(target[fast.H].sum() + 1 - prefix_membership(draft, k, fast.order).inside[fast.prefix] - fast.value) <= 1e-12


def test_window_method_declines_in_words_and_auto_falls_back():
    # a complement mass of 5e-324 needs t ~ 1e325 on the race grid: the window method declines
    draft = np.array([0.5, 0.3, 0.2, 5e-324, 5e-324])
    target = np.array([0.1, 0.1, 0.1, 0.35, 0.35])
    scheme = WithoutReplacement(draft, 3)
    with pytest.raises(OtmError) as err:
        optimal_acceptance_of(scheme, target, method="window")
    assert "declined" in str(err.value) and "\n" not in str(err.value)
    opt = optimal_acceptance_of(scheme, target)
    assert opt.method == "prefix+race" and "declined" in opt.note
    assert abs(opt.value - brute_force_optimum(scheme, target)) <= 1e-12


def test_method_is_checked():
    with pytest.raises(OtmError, match="unknown method 'fast'") as err:
        optimal_acceptance_of(WithoutReplacement([0.5, 0.3, 0.2], 2), [0.2, 0.3, 0.5], method="fast")
    assert "\n" not in str(err.value)


@st.composite
def medium_pair(draw):
    """V = 20..400 from a seed: sparse, flat, peaked, a dominant draft token, ties, zeros and 1e-12."""
    V = draw(st.integers(20, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["peaked", "dirichlet0.05", "dirichlet1", "sparse", "dominant", "ties"]))
    if kind == "dominant":  # one draft token near 1, the rest down to 1e-15
        draft = rng.dirichlet(np.ones(V)) * 10 ** rng.uniform(-14, -1)
        draft[rng.integers(V)] += 1.0
        return rng.dirichlet(np.full(V, 0.3)), draft / draft.sum()
    if kind == "ties":  # target proportional to the draft on groups
        draft = rng.dirichlet(np.full(V, 0.5))
        target = draft * np.array([0.0, 0.5, 1.0, 3.0])[rng.integers(4, size=V)]
        assume(target.sum() > 0)
        return target / target.sum(), draft
    return law_family(kind, rng, V)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(medium_pair(), st.integers(3, 8))
def test_window_matches_reference_on_hypothesis_laws(laws, k):
    target, draft = laws
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    fast = optimal_acceptance_of(scheme, target)
    ref = optimal_acceptance_of(scheme, target, method="reference")
    assert fast.method == "prefix+race-window", fast.note
    assert abs(fast.value - ref.value) <= 1e-12, (fast.value, ref.value, fast.note)
    skipped = np.isnan(fast.prefix_values)
    assert np.all(ref.prefix_values[skipped] >= fast.value - 3e-13)


# -----------------------------------------------------------------------------
# the heavy-token bounds (otm.race_heavy) and the raised lower cut of the race grid (otm.race_window)
# -----------------------------------------------------------------------------
@st.composite
def heavy_law(draw):
    """V = 3..7 masses with one to three heavy tokens among light ones down to 1e-12 (or a plain law)."""
    V = draw(st.integers(3, 7))
    kind = draw(st.sampled_from(["dominant", "two", "three", "plain"]))
    if kind == "plain":
        return draw(law(V))
    light = np.array(draw(st.lists(st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3, 0.02]), min_size=V, max_size=V)))
    light = light * np.array(draw(st.lists(st.floats(0.1, 10.0), min_size=V, max_size=V)))
    heavy = {"dominant": [1.0], "two": [0.6, 0.4], "three": [0.5, 0.3, 0.2]}[kind][:V]
    light[: len(heavy)] = heavy
    perm = draw(st.permutations(range(V)))
    q = light[list(perm)]
    return q / q.sum()


@settings(max_examples=examples(300), deadline=None)
@given(heavy_law(), st.integers(2, 6), st.randoms(use_true_random=False))
def test_heavy_bounds_bound_q_at_every_prefix(draft, k, rnd):
    # lo <= Q(H_j) <= hi for every prefix of any order, Q summed from the enumerated draft tuples;
    # any choice of heavy tokens gives valid bounds: the selection thresholds are lifted here
    from unittest import mock

    import otm.race_heavy as rh

    assume(np.count_nonzero(draft) >= k)
    positive = [x for x in range(draft.size) if draft[x] > 0]
    order = np.array(rnd.sample(positive, len(positive)))
    qp = draft[order]
    with mock.patch.multiple(rh, HEAVY_MIN=0.0, HEAVY_TOTAL=0.0):
        hv = rh.heavy_tokens(qp, k)
    assert hv is not None
    heavy_bounds = rh.heavy_bounds
    js = np.arange(qp.size + 1)
    lo, hi = heavy_bounds(hv, k, js)
    scheme = WithoutReplacement(draft, k)
    for j in js:
        H = np.zeros(draft.size, dtype=bool)
        H[order[:j]] = True
        Q = q_inside(scheme, H)
        assert lo[j] <= Q * (1 + 1e-12) and Q <= hi[j] * (1 + 1e-12) + 1e-300, (j, lo[j], Q, hi[j])


@st.composite
def equal_heavy_law(draw):
    """V = 4..8: two to V - 1 heavy tokens of (nearly) equal mass among light masses down to 1e-12."""
    V = draw(st.integers(4, 8))
    nh = draw(st.integers(2, V - 1))
    light = np.array(draw(st.lists(st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3, 0.02]), min_size=V, max_size=V)))
    light[:nh] = np.array(draw(st.lists(st.floats(0.8, 1.25), min_size=nh, max_size=nh)))
    q = light[list(draw(st.permutations(range(V))))]
    return q / q.sum()


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(equal_heavy_law(), heavy_law()), st.integers(2, 6), st.randoms(use_true_random=False),
       st.floats(0.0, 0.3))
def test_heavy_count_bounds_bound_q_at_every_prefix(draft, k, rnd, threshold):
    # the count-only walk (any set of heavy tokens: every mass >= threshold) brackets Q(H_j)
    import otm.race_heavy as rh

    assume(np.count_nonzero(draft) >= k)
    positive = [x for x in range(draft.size) if draft[x] > 0]
    order = np.array(rnd.sample(positive, len(positive)))
    qp = draft[order]
    top = np.flatnonzero(qp >= threshold)
    assume(top.size > 0)
    lo, hi = rh.heavy_count_bounds(rh._heavy_set(qp, k, top), k, np.arange(qp.size + 1))
    scheme = WithoutReplacement(draft, k)
    for j in range(qp.size + 1):
        H = np.zeros(draft.size, dtype=bool)
        H[order[:j]] = True
        Q = q_inside(scheme, H)
        assert lo[j] <= Q * (1 + 1e-12) and Q <= hi[j] * (1 + 1e-12) + 1e-300, (j, lo[j], Q, hi[j])


def test_heavy_count_bounds_are_tight_for_equal_heavy_tokens():
    # four tokens of 0.25 among 1e-9 masses: following subsets of 3 heavy tokens leaves the fourth
    # in the light interval (loose); counting the heavy drafts is exact for equal masses, and the
    # bounds lie within 5% of the reference Q once H holds all four and hundreds of light tokens
    import otm.race_heavy as rh

    rng = np.random.default_rng(4)
    V, k = 2000, 6
    draft = np.full(V, 1e-9) * rng.uniform(0.5, 2, V)
    draft[[3, 50, 400, 900]] = 0.25
    draft /= draft.sum()
    Q = prefix_membership(draft, k, np.arange(V)).inside
    js = np.arange(1000, V, 50)
    lo, hi = rh.heavy_count_bounds(rh._heavy_set(draft, k, np.array([3, 50, 400, 900])), k, js)
    assert np.all(lo <= Q[js] * (1 + 1e-12)) and np.all(Q[js] <= hi * (1 + 1e-12))
    assert np.all(hi <= 1.05 * Q[js]) and np.all(lo >= 0.95 * Q[js])
    kinds = [kind for kind, _ in rh.heavy_sets(draft, k)]
    assert kinds == ["subset", "count"]


def test_heavy_bounds_are_tight_for_a_dominant_token():
    # one draft token near 1, the rest ~1e-9: the plain bound (1 - c)^k is ~1 at every prefix, the
    # heavy-token upper bound follows Q(H) (reference race quadrature) within 5% once H holds
    # hundreds of light tokens (it ignores only the depletion of the light mass by the drafts)
    rng = np.random.default_rng(3)
    V, k = 2000, 4
    draft = np.full(V, 1e-9) * rng.uniform(0.5, 2, V)
    draft[2] = 1.0
    draft /= draft.sum()
    from otm.race_heavy import heavy_bounds, heavy_tokens

    order = np.arange(V)
    Q = prefix_membership(draft, k, order).inside
    js = np.arange(500, V, 50)
    lo, hi = heavy_bounds(heavy_tokens(draft, k), k, js)
    c = np.array([draft[j:].sum() for j in js])
    assert np.all((1 - c) ** k > 0.99999)
    assert np.all(lo <= Q[js] * (1 + 1e-12)) and np.all(Q[js] <= hi * (1 + 1e-12))
    assert np.all(hi <= 1.05 * Q[js]) and np.all(lo >= 0.95 * Q[js])


@settings(max_examples=examples(300), deadline=None)
@given(heavy_law(), st.integers(1, 6), st.floats(1e-3, 1e13))
def test_ek_bound_bounds_the_race_count_tail(qH, k, t):
    # F_H(t) = P(N_H(t) >= k) <= e_k(q_H) t^k <= ek_bound t^k: the premise of the raised lower cut
    from otm.race_window import ek_bound

    b = -np.expm1(-qH * t)
    pmf = np.zeros(qH.size + 1)
    pmf[0] = 1.0
    for x in b:  # exact Poisson-binomial law
        pmf[1:] = pmf[1:] * (1 - x) + pmf[:-1] * x
        pmf[0] *= 1 - x
    tail = float(pmf[k:].sum())
    e = np.zeros(k + 1)
    e[0] = 1.0
    for x in qH:
        e[1:] = e[1:] + e[:-1] * x
    bound = ek_bound(qH, k)
    assert e[k] <= bound * (1 + 1e-12)
    assert tail <= bound * t**k * (1 + 1e-9) + 1e-300
    assert bound <= qH.sum() ** k / math.factorial(k) * (1 + 1e-8)


def test_race_grid_lower_cut_rises_only_with_a_small_ek():
    from otm.optimum import race_grid

    plain = race_grid(8, 1e-12)
    assert race_grid(8, 1e-12, ce_max=1.0 / math.factorial(8))[0] == plain[0]
    high = race_grid(8, 1e-12, ce_max=1e-70)
    assert high[0] > plain[0] + 10 and high[-1] >= plain[-1] - 1 and high.size < plain.size
    # the cut part c e_k t_min^{k+1} / (k+1) is at most T = 1e-17
    assert 1e-70 * math.exp(high[0]) ** 9 / 9 <= 1e-17 * (1 + 1e-9)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair(3, 8), st.integers(3, 5))
def test_window_with_heavy_bounds_forced_matches_brute_force(laws, k):
    # small V never reaches HEAVY_FROM candidates: force the heavy-token rounds on every law
    from unittest import mock

    import otm.race_heavy as rh
    import otm.race_window as rw

    target, draft = laws
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    with mock.patch.multiple(rw, HEAVY_FROM=0), \
            mock.patch.multiple(rh, HEAVY_MIN=0.0, HEAVY_MIN_MANY=0.0, HEAVY_TOTAL=0.0):
        opt = optimal_acceptance_of(scheme, target, method="window")
    assert abs(opt.value - brute_force_optimum(scheme, target)) <= 1e-12


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(medium_pair(), st.integers(3, 8))
def test_window_with_heavy_bounds_forced_matches_reference(laws, k):
    from unittest import mock

    import otm.race_heavy as rh
    import otm.race_window as rw

    target, draft = laws
    assume(np.count_nonzero(draft) >= k)
    scheme = WithoutReplacement(draft, k)
    with mock.patch.multiple(rw, HEAVY_FROM=0), mock.patch.multiple(rh, HEAVY_MIN_MANY=0.01, HEAVY_TOTAL=0.0):
        fast = optimal_acceptance_of(scheme, target, method="window")
    ref = optimal_acceptance_of(scheme, target, method="reference")
    assert abs(fast.value - ref.value) <= 1e-12, (fast.value, ref.value, fast.note)
    skipped = np.isnan(fast.prefix_values)
    assert np.all(ref.prefix_values[skipped] >= fast.value - 3e-13)


def dominant_law(rng, V: int, scale: float, n_heavy: int = 1):
    """Draft: n_heavy heavy tokens, every other mass scale * U(0.1, 10); target Dirichlet(0.2)."""
    draft = np.full(V, scale) * rng.uniform(0.1, 10, V)
    draft[rng.choice(V, n_heavy, replace=False)] = [1.0, 0.6, 0.4][:n_heavy] if n_heavy < 3 else [0.5, 0.3, 0.2]
    return rng.dirichlet(np.full(V, 0.2)), draft / draft.sum()


@pytest.mark.parametrize("case", ["dominant1e-14", "dominant1e-14-flat-target", "two-dominant1e-14", "four-heavy1e-14"])
def test_slowest_case_class_matches_reference_at_V49152(case):
    # the case class that was slowest (one dominant draft token, the rest ~1e-14, k = 8: 38 prefixes
    # evaluated directly on G = 287 nodes; a flat target: 395 ms): same value as the reference scan
    rng = np.random.default_rng(11)
    V, k = 49152, 8
    if case == "two-dominant1e-14":
        target, draft = dominant_law(rng, V, 1e-14, 2)
    elif case == "four-heavy1e-14":  # more heavy tokens than the subset bounds follow
        draft = np.full(V, 1e-14) * rng.uniform(0.1, 10, V)
        draft[rng.choice(V, 4, replace=False)] = 0.25
        target, draft = rng.dirichlet(np.full(V, 0.2)), draft / draft.sum()
    else:
        target, draft = dominant_law(rng, V, 1e-14)
        if case == "dominant1e-14-flat-target":
            target = rng.dirichlet(np.ones(V))
    scheme = WithoutReplacement(draft, k)
    fast = optimal_acceptance_of(scheme, target)
    ref = optimal_acceptance_of(scheme, target, method="reference")
    assert fast.method == "prefix+race-window" and ref.method == "prefix+race"
    assert abs(fast.value - ref.value) <= 1e-9
    computed = ~np.isnan(fast.prefix_values)
    assert np.abs(fast.prefix_values[computed] - ref.prefix_values[computed]).max() <= 1e-9
    assert np.all(ref.prefix_values[~computed] >= fast.value - 3e-13)
    # the heavy-token bounds leave few prefixes to evaluate directly, on a grid raised by e_k
    import re

    assert int(re.search(r"\((\d+) evaluated directly", fast.note).group(1)) <= 8, fast.note
    assert int(re.search(r"G = (\d+) nodes", fast.note).group(1)) < 200, fast.note


@pytest.mark.parametrize(
    "target, draft",
    [
        ([1.0, 0.0, 0.0, 0.0, 0.0], [2.5e-13, 0.25, 0.25, 0.25, 0.25]),  # split evaluates cand.min() - 1
        ([1.0, 0.0, 0.0, 0.0], [0.5, 5e-13, 5e-13, 0.5]),  # raised lower cut above the upper cut
    ],
)
def test_raised_lower_cut_covers_every_evaluated_prefix(target, draft):
    # two laws hypothesis found while the lower cut was first raised: the bound on c e_k must hold
    # at every prefix evaluated (split's left end lies one below the candidates; Q was off by 2e-6),
    # and a cut t_min above t_max must still give a grid (it gave none: IndexError)
    scheme = WithoutReplacement(np.array(draft), 3)
    opt = optimal_acceptance_of(scheme, np.array(target), method="window")
    assert abs(opt.value - brute_force_optimum(scheme, np.array(target))) <= 1e-12
    assert opt.error_estimate <= QUADRATURE_TOLERANCE
