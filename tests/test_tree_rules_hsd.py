"""HSD, hierarchical speculative decoding of one chain (Zhou et al., arXiv 2601.05724): ``hsd`` and ``hsd_code``.

Verdict: REFUTED, both. On one chain HSD is block verification at every level but the top, where it keeps
the whole chain with the uncapped joint ratio min(1, r_gamma) >= BV's capped weight; its expected tokens per
target call then exceed the one-chain LP optimum (= block verification), and the real decoder's exact law
of T tokens is off. Smallest counterexample (V = 2, k = 1, L = 2, T = 3, explicit laws below): law error
0.015, TV 0.030; on the toy bank of ``otm certify hsd_code --kind decoder -k 1 --length 2``: law error 0.021.

The exact checks can fail: the same decoder run with the top level capped (``Hsd(top="capped")``, which is
block verification) is exact to 1e-12, and two realistic slips planted into that lossless variant are caught
(law errors stated in the test).
"""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
import pytest
import torch

import otm.tree_verifiers.hsd as hsd_np
from otm.analysis.tree_optimum import rule_tokens_per_call, solve_tree_lp, tree_optimum
from otm.decode import Sampling, speculative_decode
from otm.decode.exact_mode import exact_decode_law, law_error, target_law, total_variation
from otm.decode.toy import ToyLM, model_law
from otm.decode.tree_rules_hsd import Hsd
from otm.laws import OtmError
from otm.tree_verification import block_law
from otm.tree_verifiers.hsd import chain_block_law, hsd_code_law, hsd_law
from test_tree_optimum import lossless_violation

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [0, 1]


def _random_chain(rng, V, gamma):
    P = rng.dirichlet(np.full(V, 0.5), gamma + 1)
    Q = rng.dirichlet(np.full(V, 0.5), gamma)
    return P, Q, np.array([rng.choice(V, p=Q[i]) for i in range(gamma)])


def test_hsd_is_block_verification_below_the_top_level():
    """On 300 random chains (V 2..5, gamma 1..5): with the top capped, HSD's law is BV's (to 1e-12); as HSD
    (top = joint) only P(tau = gamma) differs, and it is never below BV's; hsd_code's arithmetic gives hsd's law."""
    rng = np.random.default_rng(0)
    above = 0
    for _ in range(300):
        P, Q, chain = _random_chain(rng, int(rng.integers(2, 6)), int(rng.integers(1, 6)))
        tau_bv, res_bv = block_law(P, Q, chain)
        tau_c, res_c = hsd_law(P, Q, chain, top="capped")
        live = tau_bv > 0
        assert np.abs(tau_c - tau_bv).max() < 1e-12 and np.abs(res_c[live] - res_bv[live]).max() < 1e-12
        tau, res = hsd_law(P, Q, chain)
        r, w = hsd_np.hsd_weights(P, Q, chain)
        a = tau_bv[-1]  # BV: h_gamma = w_gamma; HSD: min(1, r_gamma) >= w_gamma
        assert abs(a - w[-1]) < 1e-12 and tau[-1] >= a - 1e-15 and abs(tau[-1] - min(1.0, r[-1])) < 1e-12
        scale = (1 - tau[-1]) / (1 - a) if a < 1 else 0.0
        assert np.abs(tau[:-1] - scale * tau_bv[:-1]).max() < 1e-12  # lower levels: BV's, renormalised
        above += tau[-1] > a + 1e-9
        tau_k, res_k, nan_rows = hsd_code_law(P, Q, chain)
        assert np.abs(tau_k - tau).max() < 1e-12 and np.abs(res_k[tau > 0] - res[tau > 0]).max() < 1e-12
    assert above > 30  # the top level differs on a good share of chains


def _hand_case():
    """V = 2, L = 2. Root: target (1/2, 1/2), draft (9/10, 1/10); after 0: both (1/2, 1/2); after 1: target
    (1/5, 4/5), draft (1/2, 1/2); after two tokens: both uniform."""
    P = {(): np.array([0.5, 0.5]), (0,): np.array([0.5, 0.5]), (1,): np.array([0.2, 0.8])}
    Q = {(): np.array([0.9, 0.1]), (0,): np.array([0.5, 0.5]), (1,): np.array([0.5, 0.5])}
    for s in itertools.product(range(2), repeat=2):
        P[s], Q[s] = np.array([0.5, 0.5]), np.array([0.5, 0.5])
    return P, Q


def _chain_rule_block_law(P, Q, L, law_fn):
    out: dict = {}
    for chain in itertools.product(range(P[()].size), repeat=L):
        pr = float(np.prod([Q[chain[:i]][chain[i]] for i in range(L)]))
        if pr == 0:
            continue
        tau, res = law_fn(np.array([P[chain[:i]] for i in range(L + 1)]), np.array([Q[chain[:i]] for i in range(L)]),
                          np.array(chain))[:2]
        for b, w in chain_block_law(tau, res, chain).items():
            out[b] = out.get(b, 0.0) + pr * w
    return out


def test_hand_counterexample_exceeds_the_one_chain_optimum():
    """After X_1 = 1 (r_1 = 5) HSD keeps both chains 1 0 (r_2 = 2) and 1 1 (r_2 = 8) for sure: among blocks
    that go past 1 the next token is 0 with probability 1/2, not 1/5. E|B| = 2.20 > 2.17 = LP = BV."""
    P, Q = _hand_case()
    for fn in (hsd_law, hsd_code_law):
        law = _chain_rule_block_law(P, Q, 2, fn)
        assert sum(len(b) * w for b, w in law.items()) == pytest.approx(2.2, abs=1e-12)
        assert lossless_violation(law, lambda s: P[s], 2) == pytest.approx(0.03, abs=1e-12)
    bv = _chain_rule_block_law(P, Q, 2, lambda a, b, c: hsd_law(a, b, c, top="capped"))
    assert lossless_violation(bv, lambda s: P[s], 2) < 1e-12
    assert solve_tree_lp(lambda s: P[s], lambda s: Q[s], 1, 2).value == pytest.approx(2.17, abs=1e-9)


def _hand_toy(root, after0, after1) -> ToyLM:
    """A V = 2 ToyLM with the laws of :func:`_hand_case` after the prompt [0, 0] (logits = log-laws)."""
    model = ToyLM(2, seed=0)
    with torch.no_grad():
        model.table.zero_()  # every other law uniform
        model.table[0, 0, 1] = torch.tensor(root).log()  # after the prompt (last token 0 at an odd position)
        model.table[0, 0, 0] = torch.tensor(after0).log()  # after X_1 = 0
        model.table[1, 0, 0] = torch.tensor(after1).log()  # after X_1 = 1
    return model


@pytest.mark.parametrize("rule", ["hsd", "hsd_code"])
def test_smallest_counterexample_in_the_real_decoder(rule):
    """V = 2, k = 1, L = 2 with the hand laws: the decoder's law of T = 3 tokens is off by 0.015 (TV 0.030);
    block verification on the same models is exact. (T = L + 1 is the least T at which the first step drafts L.)"""
    target = _hand_toy([0.5, 0.5], [0.5, 0.5], [0.2, 0.8])
    draft = _hand_toy([0.9, 0.1], [0.5, 0.5], [0.5, 0.5])
    ref = target_law(model_law(target, [0, 0]), 3)
    law = exact_decode_law(target, draft, [0, 0], max_new_tokens=3, k=1, length=2, verifier=rule)
    assert law_error(law, ref) == pytest.approx(0.015, abs=1e-6)
    assert total_variation(law, ref) == pytest.approx(0.030, abs=1e-6)
    block = exact_decode_law(target, draft, [0, 0], max_new_tokens=3, k=1, length=2, verifier="block")
    assert law_error(block, ref) < 1e-12


@pytest.mark.parametrize("rule", ["hsd", "hsd_code"])
def test_hsd_beats_the_lp_optimum_and_so_is_refuted(rule):
    """V = 3, L = 2, ToyLM seeds 0 / 1: tokens per call 1.9395 > 1.9252 = LP optimum at k = 1 = block; the
    decoder's law of 3 tokens is off by 8.2e-3 (TV 1.42e-2, the same as the excess over the LP here)."""
    t, d = ToyLM(3, seed=0), ToyLM(3, seed=1)
    lp = tree_optimum(t, d, PROMPT, k=1, L=2).value
    value = rule_tokens_per_call(t, d, PROMPT, 1, 2, rule)
    assert value == pytest.approx(1.939452089964716, abs=1e-9) and value > lp + 1e-2
    assert rule_tokens_per_call(t, d, PROMPT, 1, 2, "block") == pytest.approx(lp, abs=1e-9)
    law = exact_decode_law(t, d, PROMPT, max_new_tokens=3, k=1, length=2, verifier=rule)
    ref = target_law(model_law(t, PROMPT), 3)
    assert law_error(law, ref) == pytest.approx(8.199942345538e-3, abs=1e-9)
    assert total_variation(law, ref) == pytest.approx(value - lp, abs=1e-9)


@pytest.mark.parametrize("V,T,seeds,options", [(3, 3, (0, 1), {}),
                                               (4, 3, (3, 4), {"sampling": Sampling(top_k=2, temperature=0.7)}),
                                               (3, 3, (6, 7), {"target_rollback": "refeed", "eos_token_id": 1})])
def test_hsd_with_one_draft_token_is_exact(V, T, seeds, options):
    """L = 1: the top level is the only level and uncapped = capped (M_0 = 1): HSD is speculative sampling, exact."""
    t, d = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
    law = exact_decode_law(t, d, PROMPT, max_new_tokens=T, k=1, length=1, verifier="hsd", **options)
    assert law_error(law, target_law(model_law(t, PROMPT, options.get("sampling")), T,
                                     eos=options.get("eos_token_id"))) < 1e-12


# -- the exact check can fail: the lossless variant (top capped = BV) is exact, planted slips in it are caught --

def _capped_error(t, d, L=2, T=3, **options) -> float:
    law = exact_decode_law(t, d, PROMPT, max_new_tokens=T, k=1, length=L, verifier=Hsd(top="capped"), **options)
    return law_error(law, target_law(model_law(t, PROMPT, options.get("sampling")), T))


_ORIGINAL_WEIGHTS = hsd_np.hsd_weights


def _cap_without_floor(targets, drafts, chain):
    """Bug: the running maximum of the prefix ratios starts at r_1, not at 1 (the code's "ensure the cap is at
    least 1" line forgotten): w_t = r_t / max(r_1..r_t) is then 1 on a chain whose ratios all fall below 1."""
    r, w = _ORIGINAL_WEIGHTS(targets, drafts, chain)
    M = np.concatenate([[1.0], np.maximum.accumulate(r[1:])])
    return r, r / M


def _cap_at_one(targets, drafts, chain):
    """Bug: each prefix ratio capped at 1 on its own, min(1, r_t), instead of divided by the running maximum
    (the cap of the repository's first version, algorithm_clean.py: min(p(X_1:t), q(X_1:t)))."""
    r, w = _ORIGINAL_WEIGHTS(targets, drafts, chain)
    return r, np.minimum(r, 1.0)


@pytest.mark.parametrize("bug,error", [(_cap_without_floor, 0.6426), (_cap_at_one, 0.002277)])
def test_planted_bugs_in_the_lossless_variant_are_caught(bug, error):
    """Top capped (= block verification): exact to 1e-12 on V = 3, L = 2, ToyLM seeds 2 / 5, T = 3. Planted:
    the running maximum not floored at 1 (law error 0.643) or each prefix ratio capped at 1 alone (law error
    2.28e-3; at L = 2 this is HSD itself): both caught."""
    t, d = ToyLM(3, seed=2), ToyLM(3, seed=5)
    assert _capped_error(t, d) < 1e-12
    with mock.patch.object(hsd_np, "hsd_weights", bug):
        assert _capped_error(t, d) == pytest.approx(error, rel=1e-3)


def test_certify_refutes_hsd_code_on_its_toy_bank():
    from otm.certify.decoder import certify_decoder

    report = certify_decoder("hsd_code", k=1, length=2)
    assert not report.certified
    assert max(c.law_error for c in report.cases) == pytest.approx(0.021, abs=1e-3)
    assert "otm certify hsd_code --kind decoder --scheme iid -k 1 --length 2" in report.command


def test_nan_levels_of_the_code_are_never_drawn():
    """Where the branch laws agree (D+ = D- = 0) the code's residual is NaN; the level above is then kept for
    sure (or the chain, r_gamma = M >= 1), so the NaN row has probability 0 and both conventions give one law;
    in floating point the level above is kept with 1 - 1e-16, so the code reaches its NaN draw (and fails) with
    probability ~1e-16 (the decoder's ``hsd_code`` raises OtmError there, as the code's torch.multinomial would)."""
    P = np.array([[0.5, 0.5], [0.3, 0.7], [0.6, 0.4], [0.5, 0.5]])
    Q = np.array([[0.5, 0.5], [0.3, 0.7], [0.2, 0.8]])
    for chain in ([0, 1, 0], [0, 1, 1]):
        tau_k, _, nan_rows = hsd_code_law(P, Q, np.array(chain))
        tau, _ = hsd_law(P, Q, np.array(chain))
        assert nan_rows[1] and tau_k[1] < 1e-15 and np.abs(tau_k - tau).max() < 1e-12


def test_hsd_refuses_trees_and_bad_input():
    t, d = ToyLM(3, seed=1), ToyLM(3, seed=2)
    with pytest.raises(OtmError, match="k = 1"):
        speculative_decode(t, d, PROMPT, k=2, verifier="hsd")
    with pytest.raises(OtmError, match="gamma"):
        hsd_law(np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), np.array([0]))
    with pytest.raises(OtmError, match="draft probability 0"):
        hsd_law(np.full((2, 2), 0.5), np.array([[1.0, 0.0]]), np.array([1]))
    with pytest.raises(OtmError, match="top"):
        hsd_law(np.full((2, 2), 0.5), np.full((1, 2), 0.5), np.array([1]), top="max")
    run = speculative_decode(t, d, PROMPT, k=1, length=3, verifier="hsd_code", max_new_tokens=30, seed=0)
    assert len(run.tokens) == 30 and run.stats.target_calls < 30
