"""The ``optimal_without_replacement`` verifier: exact law always, acceptance alpha* (or its reported gap)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from otm.exact import evaluate
from otm.laws import OtmError
from otm.lp import solve_lp
from otm.optimum import brute_force_optimum, optimal_acceptance_of
from otm.schemes import IID, WithoutReplacement
from otm.testing import chi2_gof, chi2_power
from otm.verifiers import VERIFIERS, Verifier, applicable
from otm.verifiers import optimal_without_replacement as ow

from strategies import pair
from hyp import examples

OW = Verifier("optimal_without_replacement", ow, ("without_replacement",))


def _scheme(draft, k):
    try:
        return WithoutReplacement(draft, k)
    except OtmError:
        return None


def _coverage(scheme):
    """f[A] = P(draft set meets A) for every bitmask A, from the enumerated sets."""
    V = scheme.V
    tuples, probs = scheme.enumerate()
    masks = np.bitwise_or.reduce(np.left_shift(np.int64(1), tuples), axis=1)
    Q = np.bincount(masks, weights=probs, minlength=1 << V).astype(np.float64)
    for bit in range(V):
        view = Q.reshape(-1, 2, 1 << bit)
        view[:, 1, :] += view[:, 0, :]
    full = (1 << V) - 1
    return 1.0 - Q[full ^ np.arange(1 << V)]


def _subset_sums(x):
    V = x.size
    s = np.zeros(1 << V)
    s[1 << np.arange(V)] = x
    for bit in range(V):
        view = s.reshape(-1, 2, 1 << bit)
        view[:, 1, :] += view[:, 0, :]
    return s


# (a) exact law by enumeration; the rule's acceptance and x* against alpha* ----------------------
@settings(max_examples=examples(80), deadline=None)
@given(pq=pair(min_V=2, max_V=6), k=st.integers(1, 4))
def test_law_exact_and_acceptance_is_alpha_star(pq, k):
    target, draft = pq
    scheme = _scheme(draft, k)
    assume(scheme is not None)
    ev = evaluate(OW, scheme, target)
    assert ev.law_error < 1e-9
    bound = ow.bind(target, scheme)
    alpha = brute_force_optimum(scheme, target)
    assert abs(bound.alpha_star - alpha) < 1e-9
    # x* is a base of the coverage polymatroid (x*(A) <= f(A), equality on the whole set) ...
    f = _coverage(scheme)
    xs = bound.plan.x_star
    assert (_subset_sums(xs) <= f + 1e-9).all() and abs(xs.sum() - 1) < 1e-9
    # ... whose acceptance is alpha*; the rule's law x(theta) reaches it (gap < 1e-9 on every case)
    assert abs(bound.plan.alpha_sets - alpha) < 1e-9
    assert ev.acceptance >= bound.acceptance - 1e-9
    assert ev.acceptance <= alpha + 1e-9
    assert -1e-9 <= bound.gap < 1e-9, f"fit missed x* by {bound.gap:.3g}"


@pytest.mark.parametrize("seed", range(6))
def test_acceptance_equals_lp_and_beats_rrsw(seed):
    from otm.verifiers import rrs_without_replacement as rrsw

    rng = np.random.default_rng(seed)
    V, k = 5, 2 + seed % 3
    target, draft = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
    scheme = WithoutReplacement(draft, k)
    lp = solve_lp(scheme, target).value
    ev = evaluate(OW, scheme, target)
    assert ev.law_error < 1e-9
    assert abs(ow.acceptance(target, draft, k) - lp) < 1e-9
    assert abs(ev.acceptance - lp) < 1e-9
    assert rrsw.acceptance_exact(target, draft, k) <= lp + 1e-9


def test_selection_target_at_any_V_matches_the_enumerated_sets():
    rng = np.random.default_rng(3)
    for _ in range(20):
        V, k = int(rng.integers(3, 8)), int(rng.integers(2, 5))
        target, draft = rng.dirichlet(np.ones(V) * 0.4), rng.dirichlet(np.ones(V) * 0.4)
        if np.count_nonzero(draft > 0) < k:
            continue
        big = ow.selection_target(target, draft, k)  # Q on ratio prefixes (race quadrature for k >= 3)
        small = ow.build(target, draft, k)  # vertex law from the sets
        assert np.abs(big.x_star - small.x_star).max() < 1e-10
        assert np.array_equal(big.layer, small.layer)


def test_registered_and_refuses_other_schemes_and_large_V():
    assert "optimal_without_replacement" in [v.name for v in applicable(WithoutReplacement([0.5, 0.3, 0.2], 2))]
    assert VERIFIERS["optimal_without_replacement"].module is ow
    with pytest.raises(OtmError, match="without_replacement scheme only"):
        ow.bind([0.5, 0.5], IID([0.5, 0.5], 2))
    with pytest.raises(OtmError, match="MAX_SETS"):
        ow.build(np.ones(200) / 200, np.ones(200) / 200, 4)
    with pytest.raises(OtmError, match="distinct drafts"):
        ow.law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1, 1])


# (b) sampler vs exact law: calibrated chi-square, with a planted-bug negative control ----------
TARGET = np.array([0.35, 0.25, 0.2, 0.15, 0.05])
DRAFT = np.array([0.05, 0.1, 0.15, 0.3, 0.4])  # k = 3: layers {0}, {1..4}, Luce weights spread, acceptance 0.88
N = 20000


def _cells_of(plan, drafts, bug_x=None):
    """Exact law of (token, drafted?) cells for one draft tuple, for the plan or a plan whose SD step
    uses the selection law ``bug_x`` instead of the true one."""
    x = plan.x if bug_x is None else bug_x
    sel = ow.selection_law(plan, drafts)
    acc = np.where(sel > 0, np.minimum(1.0, TARGET / np.where(sel > 0, x, 1.0)), 0.0)
    res = np.maximum(TARGET - x, 0)
    res = res / res.sum()
    rej = float((sel * (1 - acc)).sum())
    tok = sel * acc + rej * res
    member = np.isin(np.arange(TARGET.size), drafts)
    return np.concatenate([np.where(member, 0, tok), np.where(member, tok, 0)])


def _counts(plan, drafts, seed):
    rng = np.random.default_rng(seed)
    counts = np.zeros(2 * TARGET.size)
    d = np.asarray(drafts)
    for _ in range(N):
        out = ow._sample(plan, TARGET, d, rng)
        counts[out.token + (TARGET.size if out.accepted is not None else 0)] += 1
    return counts


def test_sampler_matches_law_and_catches_bug():
    import dataclasses

    plan = ow.build(TARGET, DRAFT, 3)
    assert len(np.unique(plan.layer)) >= 2 and np.ptp(plan.theta) > 0  # a layered Luce plan, not a trivial one
    drafts = [2, 3, 4]  # all in the Luce layer: selection, rejections and residual all matter
    law = _cells_of(plan, drafts)
    assert np.allclose(law[:5] + law[5:], ow.law(TARGET, DRAFT, drafts), atol=1e-12)
    res = chi2_gof(_counts(plan, drafts, 11), law)
    assert not res.reject, str(res)
    # planted bug: the SD step uses a selection law 10% too high at one drafted token where it bites
    sel = ow.selection_law(plan, drafts)
    y = int(np.argmax(np.where((1.1 * plan.x > TARGET) & (sel > 0), sel, -1)))
    x_bug = plan.x.copy()
    x_bug[y] *= 1.1
    bugged = dataclasses.replace(plan, x=x_bug, residual=np.maximum(TARGET - x_bug, 0))
    bug_law = _cells_of(plan, drafts, x_bug)
    tv = 0.5 * np.abs(law - bug_law).sum()
    assert 0.01 < tv < 0.07, tv
    power = chi2_power(N, law, bug_law)
    assert power > 0.99, (power, tv)
    assert chi2_gof(_counts(bugged, drafts, 12), law).reject


def test_sampler_over_the_scheme_matches_membership_cells():
    """Drafts drawn by the scheme, the whole (token, drafted?) law; the same planted bug at the plan level."""
    import dataclasses

    from otm.testing import membership_cells

    scheme = WithoutReplacement(DRAFT, 3)
    bound = ow.bind(TARGET, scheme)
    plan = bound.plan
    V = TARGET.size
    p0 = membership_cells(bound.law, scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    y = int(np.argmax(np.where(1.1 * plan.x > TARGET, plan.x, -1)))
    x_bug = plan.x.copy()
    x_bug[y] *= 1.1
    bugged = dataclasses.replace(plan, x=x_bug, residual=np.maximum(TARGET - x_bug, 0))
    p1 = membership_cells(lambda d: ow._law(bugged, TARGET, np.asarray(d)), scheme, V)
    tv = 0.5 * np.abs(p1 - p0).sum()
    assert 0.005 < tv < 0.05, tv
    power = chi2_power(N, p0, p1)
    assert power > 0.99, (power, tv)

    def counts(pl, seed):
        rng = np.random.default_rng(seed)
        c = np.zeros(2 * V)
        for _ in range(N):
            d = scheme.sample(rng)
            out = ow._sample(pl, TARGET, d, rng)
            c[out.token + (V if out.accepted is not None else 0)] += 1
        return c

    assert not chi2_gof(counts(plan, 21), p0).reject
    assert chi2_gof(counts(bugged, 22), p0).reject


# (c) the target law x* at V = 49152 -------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4, 8])
def test_selection_target_at_full_vocabulary_reaches_alpha_star(k):
    rng = np.random.default_rng(2026 + k)
    V = 49152
    z = rng.standard_normal(V) * 3.0
    target = np.exp(z - z.max())
    zd = z + rng.standard_normal(V)
    draft = np.exp(zd - zd.max())
    target, draft = target / target.sum(), draft / draft.sum()
    st_ = ow.selection_target(target, draft, k)
    alpha = optimal_acceptance_of(WithoutReplacement(draft, k), target).value
    assert abs(np.minimum(st_.x_star, target).sum() - alpha) < 1e-9
    assert abs(st_.x_star.sum() - 1) < 1e-9
