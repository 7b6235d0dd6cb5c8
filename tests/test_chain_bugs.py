"""The chain-bug catalogue (otm/certify/chain_bugs.py) and the ported engine suites
(otm/certify/engine_suites.py): the reference kernel is exact, each bug's stated TV is its kernel's,
the tile-edge bug fires at a realistic vocabulary, every suite passes the reference, and a few
suite-vs-bug verdicts of docs/audit.md pinned with their seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from otm.certify.chain_bugs import (CHAIN_BUGS, KERNELS, ChainInstance, diluted_kernel, law_given_path,
                                    long_tail_rows, random_instance, reference_chain, tile_edge_firing,
                                    tv_first_tokens)
from otm.certify.engine_suites import (flashinfer_suite, suite_rows, tileops_suite, transformers_suite,
                                       vllm_suite)
from otm.laws import OtmError
from otm.testing import chi2_gof

INST = random_instance(V=6, L=2, seed=0)

# Exact TV of the first L + 1 = 3 tokens on instance A (docs/audit.md's table).
TV_A = {
    "residual_wrong_position": 0.520801,
    "bonus_from_last_accepted": 0.121133,
    "u_le_ratio": 3.82301e-08,
    "residual_not_renormalised": 0.103754,
    "draft_prob_wrong_token": 0.0732236,
    "ratio_of_previous_position": 0.193821,
    "shared_uniform": 0.00510239,
    "tile_edge_recovered_id": 1.77636e-08,
    "recovered_from_target": 0.180707,
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_reference_law_is_the_target_law_exactly():
    for inst in (INST, random_instance(V=5, L=3, seed=3, masked=2), random_instance(V=6, L=2, seed=1, closeness=0.8)):
        assert tv_first_tokens("reference", inst) < 1e-12


def test_catalogue_is_complete_and_every_bug_is_lossy():
    assert len(CHAIN_BUGS) >= 8 and set(TV_A) == set(CHAIN_BUGS)
    for name in CHAIN_BUGS:
        assert tv_first_tokens(name, INST) == pytest.approx(TV_A[name], rel=1e-5), name
        assert TV_A[name] > 1e-9


def _emitted_cells(kernel, path, n, seed):
    dp, ids, tp = INST.tensors(np.repeat(np.asarray(path)[None], n, 0))
    out = kernel(dp, ids, tp, generator=torch.Generator().manual_seed(seed))
    assert out.dtype == torch.int32 and tuple(out.shape) == (n, INST.L + 1)
    accepted = (out != -1).sum(1) - 1
    last = out[torch.arange(n), accepted]
    return np.bincount(accepted.numpy() * (INST.V + 1) + last.numpy(), minlength=(INST.L + 1) * (INST.V + 1))


@pytest.mark.parametrize("name", list(KERNELS))
def test_each_kernel_draws_from_its_stated_exact_law(name):
    """Calibrated check (chi-square, level 1e-3, fixed seed) that the torch kernel's output law given
    its inputs is the numpy law the stated TV is computed from, on two drafted paths."""
    for path in ([1, 4], [3, 3]):
        P, Q = INST.rows(path)
        law = law_given_path(name, P, Q, path).ravel()
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        res = chi2_gof(_emitted_cells(KERNELS[name], path, 40_000, seed=5), law)
        assert not res.reject, (name, path, str(res))


def test_diluted_kernel_draws_from_the_mixture_law():
    """docs/results/engine_suites_dilution.md: a bug on a fraction eps of the rows has the law
    (1 - eps) ref + eps bug (so its TV is eps times the bug's); at eps = 0.3 the reference's law alone
    is refuted (TV 0.054 on instance A)."""
    P, Q = INST.rows([1, 4])
    ref = law_given_path("reference", P, Q, [1, 4]).ravel()
    bug = law_given_path("recovered_from_target", P, Q, [1, 4]).ravel()
    cells = _emitted_cells(diluted_kernel("recovered_from_target", 0.3), [1, 4], 40_000, seed=6)
    assert not chi2_gof(cells, 0.7 * ref + 0.3 * bug).reject
    assert chi2_gof(cells, ref).reject
    with pytest.raises(OtmError, match="eps"):
        diluted_kernel("shared_uniform", 0.0)


def test_the_law_check_refutes_a_bug_against_the_reference_law():
    """Negative control of the check above: recovered_from_target (TV 0.18 on this instance) drawn
    against the reference's law is rejected."""
    P, Q = INST.rows([1, 4])
    law = law_given_path("reference", P, Q, [1, 4]).ravel()
    assert chi2_gof(_emitted_cells(KERNELS["recovered_from_target"], [1, 4], 40_000, seed=5), law).reject


def test_reference_never_accepts_a_zero_probability_draft():
    P, Q = INST.rows([0, 0])
    zero = int(np.flatnonzero(INST.P[()] == 0)[0])
    dp, ids, tp = INST.tensors(np.full((20_000, 2), zero))
    out = reference_chain(dp, ids, tp, generator=torch.Generator().manual_seed(0))
    assert bool((out[:, 0] != zero).all())


def test_tile_edge_bug_returns_id_V_at_llama3_vocabulary():
    """The planted tile-edge bug at V = 128,256 (a 0.99-peaked target with a log-normal tail, a one-hot
    draft): exact firing probability 5.19e-4 per recovered draw, and seed 225 returns id V."""
    V = 128_256
    p = long_tail_rows()
    assert tile_edge_firing(p) == pytest.approx(5.189776e-4, rel=1e-5)
    q = np.zeros(V, np.float32)
    q[5] = 1.0
    dp, ids = torch.from_numpy(q).reshape(1, 1, V), torch.tensor([[5]])
    tp = torch.from_numpy(np.stack([p, p])).reshape(1, 2, V)
    out = KERNELS["tile_edge_recovered_id"](dp, ids, tp, generator=torch.Generator().manual_seed(225))
    assert out.tolist() == [[V, -1]]
    ok = reference_chain(dp, ids, tp, generator=torch.Generator().manual_seed(225))
    assert 0 <= int(ok[0, 0]) < V and p[int(ok[0, 0])] > 0


def test_bad_shapes_raise_one_line_errors():
    dp, ids, tp = INST.tensors([[1, 4]])
    with pytest.raises(OtmError, match="target_probs must be"):
        reference_chain(dp, ids, tp[:, :2])
    with pytest.raises(OtmError, match="closeness"):
        random_instance(closeness=1.0)


@pytest.mark.parametrize("suite", [vllm_suite, tileops_suite, transformers_suite])
def test_each_full_suite_passes_the_reference(suite):
    passed, detail = suite(reference_chain, seed=0)
    assert passed, detail


def test_flashinfer_suite_smoke_passes_the_reference():
    """A cheap version of FlashInfer's structural grid (2 batches, V 111 and 1025, L 1 and 3, 2 calls)."""
    passed, detail = flashinfer_suite(reference_chain, seed=0, batches=(1, 99), vocabs=(111, 1025),
                                      lengths=(1, 3), trials=2)
    assert passed, detail


def test_vllm_instance_makes_the_position_bugs_invisible():
    """Why vLLM's test misses residual_wrong_position and bonus_from_last_accepted: on its own instance
    (one target law at every position) both bugs' laws are the target's exactly, while
    recovered_from_target, which it catches, is at TV 0.056."""
    inst = ChainInstance.from_rows(*suite_rows("vllm", 0))
    assert tv_first_tokens("residual_wrong_position", inst) < 1e-12
    assert tv_first_tokens("bonus_from_last_accepted", inst) < 1e-12
    assert tv_first_tokens("recovered_from_target", inst) == pytest.approx(0.0556, abs=5e-4)
    with pytest.raises(OtmError, match="no row instance"):
        suite_rows("flashinfer")


def test_pinned_suite_verdicts():
    """docs/audit.md, seed 0: vLLM's test misses residual_wrong_position (TV 0.52 on instance A: its
    target law is the same at every position, so the wrong row is the right law) which TileOPs'
    catches; transformers' fixed case catches ratio_of_previous_position (TV 0.19) but misses
    bonus_from_last_accepted (TV 0.12); FlashInfer's structural grid catches the bonus bug through its
    one-hot target; no suite catches u_le_ratio (TV 3.8e-8)."""
    bug = CHAIN_BUGS
    assert vllm_suite(bug["residual_wrong_position"].kernel, seed=0)[0]
    assert not tileops_suite(bug["residual_wrong_position"].kernel, seed=0)[0]
    assert not transformers_suite(bug["ratio_of_previous_position"].kernel, seed=0)[0]
    assert transformers_suite(bug["bonus_from_last_accepted"].kernel, seed=0)[0]
    assert not flashinfer_suite(bug["bonus_from_last_accepted"].kernel, seed=0, batches=(1,), vocabs=(111,),
                                lengths=(1,), trials=1)[0]
    for suite in (vllm_suite, tileops_suite, transformers_suite):
        assert suite(bug["u_le_ratio"].kernel, seed=0)[0]


@pytest.mark.research
def test_certify_chain_catches_the_bugs_no_suite_catches():
    """otm certify (layout flashinfer, default settings, seed 0) refutes u_le_ratio by its u = 0 probe
    and tile_edge_recovered_id by its tile-edge probe (id 33 at V = 33 with uniforms 1 - 2^-24),
    which every ported suite misses, and certifies the reference."""
    from otm.certify.chain import certify_chain

    assert certify_chain(reference_chain, layout="flashinfer", seed=0).certified
    for name, case in (("u_le_ratio", "boundary"), ("tile_edge_recovered_id", "tile edges")):
        report = certify_chain(CHAIN_BUGS[name].kernel, layout="flashinfer", seed=0)
        assert not report.certified
        assert [c.name for c in report.cases if not c.passed][0].startswith(case)
