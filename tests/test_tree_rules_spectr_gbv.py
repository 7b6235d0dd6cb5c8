"""SpecTr-GBV (otm.tree_verifiers.spectr_gbv, otm.decode.tree_rules_spectr_gbv): K draft blocks verified in
turn with block verification, the root's residual handed on after each rejected block.

Exact: the REAL decoder with ``verifier="spectr_gbv"`` in its exact mode gives the target's law of T tokens to
1e-12 on toy LMs (several V, K, L, T, seeds, temperature / top-k, EOS, both rollbacks, both draft schemes).
Planted bugs, each caught by the same check (law error and TV stated in each docstring). K = 1 is block
verification (law equal to 1e-12); without replacement it is traversal verification (same law, to 1e-12). Its
exact tokens per call never exceed the tree LP's optimum; the 'running' closed form at K = 1 is block
verification's value; the 'prefix' closed form exceeds the LP optimum on a toy case (no lossless verifier
attains it).
"""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
import pytest

import otm.tree_verifiers.spectr_gbv as sg
from otm.analysis.tree_optimum import draft_rows, solve_tree_lp
from otm.decode import Sampling, speculative_decode
from otm.decode.exact_mode import as_vectors, exact_decode_law, law_error, target_law
from otm.decode.toy import ToyLM, model_law
from otm.decode.tree import DraftTree
from otm.laws import OtmError
from otm.tree_verification import block_law, traversal_law

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [0, 2]


def _errors(V, k, L, T, seeds, scheme="iid", **options):
    """(law error, TV) of the real decoder with spectr_gbv, every run enumerated, against the target's law."""
    target, draft = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
    prompt = [0, 1] if V == 2 else PROMPT
    eos = options.get("eos_token_id")
    law = exact_decode_law(target, draft, prompt, max_new_tokens=T, k=k, length=L, verifier="spectr_gbv",
                           scheme=scheme, **options)
    ref = target_law(model_law(target, prompt, options.get("sampling")), T, eos=eos)
    _, a, b = as_vectors(ref, law)
    return law_error(law, ref), 0.5 * float(np.abs(a - b).sum())


@pytest.mark.parametrize("V,k,L,T,seeds,scheme,options", [
    (3, 2, 1, 2, (0, 1), "iid", {}),
    (3, 2, 2, 3, (0, 1), "iid", {}),
    (2, 3, 2, 3, (4, 5), "iid", {}),
    (2, 4, 1, 3, (6, 7), "iid", {"target_rollback": "refeed"}),
    (4, 2, 2, 3, (3, 4), "iid", {"sampling": Sampling(top_k=2)}),
    (3, 2, 2, 3, (0, 1), "without_replacement", {}),
    (3, 3, 2, 3, (2, 3), "without_replacement", {}),
    (3, 2, 2, 3, (6, 7), "without_replacement", {"sampling": Sampling(temperature=0.7), "eos_token_id": 1}),
])
def test_spectr_gbv_decoder_is_exact(V, k, L, T, seeds, scheme, options):
    """The real decoder with SpecTr-GBV, every run enumerated: the target's law of T tokens to 1e-12."""
    assert _errors(V, k, L, T, seeds, scheme, **options)[0] < 1e-12


@pytest.mark.research
@pytest.mark.parametrize("V,k,L,T,seeds,scheme", [
    (2, 2, 3, 4, (2, 3), "iid"), (2, 4, 2, 3, (8, 9), "iid"), (3, 3, 2, 3, (10, 11), "iid"),
    (2, 2, 3, 4, (2, 3), "without_replacement"), (4, 3, 2, 3, (12, 13), "without_replacement"),
])
def test_spectr_gbv_decoder_is_exact_larger(V, k, L, T, seeds, scheme):
    """Larger cases (L = 3, K = 4), make test-slow: the target's law of T tokens to 1e-12."""
    assert _errors(V, k, L, T, seeds, scheme)[0] < 1e-12


# -- planted bugs: slips a port of the paper could make; each caught by the decoder's exact mode ----------

_REJECT, _BLOCK, _WEIGHTS = sg.SpectrGbvState.reject, sg.SpectrGbvState.block, sg.SpectrGbvState.weights


def _no_handoff(self, j):
    """Bug: every block verified against the original target, the root's residual never handed on (BV on
    each row independently). V = 2, K = 2, L = 2, T = 3, seeds (2, 3): law error 0.193, TV 0.324."""
    self.touched = False


def _target_after_partial(self, j):
    """Bug: after a partly accepted block (1 <= tau < L) the next token drawn from the target's law instead of
    the residual norm((w_tau P - Q)_+). V = 2, K = 2, L = 2, T = 3, seeds (4, 5): law error 0.046, TV 0.047
    (V = 3, seeds (0, 1): law error 0.0125, TV 0.027)."""
    tau, _ = _BLOCK(self, j)
    return tau, [None] + [self.P(self.rows[j][i - 1]) for i in range(1, self.L)] + [None]


def _first_weight_from_target(self, j):
    """Bug: the next block's first weight w_1 = min(1, p(x_1)/q(x_1)) from the root's original target law, not
    from the residual handed on (the residual used only for the final draw). V = 2, K = 2, L = 2, T = 3,
    seeds (2, 3): law error 0.126, TV 0.209."""
    p0 = self.p0
    self.p0 = _row0(self)
    try:
        return _WEIGHTS(self, j)
    finally:
        self.p0 = p0


def _row0(state):
    return np.asarray(state.target_of(0), dtype=np.float64).reshape(-1)


def _keeps_rejected_token(self, j):
    """Bug: without replacement, the rejected row's first token stays in the root's draft law (the next row's
    first token is then weighed against the wrong law). V = 3, K = 2, L = 2, T = 3, seeds (2, 3): law error
    0.270, TV 0.352 (seeds (0, 1): 0.0135, TV 0.026)."""
    self.root_without_replacement = False
    _REJECT(self, j)


@pytest.mark.parametrize("bug,method,case", [
    (_no_handoff, "reject", dict(V=2, k=2, L=2, T=3, seeds=(2, 3), scheme="iid")),
    (_target_after_partial, "block", dict(V=2, k=2, L=2, T=3, seeds=(4, 5), scheme="iid")),
    (_first_weight_from_target, "weights", dict(V=2, k=2, L=2, T=3, seeds=(2, 3), scheme="iid")),
    (_keeps_rejected_token, "reject", dict(V=3, k=2, L=2, T=3, seeds=(2, 3), scheme="without_replacement")),
])
def test_planted_spectr_gbv_bugs_are_caught_by_the_exact_mode(bug, method, case):
    assert _errors(**case)[0] < 1e-12
    with mock.patch.object(sg.SpectrGbvState, method, bug):
        assert _errors(**case)[0] > 1e-3


# -- the numpy law: K = 1 is block verification; without replacement it is traversal ---------------------


def _tables(V, depth, seed):
    """Explicit per-prefix laws P(.|prefix), Q(.|prefix) for every prefix up to ``depth`` (zeros included)."""
    rng = np.random.default_rng(seed)
    P, Q = {}, {}
    for n in range(depth + 1):
        for prefix in itertools.product(range(V), repeat=n):
            P[prefix], Q[prefix] = rng.dirichlet(np.full(V, 0.5)), rng.dirichlet(np.full(V, 0.5))
    return P, Q


def _prefixes(tree):
    prefix = {0: ()}
    for n in range(1, tree.size):
        prefix[n] = prefix[int(tree.parent[n])] + (int(tree.tokens[n]),)
    return prefix


@pytest.mark.parametrize("V,L,seed", [(3, 1, 0), (3, 2, 1), (4, 3, 2), (2, 4, 3)])
def test_one_block_is_block_verification(V, L, seed):
    """K = 1: spectr_gbv_law equals block verification's law (otm.tree_verification.block_law) on every chain."""
    P, Q = _tables(V, L, seed)
    for chain in itertools.product(range(V), repeat=L):
        if np.prod([Q[chain[:i]][chain[i]] for i in range(L)]) == 0:
            continue
        tree = DraftTree.from_rows([list(chain)], root_token=0)
        pre = _prefixes(tree)
        law = sg.spectr_gbv_law(tree, lambda n: P[pre[n]], lambda n: Q[pre[n]])
        tau, res = block_law(np.array([P[chain[:i]] for i in range(L + 1)]), np.array([Q[chain[:i]] for i in range(L)]),
                             np.array(chain))
        ref = {chain[:t] + (y,): float(tau[t] * res[t, y]) for t in range(L + 1) for y in range(V) if tau[t] * res[t, y] > 0}
        assert law_error(law, ref) < 1e-12


def test_without_replacement_it_is_traversal_verification():
    """Distinct root tokens: the merged tree is the forest of rows, so SpecTr-GBV and traversal emit the same law."""
    V, k, L = 3, 3, 2
    P, Q = _tables(V, L, 4)
    for rows, _ in draft_rows(lambda s: Q[s], k, L, "without_replacement"):
        tree = DraftTree.from_rows(rows, root_token=0)
        pre = _prefixes(tree)
        mine = sg.spectr_gbv_law(tree, lambda n: P[pre[n]], lambda n: Q[pre[n]], root_without_replacement=True)
        theirs = traversal_law(tree, lambda n: P[pre[n]], lambda n: Q[pre[n]], root_without_replacement=True)
        assert law_error(mine, theirs) < 1e-12


def test_iid_differs_from_traversal_on_duplicate_roots():
    """With i.i.d. rows sharing a first token, traversal lets the first draw own the merged subtree and
    SpecTr-GBV keeps each row its own chain: different laws (both exact). Rows (0, 1), (0, 2) of random tables
    (seed 6): law error 0.21; tokens on this tree 2.79 (SpecTr-GBV) against 3.0 (traversal): once row 1's block
    is rejected, the root residual has no mass on its first token, so row 2 (same first token) is dead, while
    traversal still tries row 2's second token under the shared node."""
    P, Q = _tables(3, 2, 6)
    tree = DraftTree.from_rows([[0, 1], [0, 2]], root_token=0)
    pre = _prefixes(tree)
    mine = sg.spectr_gbv_law(tree, lambda n: P[pre[n]], lambda n: Q[pre[n]])
    theirs = traversal_law(tree, lambda n: P[pre[n]], lambda n: Q[pre[n]])
    assert law_error(mine, theirs) > 1e-3


# -- values: the LP bound and the closed forms --------------------------------------------------------


def _value(P, Q, k, L, scheme="iid"):
    """Exact tokens per call of one step: the numpy block law summed over every draft tuple."""
    total = 0.0
    for rows, w in draft_rows(lambda s: Q[s], k, L, scheme):
        tree = DraftTree.from_rows(rows, root_token=0)
        pre = _prefixes(tree)
        law = sg.spectr_gbv_law(tree, lambda n: P[pre[n]], lambda n: Q[pre[n]],
                                root_without_replacement=scheme == "without_replacement")
        total += w * sum(len(b) * x for b, x in law.items())
    return total


def test_value_below_the_tree_optimum_and_the_running_closed_form_is_block_at_one_draft():
    """SpecTr-GBV's exact value <= the LP optimum (strictly below here); at K = 1 it equals the LP (block
    verification is optimal on a chain) and the 'running' closed form (1 + E[tau])."""
    P, Q = _tables(3, 3, 6)
    target, draft = (lambda s: P[s]), (lambda s: Q[s])
    for k, L in ((1, 2), (2, 2)):
        lp = solve_tree_lp(target, draft, k, L, "iid").value
        value = _value(P, Q, k, L)
        assert value <= lp + 1e-9
        if k == 1:
            assert abs(value - lp) < 1e-9
            assert abs(1 + sg.closed_form_accepted(target, draft, 1, L, "running") - value) < 1e-12
        else:
            assert value < lp - 1e-3


def test_the_prefix_closed_form_exceeds_the_tree_optimum():
    """The literal reading of the closed form, r = min(1, q(y_{1:i}) / p(y_{1:i})), is above the LP optimum on
    ToyLM(2, seed=4) / ToyLM(2, seed=5), K = 2, L = 2 (1.456 > 1.390): no lossless verifier attains it."""
    target, draft = model_law(ToyLM(2, seed=4), [0, 1]), model_law(ToyLM(2, seed=5), [0, 1])
    lp = solve_tree_lp(target, draft, 2, 2, "iid").value
    form = 1 + sg.closed_form_accepted(target, draft, 2, 2, "prefix")
    assert form > lp + 0.05


def test_bad_input_is_one_line():
    with pytest.raises(OtmError, match="ratio"):
        sg.closed_form_accepted(lambda s: np.ones(2) / 2, lambda s: np.ones(2) / 2, 2, 1, "joint")
    with pytest.raises(OtmError, match="whole numbers"):
        sg.closed_form_accepted(lambda s: np.ones(2) / 2, lambda s: np.ones(2) / 2, 0, 1)
    with pytest.raises(OtmError, match="draft row"):
        sg.SpectrGbvState(DraftTree.root_only(0), lambda n: np.ones(2) / 2, lambda n: np.ones(2) / 2)


def test_spectr_gbv_runs_in_the_decoder_and_counts_depths():
    target, draft = ToyLM(5, seed=1), ToyLM(5, seed=2)
    for scheme in ("iid", "without_replacement"):
        run = speculative_decode(target, draft, PROMPT, k=3, length=3, verifier="spectr_gbv", scheme=scheme,
                                 max_new_tokens=40, seed=3)
        s = run.stats
        assert s.new_tokens == 40 and len(run.tokens) == 40 and s.target_calls < 40
        assert all(a <= v for a, v in zip(s.accepted_by_depth, s.verified_by_depth))
        assert sum(s.accepted_by_depth) == s.new_tokens - s.steps
