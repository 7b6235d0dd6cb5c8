"""The one-step tree optimum (otm.analysis.tree_optimum): the LP against independent values, and the
decoder's rules below it."""

import itertools

import numpy as np
import pytest
import torch

from otm.analysis.tree_optimum import (
    RULES,
    rule_block_law,
    rule_tokens_per_call,
    solve_tree_lp,
    tree_law,
    tree_optimum,
)
from otm.decode import Sampling
from otm.decode.toy import ToyLM, model_law
from otm.decode.tree_registry import refuted
from otm.decode.tree_rules import block_law
from otm.laws import OtmError
from otm.optimum import optimal_acceptance

PROMPT = [0, 2]


def pair(V, seed, temperature=1.0):
    sampling = Sampling(temperature=temperature)
    t, d = ToyLM(V, seed=2 * seed), ToyLM(V, seed=2 * seed + 1)
    return t, d, sampling, model_law(t, PROMPT, sampling), model_law(d, PROMPT, sampling)


def lossless_violation(law: dict, P, L: int) -> float:
    """max |G(s x) - p(x|s) (G(s) - g(s))| over s, x: 0 iff the block is a stopped target stream."""
    G: dict = {}
    for b, w in law.items():
        for d in range(len(b) + 1):
            G[b[:d]] = G.get(b[:d], 0.0) + w
    worst = abs(G.get((), 0.0) - 1.0)
    seqs = [()]
    for _ in range(L + 1):
        nxt = []
        for s in seqs:
            p = P(s)
            for x in range(p.size):
                left = G.get(s, 0.0) - (law.get(s, 0.0) if s else 0.0)
                worst = max(worst, abs(G.get(s + (x,), 0.0) - p[x] * left))
                if p[x] > 0:
                    nxt.append(s + (x,))
        seqs = nxt
    return worst


@pytest.mark.parametrize("V,seed", [(3, 0), (4, 1)])
def test_one_draft_one_token_is_the_maximal_coupling(V, seed):
    t, d, s, P, Q = pair(V, seed)
    r = tree_optimum(t, d, PROMPT, 1, 1, sampling=s)
    assert r.value == pytest.approx(1 + np.minimum(P(()), Q(())).sum(), abs=1e-9)


@pytest.mark.parametrize("V,seed,scheme", [(3, 0, "iid"), (4, 1, "iid"), (3, 2, "without_replacement"),
                                            (4, 0, "without_replacement")])
def test_two_drafts_one_token_is_one_plus_alpha_star(V, seed, scheme):
    t, d, s, P, Q = pair(V, seed)
    r = tree_optimum(t, d, PROMPT, 2, 1, scheme, sampling=s)
    assert r.value == pytest.approx(1 + optimal_acceptance(P(()), Q(()), 2, scheme), abs=1e-9)


def block_by_hand(P, Q, L):
    """E[tokens] of block verification over every chain, from block_law alone (no decoder)."""
    total = 0.0
    V = P(()).size
    for chain in itertools.product(range(V), repeat=L):
        w = np.prod([Q(chain[:i])[chain[i]] for i in range(L)])
        if w == 0:
            continue
        targets = torch.tensor(np.stack([P(chain[:i]) for i in range(L + 1)]))
        drafts = torch.tensor(np.stack([Q(chain[:i]) for i in range(L)]))
        tau, _ = block_law(targets, drafts, torch.tensor(chain))
        total += w * float((tau * torch.arange(1, L + 2, dtype=tau.dtype)).sum())
    return total


@pytest.mark.parametrize("V,seed,temperature", [(3, 0, 1.0), (3, 1, 0.5), (4, 2, 2.0)])
def test_a_chain_optimum_is_block_verification(V, seed, temperature):
    # block verification is optimal for one chain; the LP must find exactly its value
    t, d, s, P, Q = pair(V, seed, temperature)
    r = tree_optimum(t, d, PROMPT, 1, 2, sampling=s)
    by_hand = block_by_hand(P, Q, 2)
    assert rule_tokens_per_call(t, d, PROMPT, 1, 2, "block", sampling=s) == pytest.approx(by_hand, abs=1e-12)
    assert r.value == pytest.approx(by_hand, abs=1e-9)
    assert r.transport_bound > r.value + 1e-3  # the plain OT looks ahead: a strict relaxation here


def test_speculative_one_token_by_the_decoder_is_the_maximal_coupling():
    t, d, s, P, Q = pair(3, 0)
    assert rule_tokens_per_call(t, d, PROMPT, 1, 1, "speculative", sampling=s) == pytest.approx(
        1 + np.minimum(P(()), Q(())).sum(), abs=1e-12)


def test_the_tree_law_is_a_law_and_counts_node_sets():
    _, _, _, _, Q = pair(3, 0)
    for scheme in ("iid", "without_replacement"):
        law = tree_law(Q, 2, 2, scheme)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        assert all(len([n for n in S if len(n) == 1]) <= 2 for S in law)
    assert all(len([n for n in S if len(n) == 1]) == 2 for S in tree_law(Q, 2, 2, "without_replacement"))


@pytest.mark.parametrize("V,k,L,seed,temperature", [(3, 2, 2, 0, 1.0), (3, 1, 2, 1, 2.0), (4, 2, 1, 2, 0.5),
                                                     (3, 2, 2, 3, 0.5)])
def test_no_rule_beats_the_optimum_and_block_beats_speculative(V, k, L, seed, temperature):
    t, d, s, P, _ = pair(V, seed, temperature)
    opt = {}
    for scheme in ("iid", "without_replacement"):
        r = tree_optimum(t, d, PROMPT, k, L, scheme, sampling=s)
        assert r.dual_bound >= r.value - 1e-9
        assert r.dual_bound <= r.value + 1e-6  # the certificate is tight
        assert r.transport_bound >= r.value - 1e-9
        assert lossless_violation(r.block_law, P, L) < 1e-8  # the optimal plan is itself a lossless step
        assert sum(len(b) * w for b, w in r.block_law.items()) == pytest.approx(r.value, abs=1e-8)
        opt[scheme] = r.value
    got = {}
    for (name, scheme), only_k in RULES.items():
        if (only_k is not None and only_k != k) or refuted(name):
            continue  # a refuted rule (hsd) beats the optimum by being lossy: tests/test_tree_rules_hsd.py
        law = rule_block_law(t, d, PROMPT, k, L, name, scheme, s)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        assert lossless_violation(law, P, L) < 1e-12  # every rule's block is a stopped target stream
        got[name, scheme] = sum(len(b) * w for b, w in law.items())
        assert got[name, scheme] <= opt[scheme] + 1e-9, (name, scheme, got[name, scheme], opt[scheme])
    if k == 1:
        assert got["block", "iid"] >= got["speculative", "iid"] - 1e-12
        assert got["traversal", "iid"] == pytest.approx(got["block", "iid"], abs=1e-12)  # on a chain: block


def test_the_lossless_check_sees_a_look_ahead_stop():
    # a block that stops by looking ahead (the module docstring's example) is not a stopped target stream
    P = lambda s: np.array([0.5, 0.5])  # noqa: E731
    law = {(0,): 0.25, (1,): 0.25, (0, 1): 0.25, (1, 1): 0.25}
    assert lossless_violation(law, P, 1) == pytest.approx(0.125)


def test_a_too_large_case_is_refused_in_one_line():
    t, d, s, _, _ = pair(4, 0)
    with pytest.raises(OtmError) as e:
        tree_optimum(t, d, PROMPT, 4, 3, sampling=s)
    assert "\n" not in str(e.value) and "max_trees" in str(e.value) and "V = 4, k = 4, L = 3" in str(e.value)
    _, _, _, P, Q = pair(3, 0)
    with pytest.raises(OtmError) as e:
        solve_tree_lp(P, Q, 2, 2, max_variables=100)
    assert "\n" not in str(e.value) and "max_variables = 100" in str(e.value)
