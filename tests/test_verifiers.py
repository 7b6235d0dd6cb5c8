"""Every verifier returns exactly the target law, on every case hypothesis finds.

For each scheme and each verifier exact for it, the exact output law (drafts
enumerated, the verifier's uniforms integrated) must equal the target to 1e-9,
its acceptance must not exceed the scheme's optimum, and the closed forms must
agree with enumeration.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from otm.exact import evaluate
from otm.laws import OtmError
from otm.optimum import brute_force_optimum
from otm.schemes import IID, Greedy, SpecHub, WithoutReplacement
from otm.verifiers import VERIFIERS, applicable, greedy, kseq, spechub, speculative
from strategies import pair
from hyp import examples

TOL = 1e-9
SCHEMES = {
    "iid": IID,
    "without_replacement": WithoutReplacement,
    "greedy": Greedy,
    "spechub": lambda q, k: SpecHub(q, 2),
}


def build(name, draft, k):
    try:
        return SCHEMES[name](draft, k)
    except OtmError:
        return None  # scheme undefined for this draft (e.g. support smaller than k)


@settings(max_examples=examples(150), deadline=None)
@given(pair(max_V=5), st.integers(1, 3), st.sampled_from(sorted(SCHEMES)))
def test_every_verifier_is_exact_and_below_the_optimum(laws, k, name):
    target, draft = laws
    scheme = build(name, draft, k)
    assume(scheme is not None)
    optimum = brute_force_optimum(scheme, target)
    names = [v.name for v in applicable(scheme)]
    assert "lp_optimal" in names and len(names) >= 2
    for v in names:
        ev = evaluate(v, scheme, target)
        assert ev.law_error <= TOL, (v, ev.law_error)
        assert ev.acceptance <= optimum + TOL, (v, ev.acceptance, optimum)
        if v == "lp_optimal":
            assert abs(ev.acceptance - optimum) <= TOL
        if scheme.k == 1:
            assert abs(ev.acceptance - np.minimum(target, draft).sum()) <= TOL


@settings(max_examples=examples(100), deadline=None)
@given(pair(max_V=6), st.integers(1, 4))
def test_kseq_closed_form_rho_and_guarantee(laws, k):
    target, draft = laws
    scheme = IID(draft, k)
    rho = kseq.rho_star(target, draft, k)
    assert 1.0 <= rho <= k
    assert kseq.g(target, draft, k, rho) <= 1e-14  # valid (g is a difference of sums near 1: rounding ~1e-15)
    def accept_at(r):
        return np.minimum(target, r * draft).sum()

    # minimal: slightly smaller is invalid, or changes the acceptance by less than rounding
    # (where g is flat, e.g. a draft mass of 1e-12 on the target's only token, rho* is
    # ill-conditioned but the acceptance it gives is not)
    if rho > 1.0 + 1e-9:
        smaller = rho * (1 - 1e-9)
        assert kseq.g(target, draft, k, smaller) > 0 or abs(accept_at(smaller) - accept_at(rho)) < 1e-12
    assert abs(accept_at(rho) - accept_at(kseq.rho_star_bisect(target, draft, k))) < 1e-9
    closed = kseq.acceptance(target, draft, k)
    assert abs(closed - np.minimum(target, rho * draft).sum()) < 1e-9
    if k <= 3 and draft.size <= 5:
        ev = evaluate("kseq", scheme, target)
        assert abs(ev.acceptance - closed) < 1e-9
        optimum = brute_force_optimum(scheme, target)
        assert closed >= (1 - (1 - 1 / k) ** k) * optimum - 1e-9


@settings(max_examples=examples(80), deadline=None)
@given(pair(max_V=5), st.integers(1, 3), st.sampled_from(sorted(SCHEMES)))
def test_closed_form_acceptances_match_enumeration(laws, k, name):
    """Every registered rule's ``acceptance`` (closed form or exact formula) against its enumerated law, on the
    schemes it is exact for; ``optimal_embedded``'s formula is its selection acceptance, a lower bound on membership."""
    target, draft = laws
    scheme = build(name, draft, k)
    assume(scheme is not None)
    for v in applicable(scheme):
        if v.closed_form is None:
            continue
        try:
            value, method = v.acceptance(target, draft, scheme.k)
        except OtmError:  # a formula with a size limit of its own (optimal_without_replacement)
            continue
        assert method
        enumerated = evaluate(v.name, scheme, target).acceptance
        if v.name == "optimal_embedded":
            assert value <= enumerated + 1e-9, (v.name, value, enumerated)
        else:
            assert abs(value - enumerated) < 1e-8, (v.name, value, enumerated)


def test_the_registry_feeds_every_list():
    """One record per rule (otm.verifiers.VERIFIERS): every module has the law / sample / bind / acceptance a record
    promises; the decoder's lookup and the CLI's choices are derived from it (a rule added there is decodable by its
    record alone); ``otm profile``'s decode-check subset and ratio schemes are registered rules."""
    from otm.decode.cli import ALL_VERIFIERS, WOR_ONLY
    from otm.decode.decoder import VERIFIERS as DECODER
    from otm.decode.profile import DECODABLE, SCHEME_OF
    from otm.verifiers import decodable

    for v in VERIFIERS.values():
        assert callable(v.module.bind), v.name
        if v.closed_form is not None:
            assert all(callable(getattr(v.module, f)) for f in ("law", "sample", "acceptance")), v.name
    for scheme in ("iid", "without_replacement"):
        assert DECODER[scheme][: len(decodable(scheme))] == decodable(scheme)
        assert set(decodable(scheme)) == {n for n, v in VERIFIERS.items() if scheme in v.decode}
    assert {n for n, v in VERIFIERS.items() if v.decode} <= set(ALL_VERIFIERS)
    assert set(WOR_ONLY) >= {n for n, v in VERIFIERS.items() if v.decode == ("without_replacement",)}
    assert set(DECODABLE) <= set(decodable("iid") + decodable("without_replacement"))
    assert set(SCHEME_OF) == set(VERIFIERS) and SCHEME_OF["speculative"] == "iid"
    with pytest.raises(OtmError, match="no closed form"):
        VERIFIERS["lp_optimal"].acceptance([0.5, 0.5], [0.5, 0.5], 2)


def test_greedy_and_spechub_reach_their_optimum():
    rng = np.random.default_rng(0)
    for _ in range(30):
        target, draft = rng.dirichlet(np.ones(5) * 0.5), rng.dirichlet(np.ones(5) * 0.5)
        for scheme, name in [(Greedy(draft, 3), "greedy"), (SpecHub(draft), "spechub")]:
            assert abs(evaluate(name, scheme, target).acceptance - brute_force_optimum(scheme, target)) < 1e-9


def test_kseq_edge_cases():
    # disjoint supports: nothing accepted, output is the target
    t, q = np.array([1.0, 0, 0]), np.array([0, 0.5, 0.5])
    assert kseq.rho_star(t, q, 3) == 1.0
    assert np.allclose(kseq.law(t, q, [1, 2, 1]), t)
    # identical laws: the first draft is always accepted
    q = np.array([0.2, 0.3, 0.5])
    out = kseq.law(q, q, [2, 0])
    assert np.allclose(out, [0, 0, 1])
    # no cover property (Sequoia appendix): target [1, 0], draft [.5, .5], k = 2 -> 0.75
    assert abs(kseq.acceptance([1.0, 0.0], [0.5, 0.5], 2) - 0.75) < 1e-12


class ZeroRng:
    """Every uniform is exactly 0: the boundary where `u <= ratio` accepts p = 0 tokens."""

    def random(self, size=None):
        return 0.0 if size is None else np.zeros(size)


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_zero_probability_tokens_are_never_emitted_even_at_u_zero(name):
    target = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    draft = np.array([0.3, 0.1, 0.3, 0.1, 0.2])
    record = VERIFIERS[name]
    scheme = build(record.optimum_scheme, draft, 1 if record.only_k1 else 2)
    bound = VERIFIERS[name].bind(target, scheme)
    tuples, _ = scheme.enumerate()
    for t in tuples:
        out = bound.sample(t, ZeroRng())
        assert target[out.token] > 0, (name, t.tolist(), out)
        assert out.accepted is None or t[out.accepted] == out.token


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: kseq.law([0.5, 0.5], [0.5, 0.5], [0, 2]), "must lie in"),
        (lambda: kseq.law([0.5, 0.5], [1.0, 0.0], [0, 1]), "zero draft probability"),
        (lambda: kseq.law([0.5, 0.5], [0.5, 0.5, 0.0], [0]), "same vocabulary"),
        (lambda: speculative.law([0.5, 0.5], [0.5, 0.5], [0, 1]), "exactly 1 drafts"),
        (lambda: greedy.law([0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [1, 2]), "must start with the top"),
        (lambda: spechub.law([0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [1, 2]), "(i, hub) or (hub, i)"),
        (lambda: evaluate("kseq", WithoutReplacement([0.5, 0.5], 2), [0.5, 0.5]), "not exact"),
        (lambda: evaluate("beam", IID([0.5, 0.5], 2), [0.5, 0.5]), "unknown verifier"),
    ],
)
def test_bad_verifier_input(call, fragment):
    with pytest.raises(OtmError) as exc:
        call()
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_a_rule_added_by_its_registry_line_alone_reaches_the_acceptance_table(monkeypatch):
    """A toy rule (K-SEQ's module under a new name) registered with one record: ``otm acceptance``'s report lists
    it with its enumerated law error and its formula, with nothing else edited."""
    from otm.cli import acceptance_report
    from otm.verifiers import Verifier

    toy = Verifier("toy_kseq", kseq, ("iid",), closed_form=lambda t, d, k: (kseq.acceptance(t, d, k), "toy formula"))
    monkeypatch.setitem(VERIFIERS, "toy_kseq", toy)
    report = acceptance_report([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2, "iid")
    assert report["verifiers"]["toy_kseq"]["law_error"] < 1e-12
    assert report["verifiers"]["toy_kseq"]["acceptance"] == report["verifiers"]["kseq"]["acceptance"]
    report = acceptance_report([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2, "iid", max_tuples=1)  # too many tuples: the formula
    assert report["verifiers"]["toy_kseq"]["method"] == "toy formula"
