"""Each sampler's empirical law matches its exact law: calibrated tests with negative controls.

For every verifier, N draws of (drafts from the scheme's sampler, output from the
verifier's step-by-step sampler) are binned by (output token, output is a draft)
and compared with the exact cell probabilities from enumeration by a chi-square
test at level ALPHA = 1e-3 (false alarm rate 0.1%). Each verifier has a planted
bug; the test's power against that bug's exact law is computed and asserted to be
at least 0.99 before the same test, fed the bug's samples, must reject.
Seeds are fixed, so outcomes are reproducible.
"""

import numpy as np
import pytest

from otm.laws import categorical, positive_part
from otm.schemes import IID, Greedy, SpecHub, WithoutReplacement
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.verifiers import VERIFIERS, kseq, rrs, spechub
from otm.verifiers.base import BoundVerifier, Outcome

N = 20_000
ALPHA = 1e-3
MIN_POWER = 0.99
TARGET = np.array([0.35, 0.05, 0.3, 0.1, 0.2, 0.0])
DRAFT = np.array([0.1, 0.3, 0.1, 0.25, 0.1, 0.15])
V = TARGET.size


def cells(bound: BoundVerifier, scheme) -> np.ndarray:
    """Exact P(output = y, output in drafts) for the 2V cells (y, member)."""
    return membership_cells(bound.law, scheme, V)


def counts(bound: BoundVerifier, scheme, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = np.zeros(2 * V)
    for _ in range(N):
        d = scheme.sample(rng)
        o = bound.sample(d, rng)
        member = o.token in d
        assert (o.accepted is not None) == member
        c[o.token + V * member] += 1
    return c


# -- planted bugs ----------------------------------------------------------------------


def bug_speculative(target, scheme):
    """Resamples the target instead of the residual (p - q)_+ after a rejection."""

    def law(d):
        x = d[0]
        a = min(1.0, target[x] / scheme.draft[x])
        out = (1 - a) * target
        out[x] += a
        return out

    def sample(d, rng):
        x = int(d[0])
        if rng.random() * scheme.draft[x] < target[x]:
            return Outcome(x, 0)
        y = categorical(rng, target)
        return Outcome(y, 0 if y == x else None)

    return BoundVerifier(law, sample)


def bug_kseq(target, scheme):
    """K-SEQ with rho = 1: accept every draft with min(1, p/q) (invalid for k >= 2)."""
    return BoundVerifier(
        lambda d: kseq.law(target, scheme.draft, d, rho=1.0),
        lambda d, rng: kseq.sample(target, scheme.draft, d, rng, rho=1.0),
    )


def bug_rrs(target, scheme):
    """RRS that never updates the residual: every draft is tested against the target."""

    def law(d):
        out, stay = np.zeros(V), 1.0
        for x in d:
            a = min(1.0, target[x] / scheme.draft[x])
            out[x] += stay * a
            stay *= 1 - a
        return out + stay * rrs.residual_law(positive_part(target - scheme.draft), target)

    def sample(d, rng):
        for i, x in enumerate(d):
            if rng.random() * scheme.draft[x] < target[x]:
                return Outcome(int(x), i)
        y = categorical(rng, positive_part(target - scheme.draft))
        hit = np.flatnonzero(d == y)
        return Outcome(y, int(hit[0]) if hit.size else None)

    return BoundVerifier(law, sample)


def bug_rrs_without_replacement(target, scheme):
    """Forgets to remove the rejected draft from q: RRS with replacement on distinct drafts."""
    return BoundVerifier(
        lambda d: rrs.law(target, scheme.draft, d),
        lambda d, rng: rrs.sample(target, scheme.draft, d, rng),
    )


def bug_greedy(target, scheme):
    """Tests the last draft against the full draft law q instead of q' = q restricted to
    the tokens outside D, the law it was drawn from (the peers' most common bug class)."""

    def law(d):
        x = d[-1]
        a = min(1.0, target[x] / scheme.draft[x])
        res = positive_part(target - scheme.draft)
        out = (1 - a) * res / res.sum()
        out[x] += a
        return out

    def sample(d, rng):
        x = int(d[-1])
        if rng.random() * scheme.draft[x] < target[x]:
            return Outcome(x, d.size - 1)
        y = categorical(rng, positive_part(target - scheme.draft))
        hit = np.flatnonzero(d == y)
        return Outcome(y, int(hit[0]) if hit.size else None)

    return BoundVerifier(law, sample)


def bug_spechub(target, scheme):
    """Ignores the order of the pair: always verifies as if the hub came second."""

    def swap(d):
        return d[::-1].copy() if d[0] == scheme.hub else d

    def law(d):
        return spechub.law(target, scheme.draft, swap(d))

    def sample(d, rng):
        o = spechub.sample(target, scheme.draft, swap(d), rng)
        hit = np.flatnonzero(d == o.token)
        return Outcome(o.token, int(hit[0]) if hit.size else None)

    return BoundVerifier(law, sample)


def bug_lp_optimal(target, scheme):
    """Uses the plan of a slightly different target."""
    wrong = target + np.array([0.03, 0.0, -0.03, 0.0, 0.0, 0.0])
    return VERIFIERS["lp_optimal"].bind(wrong, scheme)


CASES = {
    "speculative": (lambda: IID(DRAFT, 1), bug_speculative),
    "kseq": (lambda: IID(DRAFT, 3), bug_kseq),
    "rrs": (lambda: IID(DRAFT, 2), bug_rrs),
    "rrs_without_replacement": (lambda: WithoutReplacement(DRAFT, 3), bug_rrs_without_replacement),
    "greedy": (lambda: Greedy(DRAFT, 3), bug_greedy),
    "spechub": (lambda: SpecHub(DRAFT), bug_spechub),
    "lp_optimal": (lambda: IID(DRAFT, 2), bug_lp_optimal),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampler_matches_exact_law_and_catches_planted_bug(name):
    make_scheme, make_bug = CASES[name]
    scheme = make_scheme()
    good = VERIFIERS[name].bind(TARGET, scheme)
    bad = make_bug(TARGET, scheme)
    p0, p1 = cells(good, scheme), cells(bad, scheme)
    # the exact law marginalises to the target; the bug's does not
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    assert np.abs(p1[:V] + p1[V:] - TARGET).max() > 1e-3
    power = chi2_power(N, p0, p1, alpha=ALPHA)
    assert power >= MIN_POWER, f"{name}: power {power:.4f} against the planted bug"
    result = chi2_gof(counts(good, scheme, seed=11), p0, alpha=ALPHA)
    assert not result.reject, f"{name}: {result}"
    control = chi2_gof(counts(bad, scheme, seed=12), p0, alpha=ALPHA)
    assert control.reject, f"{name} planted bug not caught: {control}"
