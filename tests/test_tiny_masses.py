"""Equal and nearly equal laws with tiny masses (1e-6 .. 1e-14): every rule for drafts without
replacement, and K-SEQ's division factor, which they start from.

Two bugs are guarded here. ``kseq.rho_star`` returned k instead of ~1 on near-identical laws
where the direct ``g(1)`` is a rounding-level 1e-16 above zero and the segment form exactly zero (an
index of -1 picked the last breakpoint): every rule built on it ran at rho = k. And
``kseq_without_replacement``'s root search could not see the valid region just above a root where
:math:`E[N_\\rho] - \\rho` is far below the quadrature's error, and its Illinois loop stopped on a
halved secant weight instead of the function's value: the rule ended valid (its law exact) but off
its root, its loop acceptance up to 2.6e-8 below its membership acceptance (hypothesis's example
below, with target = draft: the acceptance is exactly 1).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from otm.exact import evaluate
from otm.laws import OtmError, check_law
from otm.optimum import optimal_acceptance_of
from otm.schemes import IID, WithoutReplacement
from otm.verifiers import VERIFIERS, kseq
from otm.verifiers import rrs_without_replacement as rrsw

from hyp import examples

TOL = 1e-9
WOR_RULES = ("rrs_without_replacement", "optimal_without_replacement", "optimal_embedded",
             "kseq_without_replacement")
HYPOTHESIS_CASE = np.array([7.49999944e-01, 2.49999981e-01, 7.49999944e-08])  # shown rounded by the report
FOUND = [  # (raw masses, how the target is made, k): the cases the search found, pinned
    ([1.0, 1.0 / 3.0, 1e-7], ("same", 0.0, 0), 2),  # hypothesis's failing case (normalised: HYPOTHESIS_CASE)
    ([0.28179565596480793, 0.16021836885703422, 1.7730268513991498e-09, 2.6515102396813774e-11,
      0.15298618487119575], ("same", 0.0, 0), 2),  # rho*_iid = k: membership 0.9408 against loop 1
    ([3.19822183575687e-12, 0.6047174698534201, 8.87005762321681e-13, 0.8735046308244404,
      1.4019669875380971e-14], ("same", 0.0, 0), 4),  # root search went to rho = 8.5e12
    ([2.900777127712232e-12, 0.5592200585665228, 0.8241941581645352], ("bump", 1e-5, 0), 2),  # halved-weight stop
]


@st.composite
def near_equal(draw):
    """``(target, draft, k)``: a draft with 1..V-1 masses of 1e-6 .. 1e-14, and a target equal to it, or
    off by relative 1e-15 .. 1e-8 on every token, or one token's mass raised by 1e-9 .. 1e-3."""
    V = draw(st.integers(2, 8))
    k = draw(st.integers(2, min(4, V)))
    raw = np.array(draw(st.lists(st.floats(1e-3, 1.0), min_size=V, max_size=V)))
    tiny = draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=V - 1, unique=True))
    raw[tiny] = [10.0 ** -draw(st.floats(6.0, 14.0)) for _ in tiny]
    how = draw(st.sampled_from(["same", "jitter", "bump"]))
    size = draw(st.floats(1e-15, 1e-8) if how == "jitter" else st.floats(1e-9, 1e-3))
    return raw, (how, size, draw(st.integers(0, V - 1))), k


def _laws(raw, how):
    kind, size, at = how
    draft = np.asarray(raw, dtype=np.float64) / np.sum(raw)
    if kind == "same":
        return draft.copy(), draft
    target = draft.copy()
    if kind == "jitter":
        target = target * (1.0 + size * np.cos(np.arange(target.size) + 1.0))
    else:
        target[at] *= 1.0 + size
    return target / target.sum(), draft


def test_the_pinned_case_is_hypothesis_s():
    assert np.abs(_laws(*FOUND[0][:2])[0] - HYPOTHESIS_CASE).max() < 1e-9


@settings(max_examples=examples(40), deadline=None)
@given(near_equal())
@example(FOUND[0])
@example(FOUND[1])
@example(FOUND[2])
@example(FOUND[3])
def test_rules_without_replacement_near_equal_laws_with_tiny_masses(case):
    raw, how, k = case
    target, draft = _laws(raw, how)
    try:
        scheme = WithoutReplacement(draft, k)
    except OtmError:
        assume(False)
    assume(scheme.n_tuples() <= 2000)
    alpha_wor = optimal_acceptance_of(scheme, target).value
    for name in WOR_RULES:
        ev = evaluate(name, scheme, target)
        assert ev.law_error <= TOL, (name, ev.law_error)
        assert ev.acceptance <= alpha_wor + TOL, (name, ev.acceptance, alpha_wor)
        if how[0] == "same":  # every arrival is accepted: nothing is ever left to the residual
            assert ev.acceptance >= 1.0 - TOL, (name, ev.acceptance)
        bound = VERIFIERS[name].bind(target, scheme)
        if name == "rrs_without_replacement":
            claimed = rrsw.acceptance_exact(target, draft, k)
        elif name == "optimal_embedded":  # its selection acceptance is a lower bound; proved >= alpha*_iid
            assert bound.acceptance <= ev.acceptance + TOL
            assert bound.acceptance >= optimal_acceptance_of(IID(draft, k), target).value - TOL
            continue
        else:  # the loop acceptance equals the membership acceptance (at the root, for kseq_w/o)
            claimed = bound.acceptance
        assert abs(ev.acceptance - claimed) <= TOL, (name, ev.acceptance, claimed)


@settings(max_examples=examples(60), deadline=None)
@given(near_equal())
@example(FOUND[1])
def test_kseq_rho_star_near_equal_laws(case):
    """rho* by breakpoints and Brent is valid (g <= 0 up to g's own rounding, as in test_verifiers) and no
    larger than SpecTr's bisection's (to 1e-11): the bug returned k."""
    raw, how, k = case
    target, draft = _laws(raw, how)
    target, draft = check_law(target), check_law(draft)
    rho = kseq.rho_star(target, draft, k)
    assert kseq.g(target, draft, k, rho) <= 1e-14
    assert rho <= kseq.rho_star_bisect(target, draft, k) + 1e-11


def test_rho_star_of_the_pinned_case_is_one_not_k():
    """The bug's own input: the target normalised twice (by ``evaluate`` and by ``bind``) against the
    scheme's draft; the direct g(1) is 1.4e-16 > 0 inside rho_star and its segment form 0. rho* was 2 = k."""
    raw = np.array(FOUND[0][0])
    scheme = WithoutReplacement(raw / raw.sum(), 2)
    target = check_law(check_law(raw / raw.sum()))
    rho = kseq.rho_star(target, scheme.draft, 2)
    assert rho <= 1.0 + 2 * kseq.SAFETY and kseq.g(target, scheme.draft, 2, rho) <= 0.0
