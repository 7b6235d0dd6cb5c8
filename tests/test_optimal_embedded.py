"""The ``optimal_embedded`` verifier: the iid optimal rule on an iid sequence embedded in drafts
drawn without replacement. Exact law always; acceptance between alpha*_iid and alpha*_wor."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from otm.exact import evaluate
from otm.laws import OtmError
from otm.optimum import optimal_acceptance
from otm.schemes import IID, WithoutReplacement
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.verifiers import VERIFIERS, applicable, optimal
from otm.verifiers import optimal_embedded as oe

from strategies import pair
from hyp import examples


def _scheme(draft, k):
    try:
        return WithoutReplacement(draft, k)
    except OtmError:
        return None


def _path_weights(trans, q_s, rest):
    """Walk path probabilities by direct recursion over the steps (reference for walk_weights);
    ``trans(q_s, rest, m)`` gives the law of (repeat s_1..s_m, new) in state m."""
    paths = oe.walk_paths(q_s.size)
    out = np.ones(paths.shape[0])
    for r, a in enumerate(paths):
        m = 1
        for i in range(1, q_s.size):
            out[r] *= trans(q_s, rest, m)[a[i]]
            m += a[i] == m
    return out


def _true_step(q_s, rest, m):
    v = np.append(q_s[:m], rest + q_s[m:].sum())
    return v / v.sum()


def _off_by_one_step(q_s, rest, m):
    """Planted bug: the new-token probability uses the PREVIOUS state's unseen mass 1 - q(A_{m-1})."""
    v = np.append(q_s[:m], rest + q_s[m - 1:].sum())
    return v / v.sum()


# (a) the embedding: X is iid q^k exactly ---------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 4])
def test_walk_embeds_iid_draws_exactly(k):
    rng = np.random.default_rng(k)
    for V, conc in [(5, 0.6), (6, 2.0), (4, 0.3)]:
        q = rng.dirichlet(np.ones(V) * conc)
        q[0] = 1e-12 if k == 3 else q[0]  # a tiny mass
        q = q / q.sum()
        scheme = _scheme(q, k)
        if scheme is None:
            continue
        tuples, probs = scheme.enumerate()
        P = np.zeros((V,) * k)
        paths = oe.walk_paths(k)
        for t, pr in zip(tuples, probs):
            w = oe.walk_weights(q[t], oe.mass_outside(q, t))
            assert abs(w.sum() - 1) < 1e-12
            assert np.abs(w - _path_weights(_true_step, q[t], oe.mass_outside(q, t))).max() < 1e-15
            np.add.at(P, tuple(t[paths].T), pr * w)
        iid = q
        for _ in range(k - 1):
            iid = np.multiply.outer(iid, q)
        assert np.abs(P - iid).max() < 1e-12


def test_walk_paths_are_restricted_growth_sequences_and_the_sampler_walks_them():
    for k in range(1, 8):
        a = oe.walk_paths(k)
        seen = np.maximum.accumulate(a, axis=1)
        assert (a[:, 0] == 0).all() and (a[:, 1:] <= seen[:, :-1] + 1).all()
        assert len({tuple(r) for r in a}) == a.shape[0]
    assert [oe.walk_paths(k).shape[0] for k in range(1, 9)] == [1, 2, 5, 15, 52, 203, 877, 4140]
    # the sampler's walk, from its uniforms, realises walk_weights (inverse CDF at each step)
    q_s, rest = np.array([0.3, 0.1, 0.2, 0.05]), 0.35
    w = oe.walk_weights(q_s, rest)
    rng = np.random.default_rng(0)
    n = 20000
    idx = {tuple(r): i for i, r in enumerate(oe.walk_paths(4))}
    counts = np.zeros(w.size)
    for _ in range(n):
        counts[idx[tuple(oe.walk(q_s, rest, rng.random(3)))]] += 1
    assert not chi2_gof(counts, w).reject


# (b) exact law over the enumerated scheme; acceptance between alpha*_iid and alpha*_wor -----------
@settings(max_examples=examples(60), deadline=None)
@given(pq=pair(min_V=2, max_V=6), k=st.integers(1, 4))
def test_law_exact_and_acceptance_between_iid_and_wor_optimum(pq, k):
    target, draft = pq
    scheme = _scheme(draft, k)
    assume(scheme is not None and scheme.n_tuples() <= 400)
    ev = evaluate("optimal_embedded", scheme, target)
    assert ev.law_error < 1e-9
    bound = oe.bind(target, scheme)
    iid_rule = optimal.rule(target, draft, k)
    assert bound.acceptance == iid_rule.acceptance
    alpha_iid = optimal_acceptance(target, draft, k, "iid")
    assert abs(bound.alpha_iid - alpha_iid) < 1e-12
    # the selection acceptance is the iid rule's, E_S[P(selected draft accepted | S)] (X is iid q^k)
    tuples, probs = scheme.enumerate()
    cond = np.array([oe.conditional_acceptance(target, draft, t) for t in tuples])
    assert abs(probs @ cond[:, 0] - bound.acceptance) < 1e-9
    assert abs(probs @ cond[:, 1] - ev.acceptance) < 1e-9  # membership, exactly as enumerated
    assert (cond[:, 1] >= cond[:, 0] - 1e-12).all()
    # alpha*_iid - (the iid rule's own reported gap) <= selection <= membership <= alpha*_wor
    iid_gap = alpha_iid - iid_rule.acceptance
    assert bound.acceptance >= alpha_iid - max(iid_gap, 0.0) - 1e-9
    assert ev.acceptance >= bound.acceptance - 1e-9
    assert ev.acceptance <= bound.alpha_star + 1e-9
    assert bound.gap >= -1e-9


def test_acceptance_reaches_alpha_iid_and_membership_can_exceed_it():
    target, draft = np.array([0.4, 0.1, 0.3, 0.15, 0.05]), np.array([0.1, 0.35, 0.05, 0.3, 0.2])
    k = 3
    alpha_iid = optimal_acceptance(target, draft, k, "iid")
    alpha_wor = optimal_acceptance(target, draft, k, "without_replacement")
    assert abs(oe.acceptance(target, draft, k) - alpha_iid) < 1e-12
    m = oe.membership_acceptance(target, draft, k)
    assert m.method == "exact" and m.se == 0
    assert abs(m.value - evaluate("optimal_embedded", WithoutReplacement(draft, k), target).acceptance) < 1e-12
    assert alpha_iid + 0.04 < m.value < alpha_wor  # 0.686 < 0.736 < 0.9


def test_membership_monte_carlo_is_unbiased():
    rng = np.random.default_rng(5)
    target, draft = rng.dirichlet(np.ones(8) * 0.3), rng.dirichlet(np.ones(8) * 0.3)
    est = oe.membership_acceptance(target, draft, 3, samples=1000, rng=1, max_tuples=0)  # forced Monte Carlo
    exact = oe.membership_acceptance(target, draft, 3)  # 336 tuples: enumerated
    assert est.method == "monte_carlo" and exact.method == "exact"
    assert abs(exact.value - _enumerated_membership(target, draft, 3)) < 1e-12
    assert 0 < est.se < 0.01
    assert abs(est.value - exact.value) < 5 * est.se, (est, exact)


def _enumerated_membership(target, draft, k):
    scheme = WithoutReplacement(draft, k)
    rl = optimal.checked_rule(np.asarray(target), np.asarray(draft), k)
    res = rl.residual()
    tuples, probs = scheme.enumerate()
    return float(sum(pr * oe._conditional(rl, target, draft, t, res)[1] for t, pr in zip(tuples, probs)))


# (c) sampler vs exact law: calibrated chi-square, planted off-by-one as negative control ---------
TARGET = np.array([0.4, 0.1, 0.3, 0.15, 0.05])
DRAFT = np.array([0.1, 0.35, 0.05, 0.3, 0.2])
N = 20000


def test_sampler_over_the_scheme_matches_membership_cells_and_catches_the_off_by_one(monkeypatch):
    scheme = WithoutReplacement(DRAFT, 3)
    bound = oe.bind(TARGET, scheme)
    V = TARGET.size
    p0 = membership_cells(bound.law, scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    with monkeypatch.context() as mp:  # the bug's exact law: the same walk with the off-by-one step
        mp.setattr(oe, "walk_weights", lambda q_s, rest: _path_weights(_off_by_one_step, q_s, rest))
        p1 = membership_cells(bound.law, scheme, V)
    tv = 0.5 * np.abs(p1 - p0).sum()
    assert 0.02 < tv < 0.04, tv  # 0.0295
    power = chi2_power(N, p0, p1)
    assert power > 0.99, (power, tv)

    def counts(seed):
        rng = np.random.default_rng(seed)
        c = np.zeros(2 * V)
        for _ in range(N):
            d = scheme.sample(rng)
            out = bound.sample(d, rng)
            assert out.accepted is None or d[out.accepted] == out.token
            c[out.token + (V if out.accepted is not None else 0)] += 1
        return c

    assert not chi2_gof(counts(31), p0).reject

    def buggy_walk(q_s, rest, u):
        out, m = np.zeros(q_s.size, dtype=np.int64), 1
        for i in range(1, q_s.size):
            cdf = np.cumsum(_off_by_one_step(q_s, rest, m))
            j = min(int(np.searchsorted(cdf, u[i - 1], side="right")), m)
            out[i] = j
            m += j == m
        return out

    monkeypatch.setattr(oe, "walk", buggy_walk)
    assert chi2_gof(counts(32), p0).reject


# (d) registry, refusals ----------------------------------------------------------------------------
def test_registered_and_refuses_other_schemes():
    assert "optimal_embedded" in [v.name for v in applicable(WithoutReplacement([0.5, 0.3, 0.2], 2))]
    assert "optimal_embedded" not in [v.name for v in applicable(IID([0.5, 0.3, 0.2], 2))]
    assert VERIFIERS["optimal_embedded"].module is oe
    for call, fragment in [
        (lambda: oe.bind([0.5, 0.5], IID([0.5, 0.5], 2)), "without_replacement scheme only"),
        (lambda: oe.law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1, 1]), "distinct drafts"),
        (lambda: oe.sample([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1, 1], np.random.default_rng(0)), "distinct drafts"),
        (lambda: oe.law(np.ones(12) / 12, np.ones(12) / 12, np.arange(9)), "up to k = 8"),
        (lambda: oe.law([0.5, 0.5], [1.0, 0.0], [0, 1]), "zero draft probability"),
    ]:
        with pytest.raises(OtmError) as exc:
            call()
        assert fragment in str(exc.value) and "\n" not in str(exc.value)


# (e) a real vocabulary ------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 8])
def test_full_vocabulary_law_is_a_law_and_acceptance_is_alpha_iid(k):
    rng = np.random.default_rng(7 + k)
    V = 49152
    z = rng.standard_normal(V) * 3.0
    target = np.exp(z - z.max())
    draft = np.exp(z + rng.standard_normal(V) - z.max())
    target, draft = target / target.sum(), draft / draft.sum()
    drafts = oe._wor_sample(rng, np.log(draft), k)
    out = oe.sample(target, draft, drafts, rng)
    assert 0 <= out.token < V and (out.accepted is None or drafts[out.accepted] == out.token)
    lw = oe.law(target, draft, drafts)
    assert abs(lw.sum() - 1) < 1e-12 and lw.min() >= 0
    assert abs(oe.acceptance(target, draft, k) - optimal_acceptance(target, draft, k, "iid")) < 1e-9
