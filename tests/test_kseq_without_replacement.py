"""The ``kseq_without_replacement`` verifier: K-SEQ's test over the i.i.d. arrivals embedded in drafts
drawn without replacement. Exact law; acceptance >= alpha*_wor / 2 and >= K-SEQ (iid)."""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from otm.exact import evaluate
from otm.laws import OtmError
from otm.optimum import optimal_acceptance
from otm.schemes import IID, WithoutReplacement
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.verifiers import VERIFIERS, applicable, kseq
from otm.verifiers import kseq_without_replacement as kw
from otm.verifiers.embedding import mass_outside, unseen_mass

from strategies import pair
from hyp import examples


def _scheme(draft, k):
    try:
        return WithoutReplacement(draft, k)
    except OtmError:
        return None


def _trials_markov(target, draft, k, rho):
    """E[N_rho] in exact rational arithmetic by the Markov chain over the set of tokens seen (all
    rejected so far): an independent route to the quantity the race quadrature computes. The laws
    are the float inputs made exact and renormalised (the float draft sums to 1 only within 1e-16,
    which moves 1/(1 - q(A)) a lot when A holds almost all the mass)."""
    p = [Fraction(float(x)) for x in target]
    q = [Fraction(float(x)) for x in draft]
    sp, sq = sum(p), sum(q)
    p, q = [x / sp for x in p], [x / sq for x in q]
    r = Fraction(float(rho))
    a = [min(Fraction(1), p[i] / (r * q[i])) if q[i] > 0 else Fraction(0) for i in range(len(q))]

    @lru_cache(maxsize=None)
    def expect(seen: tuple) -> Fraction:
        stay = sum(q[j] * (1 - a[j]) for j in seen)  # a rejected repeat
        total = Fraction(1)  # the next arrival's test
        if len(seen) < k - 1:  # a rejected new token moves on; at k - 1 seen, the next new one ends it
            total += sum(q[y] * (1 - a[y]) * expect(tuple(sorted(seen + (y,))))
                         for y in range(len(q)) if y not in seen and q[y] > 0)
        return total / (1 - stay)

    return float(expect(()))


# (a) E[N_rho] by the race quadrature against the exact chain ------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_expected_trials_matches_the_exact_chain(seed):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(12):
        V = int(rng.integers(3, 7))
        k = int(rng.integers(1, min(4, V - 1) + 1))
        conc = float(rng.choice([0.1, 0.3, 1.0, 3.0]))
        p, q = rng.dirichlet(np.full(V, conc)), rng.dirichlet(np.full(V, conc))
        if seed == 3:  # tiny draft masses: rates down to 1e-14, E[N] up to ~1e6
            q[0], q[1] = 1e-14, 3e-9
            q = q / q.sum()
        if (q > 0).sum() < k:
            continue
        rho = 1.0 + 4.0 * float(rng.random())
        t = kw.expected_trials(p, q, k, rho)
        exact = _trials_markov(p, q, k, rho)
        worst = max(worst, abs(t.value - exact) / exact)
        assert t.error < 1e-10 * exact
    assert worst < 1e-12, worst


def test_expected_trials_closed_cases():
    p, q = np.array([0.25] * 4), np.array([0.7, 0.1, 0.1, 0.1])
    # only token 0 can be rejected: the test ends at its first acceptance, E[N] = 1/beta
    t = kw.expected_trials(p, q, 3, 2.0)
    beta = float(np.minimum(q, p / 2.0).sum())
    assert t.nodes == 0 and abs(t.value - 1 / beta) < 1e-15
    # k = 1: one arrival, one test
    assert abs(kw.expected_trials(p, q, 1, 1.5).value - 1.0) < 1e-13
    # disjoint laws: nothing is accepted, E[N] = E[T]; k = 2 on q = (1/2, 1/2): E[T] = 1 + 2 = 3
    t = kw.expected_trials(np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.5, 0.0]), 2, 1.0)
    assert abs(t.value - 3.0) < 1e-12


# (b) exact law over the enumerated scheme; the acceptance guarantees ------------------------------
@settings(max_examples=examples(60), deadline=None)
@given(pq=pair(min_V=2, max_V=6), k=st.integers(1, 4))
def test_law_exact_and_the_proved_bounds(pq, k):
    target, draft = pq
    scheme = _scheme(draft, k)
    assume(scheme is not None and scheme.n_tuples() <= 400)
    ev = evaluate("kseq_without_replacement", scheme, target)
    assert ev.law_error < 1e-9
    bound = kw.bind(target, scheme)
    rl = bound.rule
    assert rl.trials.upper <= rl.rho  # the validity condition
    assert (rl.residual() >= 0).all()
    # loop acceptance (the rule's closed form) vs membership (enumerated): equal up to the root's rounding
    assert -1e-9 <= ev.acceptance - bound.acceptance <= 1e-9
    # proved: >= alpha*_wor / 2 through alpha*_wor <= p(H0) + acceptance, and >= K-SEQ (iid)
    h0 = target < rl.rho * draft
    assert bound.alpha_star <= target[h0].sum() + bound.acceptance + 1e-9
    assert bound.acceptance >= bound.alpha_star / 2 - 1e-9
    assert bound.acceptance >= kseq.acceptance(target, draft, k) - 1e-9
    assert bound.gap >= -1e-9
    # at the root, acceptance = sum min(p, rho q) (up to the rounding of rho)
    assert abs(bound.acceptance - np.minimum(target, rl.rho * draft).sum()) < 1e-9


@pytest.mark.parametrize("k", [2, 3, 4])
def test_acceptance_per_token_is_trials_times_the_accepted_rate(k):
    """The core identity, on the real code: sum over the enumerated draft sets of the exact
    P(accept y | S) (the walk's phases) equals E[N_rho] min(q_y, p_y/rho) (the quadrature)."""
    rng = np.random.default_rng(40 + k)
    for V, conc in [(5, 0.5), (6, 2.0), (4, 0.2)]:
        target, draft = rng.dirichlet(np.ones(V) * conc), rng.dirichlet(np.ones(V) * conc)
        scheme = _scheme(draft, k)
        if scheme is None:
            continue
        rl = kw.rule(target, draft, k)
        tuples, probs = scheme.enumerate()
        per = np.zeros(V)
        for t, pr in zip(tuples, probs):
            acc, _ = kw._given(rl, np.asarray(t), mass_outside(draft, np.asarray(t)))
            np.add.at(per, np.asarray(t), pr * acc)
        assert np.abs(per - rl.trials.value * rl.acc_rate).max() < 1e-12


@pytest.mark.parametrize("k", [2, 3])
def test_exact_law_check_catches_realistic_bugs(k, monkeypatch):
    """The exact-law check (law error < 1e-9 on every enumerated draft set) against two planted bugs of
    realistic size: E[N_rho] 1% low (a stale or under-resolved quadrature: law error 0.0020 at k = 2
    and 3) and the residual 10% high at its largest token (law error 0.0082 at k = 2, 0.0043 at k = 3),
    on laws whose residual holds two tokens (a single-token residual is immune to rescaling)."""
    target, draft = np.array([0.05, 0.3, 0.3, 0.15, 0.2]), np.array([0.6, 0.05, 0.05, 0.15, 0.15])
    scheme = WithoutReplacement(draft, k)
    assert evaluate("kseq_without_replacement", scheme, target).law_error < 1e-12
    r = kw.rule(target, draft, k).residual()
    assert (r > 1e-6 * r.sum()).sum() == 2  # (the rest is the root's rounding, ~1e-10 of p on H0)
    honest = kw.expected_trials
    with monkeypatch.context() as mp:
        mp.setattr(kw, "expected_trials", lambda *a, **o: kw.Trials(honest(*a, **o).value * 0.99, 0.0, 0))
        assert evaluate("kseq_without_replacement", scheme, target).law_error > 1.5e-3
    honest_res = kw.TrialsRule._residual

    def high(rule):
        r = honest_res.func(rule).copy()
        r[int(np.argmax(r))] *= 1.1
        return r

    with monkeypatch.context() as mp:
        mp.setattr(kw.TrialsRule, "_residual", property(high))
        assert evaluate("kseq_without_replacement", scheme, target).law_error > 3e-3


def test_beats_k_seq_and_the_embedded_rule_where_one_draft_token_dominates():
    """A dominant draft token: i.i.d. drafts keep repeating it, drafts without replacement cannot.
    The rule's root rho moves far past K-SEQ's and the acceptance approaches alpha*_wor."""
    target = np.array([0.05, 0.3, 0.3, 0.35])
    draft = np.array([0.97, 0.01, 0.01, 0.01])
    k = 3
    rl = kw.rule(target, draft, k)
    alpha_wor = optimal_acceptance(target, draft, k, "without_replacement")
    alpha_iid = optimal_acceptance(target, draft, k, "iid")
    assert rl.rho > 10 * rl.rho_iid
    assert rl.acceptance > alpha_iid + 0.5
    assert rl.acceptance > 0.95 * alpha_wor
    emb = evaluate("optimal_embedded", WithoutReplacement(draft, k), target).acceptance
    rrsw = evaluate("rrs_without_replacement", WithoutReplacement(draft, k), target).acceptance
    assert rl.acceptance > emb and rl.acceptance >= rrsw - 1e-12


@pytest.mark.parametrize("tiny", [1e-30, 1e-300])
def test_draft_masses_near_underflow(tiny):
    """Three draft tokens of mass ``tiny`` beside two of 1/2: T, the arrival of the third distinct token,
    has mean ~1/(3 tiny), and so has the root rho (up to 1e299). The search runs in log rho and ends
    valid, near the root, in few quadratures."""
    target = np.array([0.1, 0.1, 0.3, 0.3, 0.2])
    draft = np.array([0.5, 0.5, tiny, tiny, tiny])
    draft = draft / draft.sum()
    rl = kw.rule(target, draft, 3)
    assert rl.trials.upper <= rl.rho and rl.rho > 0.1 / tiny
    assert rl.evaluations <= 40
    assert abs(rl.acceptance - np.minimum(target, rl.rho * draft).sum()) < 1e-9
    alpha = optimal_acceptance(target, draft, 3, "without_replacement")
    assert max(alpha / 2, kseq.acceptance(target, draft, 3)) - 1e-9 <= rl.acceptance <= alpha + 1e-9


def test_k1_is_speculative_sampling():
    target, draft = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    rl = kw.rule(target, draft, 1)
    assert rl.rho == pytest.approx(1.0, abs=1e-9)
    assert abs(rl.acceptance - np.minimum(target, draft).sum()) < 1e-9


# (c) sampler vs exact law: calibrated chi-square, planted bugs as negative controls ------------------
TARGET = np.array([0.3, 0.05, 0.25, 0.15, 0.25])
DRAFT = np.array([0.45, 0.05, 0.15, 0.15, 0.2])
N = 20000


def _given_stale(rl, d, rest):
    """Planted bug: the repeat phase ends with the new draft w.p. from the PREVIOUS state's unseen
    mass, 1 - q(A_{m-1}) instead of 1 - q(A_m) (an off-by-one in the walk)."""
    q_s = rl.draft[d]
    b = kw._rates(rl.target[d], q_s, rl.rho)[0]
    avail = unseen_mass(q_s, rest)
    acc, surv = np.zeros(d.size), 1.0
    for m in range(d.size):
        a = b[m] / q_s[m]
        acc[m] += surv * a
        surv *= 1.0 - a
        if m == d.size - 1:
            break
        tot = float(b[: m + 1].sum()) + avail[m]
        acc[: m + 1] += surv * b[: m + 1] / tot
        surv *= avail[m] / tot
    return acc, surv


def _sample_stale(rl, d, rest, rng):
    q_s = rl.draft[d]
    b = kw._rates(rl.target[d], q_s, rl.rho)[0]
    avail = unseen_mass(q_s, rest)
    for m in range(d.size):
        if rng.random() * q_s[m] < b[m]:
            return kw.Outcome(int(d[m]), m)
        if m == d.size - 1:
            break
        w = np.append(b[: m + 1], avail[m])
        j = int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right"))
        if j <= m:
            return kw.Outcome(int(d[j]), j)
    z = int(np.searchsorted(np.cumsum(rl.residual()), rng.random() * rl.residual().sum(), side="right"))
    hit = np.flatnonzero(d == z)
    return kw.Outcome(z, int(hit[0]) if hit.size else None)


def _given_no_repeats(rl, d, rest):
    """Planted bug: K-SEQ's loop over the k drafts only, with this rule's rho and residual (the
    repeats of the walk forgotten)."""
    q_s = rl.draft[d]
    b = kw._rates(rl.target[d], q_s, rl.rho)[0]
    acc, surv = np.zeros(d.size), 1.0
    for m in range(d.size):
        acc[m] = surv * b[m] / q_s[m]
        surv *= 1.0 - b[m] / q_s[m]
    return acc, surv


def test_sampler_matches_membership_cells_and_catches_two_planted_bugs(monkeypatch):
    scheme = WithoutReplacement(DRAFT, 3)
    bound = kw.bind(TARGET, scheme)
    V = TARGET.size
    p0 = membership_cells(bound.law, scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12

    def counts(sample, seed):
        rng = np.random.default_rng(seed)
        c = np.zeros(2 * V)
        for _ in range(N):
            d = scheme.sample(rng)
            out = sample(d, rng)
            assert out.accepted is None or d[out.accepted] == out.token
            c[out.token + (V if out.accepted is not None else 0)] += 1
        return c

    assert not chi2_gof(counts(bound.sample, 31), p0).reject

    # bug 1, the stale unseen mass: its exact law, TV and power, then the same test on its sampler
    with monkeypatch.context() as mp:
        mp.setattr(kw, "_given", _given_stale)
        p1 = membership_cells(kw.bind(TARGET, scheme).law, scheme, V)
    tv = 0.5 * np.abs(p1 - p0).sum()
    assert 0.02 < tv < 0.04, tv  # 0.0289
    assert chi2_power(N, p0, p1) > 0.99
    rl = bound.rule
    assert chi2_gof(counts(lambda d, rng: _sample_stale(rl, d, mass_outside(DRAFT, d), rng), 32), p0).reject

    # bug 2, the repeats forgotten: the exact law alone shows it (K-SEQ's loop with E[N] > its own)
    with monkeypatch.context() as mp:
        mp.setattr(kw, "_given", _given_no_repeats)
        ev = evaluate("kseq_without_replacement", scheme, TARGET)
    assert ev.law_error > 1e-3, ev.law_error


# (d) registry, refusals (zero-target tokens: tests/test_verifiers.py) ----------------------------
def test_registered_and_refuses_other_schemes_and_bad_input():
    assert "kseq_without_replacement" in [v.name for v in applicable(WithoutReplacement([0.5, 0.3, 0.2], 2))]
    assert "kseq_without_replacement" not in [v.name for v in applicable(IID([0.5, 0.3, 0.2], 2))]
    assert VERIFIERS["kseq_without_replacement"].module is kw
    for call, fragment in [
        (lambda: kw.bind([0.5, 0.5], IID([0.5, 0.5], 2)), "without_replacement scheme only"),
        (lambda: kw.law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1, 1]), "distinct drafts"),
        (lambda: kw.sample([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1, 1], np.random.default_rng(0)), "distinct drafts"),
        (lambda: kw.law([0.5, 0.5], [1.0, 0.0], [0, 1]), "zero draft probability"),
        (lambda: kw.rule([0.5, 0.5, 0.0], [0.5, 0.5, 0.0], 3), "at least k=3 tokens"),
        (lambda: kw.rule([0.5, float("nan")], [0.5, 0.5], 1), "target"),
        (lambda: kw.rule([0.5, 0.5], [0.5, 0.5], 0), "k"),
    ]:
        with pytest.raises(OtmError) as exc:
            call()
        assert fragment in str(exc.value) and "\n" not in str(exc.value)


# (e) a real vocabulary ------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 8])
def test_full_vocabulary(k):
    rng = np.random.default_rng(70 + k)
    V = 49152
    z = rng.standard_normal(V)
    target = np.exp(8 * z - 8 * z.max())  # sharp laws: where drafts without replacement gain most
    draft = np.exp(8 * (0.9 * z + 0.44 * rng.standard_normal(V)) - 8 * z.max())
    target, draft = target / target.sum(), draft / draft.sum()
    rl = kw.rule(target, draft, k)
    alpha_wor = optimal_acceptance(target, draft, k, "without_replacement")
    assert rl.trials.upper <= rl.rho
    assert kseq.acceptance(target, draft, k) - 1e-9 <= rl.acceptance <= alpha_wor + 1e-9
    assert rl.acceptance >= alpha_wor / 2
    g = np.argsort(-draft)[: 3 * k]  # drafts from the heavy tokens
    drafts = rng.permutation(g)[:k]
    lw = kw.law(target, draft, drafts)
    assert abs(lw.sum() - 1) < 1e-12 and lw.min() >= 0
    out = kw.sample(target, draft, drafts, rng)
    assert 0 <= out.token < V and (out.accepted is None or drafts[out.accepted] == out.token)
