"""``otm.torch.optimal`` against its numpy twin, and ``otm decode --verifier optimal`` in exact mode.

These are the CPU's host path (numpy set-up); the device path (other devices, or ``_rho.FORCE_DEVICE_PATH``)
is tested in tests/test_optimal_device.py.

* Uniform by uniform: each row takes k + 2 uniforms (k race passes, the accept test, the
  residual draw), in the order the numpy ``sample`` consumes them; with the same numbers,
  torch and numpy give the same token and index on every row (float64; uniforms with exact
  0s and the largest float below 1; targets with zeros; V = 2-8, k = 1-4).
* Law: N = 20,000 rows of one instance (V = 6, k = 3, where the plan uses two passes) through
  one batched call; counts of (token, token is a draft) against the exact numpy cells by the
  calibrated chi-square of :mod:`otm.testing` at ALPHA = 1e-3, float32 and float64. Two planted
  torch bugs with exactly known laws: the selection law used by the accept test and residual
  off by 10% at token 0, and the race ignoring the two passes (theta = 1); the test's power
  against each is asserted >= 0.99 and each bug's samples must be rejected.
* k = 1 is single-draft speculative sampling (same uniforms: same outcome as ``ot.speculative``).
* ``certify(optimal, kind="torch", scheme="iid", k)`` for k = 2, 4.
* The decoder: exact mode with ``verifier="optimal"`` gives the target's law of the first
  T = 3 tokens to 1e-12 (toy LMs: V = 3 with top-k 2, k = 2, 3, L = 1, 2; V = 4, k = 2, L = 1), and its expected depth-1
  acceptance is >= kseq's on the same setting.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import otm.torch as ot
import otm.torch._optimal as topt
from otm.certify import certify
from otm.decode import Sampling
from otm.decode.chance import exact_law_of
from otm.decode.cli import ALL_VERIFIERS
from otm.decode.decoder import VERIFIERS as DECODER_VERIFIERS
from otm.decode.decoder import resolve_verifiers
from otm.decode.exact_mode import exact_decode, law_error, target_law
from otm.decode.toy import ToyLM, model_law
from otm.laws import inverse_cdf
from otm.schemes import IID
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.verifiers import optimal as npo
from otm.verifiers import speculative

from test_torch_verifiers import (  # the shared cases, uniforms and cells of the torch verifier tests
    ALPHA, assert_outcome_meaning, DRAFT, MIN_POWER, N, TARGET, U_MAX, V, SeqRng, cell_counts, t)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

K = 3


def pair(rng, size):
    p, q = rng.dirichlet(np.ones(size) * 0.5), rng.dirichlet(np.ones(size) * 0.5)
    if rng.random() < 0.4:
        p[rng.integers(size)] = 0.0
        p /= p.sum()
    return p, q


# -- uniform by uniform ------------------------------------------------------------------------


@pytest.mark.parametrize("host", [True, False], ids=["host-decisions", "torch-decisions"])
@pytest.mark.parametrize("size", [2, 3, 5, 8])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_same_uniforms_same_outcome_as_numpy(size, k, host, monkeypatch):
    """Both decision paths (numpy, as the host path runs by default; torch ops on the host set-up's arrays)
    give the numpy sampler's token and index for the same uniforms, edges 0 and U_MAX included. The 50
    rows draw their laws from a pool of 8, so rows share a rule with other drafts and uniforms (the
    set-up and the residual draws run per rule over its rows: a row given another row's arrays is seen)."""
    monkeypatch.setattr(topt, "HOST_DECISIONS", host)
    rng = np.random.default_rng(100 * size + k)
    rows = 50
    pool = [pair(rng, size) for _ in range(8)]
    laws = [pool[i] for i in rng.integers(0, len(pool), rows)]
    p = np.array([a for a, _ in laws])
    q = np.array([b for _, b in laws])
    d = np.array([rng.choice(size, size=k, p=q[r]) for r in range(rows)])
    u = rng.random((rows, k + 2))
    edge = np.arange(0, rows, 4)  # the edges 0 and U_MAX in every column in turn: a pass uniform of 0
    u[edge, (edge // 4) % (k + 2)] = 0.0  # must leave a theta = 0 token in pass 2 (u < theta, not <=)
    u[edge + 1, (edge // 4) % (k + 2)] = U_MAX
    out = ot.optimal(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    for r in range(rows):
        o = npo.sample(p[r], q[r], d[r], SeqRng(u[r]))
        want = (o.token, ot.NOT_ACCEPTED if o.accepted is None else o.accepted)
        assert (int(out.token[r]), int(out.accepted[r])) == want, (r, p[r], q[r], d[r], u[r])


def test_k1_is_speculative_sampling():
    rng = np.random.default_rng(7)
    rows = 200
    laws = [pair(rng, 5) for _ in range(rows)]
    p, q = t([a for a, _ in laws]), t([b for _, b in laws])
    d = ot.sample_iid(q, 1, generator=torch.Generator().manual_seed(0))
    u = t(rng.random((rows, 3)))
    a = ot.optimal(p, q, d, uniforms=u)
    b = ot.speculative(p, q, d, uniforms=u[:, 1:])
    # k = 1: the selection law is the draft, so the accept test is speculative sampling's on the same
    # uniform; after a rejection the residual (p - q)_+ is drawn group first, so the same uniform may
    # give another token of the same law
    ok = b.accepted == 0
    assert torch.equal(a.accepted == 0, ok) and torch.equal(a.token[ok], b.token[ok])
    assert 0 < int(ok.sum()) < rows
    z = a.token[~ok, None]
    assert bool((p[~ok].gather(1, z) > q[~ok].gather(1, z)).all())  # in the residual's support
    for r in range(rows):
        want = speculative.law(laws[r][0], laws[r][1], d[r].numpy())
        assert np.abs(npo.law(laws[r][0], laws[r][1], d[r].numpy()) - want).max() < 1e-12


@pytest.mark.parametrize("fill", [0.0, U_MAX])
def test_edges_never_emit_zero_target_tokens(fill):
    p = t([[0.0, 0.6, 0.4, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25] * 4, [0.0, 0.0, 0.0, 1.0]])
    q = t([[0.5, 0.0, 0.0, 0.5], [0.25] * 4, [0.25] * 4, [1.0, 0.0, 0.0, 0.0]])
    d = t([[0, 3, 0], [1, 2, 3], [0, 1, 2], [0, 0, 0]], torch.int64)
    assert_outcome_meaning(p, d, ot.optimal(p, q, d, uniforms=torch.full((4, 5), fill, dtype=torch.float64)))


def test_generator_reproducible_and_shapes():
    p, q = t(TARGET).expand(50, V), t(DRAFT).expand(50, V)
    d = ot.sample_iid(q, K, generator=torch.Generator().manual_seed(0))
    a = ot.optimal(p, q, d, generator=torch.Generator().manual_seed(1))
    b = ot.optimal(p, q, d, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.token, b.token) and torch.equal(a.accepted, b.accepted)
    assert a.token.dtype == a.accepted.dtype == torch.int64 and a.token.shape == (50,)
    with pytest.raises(Exception, match=r"shape \[batch, 5\]"):
        ot.optimal(p, q, d, uniforms=torch.zeros(50, 4, dtype=torch.float64))


# -- in law, with planted bugs -----------------------------------------------------------------


def _x_off(plans):
    """Bug: the selection law used by the accept test and the residual is 10% high at token 0."""

    def wrapped(p, q, d, k):
        theta_d, key1_d, key2_d, target_d, x_d, draws, targets = plans(p, q, d, k)

        def bad_draws(rows, us):
            target = targets(rows)
            res = np.stack([npo.rule(p[r], q[r], k).residual() for r in rows])  # (target - x)_+, honest
            x0 = target[:, 0] - res[:, 0]  # x at token 0 where the residual there is positive
            res[:, 0] = np.where(res[:, 0] > 0, np.maximum(target[:, 0] - 1.1 * x0, 0.0), 0.0)
            return [inverse_cdf(r, u) for r, u in zip(res, us)]

        return theta_d, key1_d, key2_d, target_d, np.where(d == 0, 1.1 * x_d, x_d), bad_draws, targets

    return wrapped


def _one_pass(plans):
    """Bug: the race ignores the two passes (every position in pass 1)."""

    def wrapped(p, q, d, k):
        theta_d, *rest = plans(p, q, d, k)
        return (np.ones_like(theta_d), *rest)

    return wrapped


def _law_x_off(plan):
    x = plan.x.copy()
    x[0] *= 1.1
    return dataclasses.replace(plan, x=x, residual=np.maximum(TARGET - x, 0.0))


BUGS = {"x_off": (_x_off, _law_x_off), "one_pass": (_one_pass, lambda plan: dataclasses.replace(plan, theta=np.ones(V)))}


@pytest.mark.parametrize("device", ["cpu"])  # other devices take the device path: tests/test_optimal_device.py
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_law_matches_numpy_and_catches_planted_bugs(dtype, device, monkeypatch):
    scheme = IID(DRAFT, K)
    plan = npo.build(TARGET, DRAFT, K)
    assert 0 < plan.theta.min() < 1  # two passes in use: the race uniforms matter
    p0 = membership_cells(lambda d: npo.law(TARGET, DRAFT, d), scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    tuples, probs = scheme.enumerate()
    drafts = torch.as_tensor(tuples[np.random.default_rng(5).choice(len(probs), size=N, p=probs)], device=device)
    p, q = t(TARGET, dtype, device).expand(N, V), t(DRAFT, dtype, device).expand(N, V)
    out = ot.optimal(p, q, drafts, generator=torch.Generator(device=device).manual_seed(11))
    member = (drafts == out.token[:, None]).any(1)
    assert torch.equal(out.accepted >= 0, member)
    result = chi2_gof(cell_counts(out.token, drafts), p0, alpha=ALPHA)
    assert not result.reject, str(result)
    for name, (patch, bug_plan) in BUGS.items():
        bad_plan = bug_plan(plan)
        p1 = membership_cells(lambda d: npo._law(bad_plan, TARGET, np.asarray(d)), scheme, V)
        tv = 0.5 * np.abs(p0 - p1).sum()
        assert 0.01 < tv < 0.05, (name, tv)  # realistic sizes: 0.0167 (x off by 10%), 0.0195 (one pass)
        power = chi2_power(N, p0, p1, alpha=ALPHA)
        assert power >= MIN_POWER, f"{name}: power {power:.4f}"
        with monkeypatch.context() as m:
            m.setattr(topt, "_plans", patch(topt._plans))
            bad = ot.optimal(p, q, drafts, generator=torch.Generator(device=device).manual_seed(12))
        control = chi2_gof(cell_counts(bad.token, drafts), p0, alpha=ALPHA)
        assert control.reject, f"{name} not caught: {control}"


# -- registry and certification ----------------------------------------------------------------


def test_registered_everywhere():
    assert ot.VERIFIERS["optimal"] is ot.optimal
    assert exact_law_of(ot.optimal) is npo.law
    assert "optimal" in DECODER_VERIFIERS["iid"] and "optimal" in ALL_VERIFIERS
    root, below, name = resolve_verifiers("optimal", "iid", 3)
    assert root is below is ot.optimal and name == "optimal"


@pytest.mark.parametrize("k", [2, 4])
def test_certified(k):
    report = certify(ot.optimal, kind="torch", scheme="iid", k=k, seed=3)
    assert report.certified, str(report)


# -- the decoder in exact mode -----------------------------------------------------------------

SETTINGS = [  # target, draft, prompt, sampling
    (ToyLM(3, seed=11), ToyLM(3, seed=12), [0, 2], Sampling(temperature=0.9, top_k=2)),
    (ToyLM(4, seed=21), ToyLM(4, seed=22), [1, 3], Sampling(temperature=1.0)),
]
T = 3
CASES = [(0, 2, 1), (0, 2, 2), (0, 3, 1), (0, 3, 2), (1, 2, 1)]  # setting, k, L (V = 4, k = 3 or L = 2: minutes)


def exact_decode_checked(verifier, setting, k, length, scheme):
    """The decoder in exact mode on ``SETTINGS[setting]``: its law of the first T tokens equals the
    target's to 1e-12 and sums to 1; returns the ExactDecode."""
    target, draft, prompt, sampling = SETTINGS[setting]
    reference = target_law(model_law(target, prompt, sampling), T)
    ex = exact_decode(target, draft, prompt, verifier=verifier, max_new_tokens=T, k=k, length=length, scheme=scheme,
                      sampling=sampling)
    assert law_error(ex.law, reference) < 1e-12, (verifier, setting, k, length)
    assert abs(sum(ex.law.values()) - 1) < 1e-12
    return ex


@pytest.mark.parametrize("setting,k,length", CASES)
def test_exact_mode_of_the_decoder_with_optimal(setting, k, length):
    target, draft, prompt, sampling = SETTINGS[setting]
    ex = exact_decode_checked("optimal", setting, k, length, "iid")
    opts = dict(max_new_tokens=T, k=k, length=length, scheme="iid", sampling=sampling)
    ks = exact_decode(target, draft, prompt, verifier="kseq", **opts)
    assert ex.acceptance_by_depth[0] >= ks.acceptance_by_depth[0] - 1e-12, (ex.acceptance_by_depth, ks.acceptance_by_depth)


@pytest.mark.parametrize("host", [True, False], ids=["host-decisions", "torch-decisions"])
def test_batched_rows_of_different_laws_match_numpy_row_by_row(host, monkeypatch):
    """A batch of distinct real-size rows (V = 4000, rows repeated to exercise sharing): same uniforms,
    same outcome as the numpy sampler on each row (the rows' set-ups are solved together), on both
    decision paths."""
    monkeypatch.setattr(topt, "HOST_DECISIONS", host)
    rng = np.random.default_rng(21)
    V, k, rows = 4000, 4, 12
    z = rng.standard_normal((4, V)) * 3.0
    p = np.exp(z - z.max(1, keepdims=True))
    q = np.exp(z + rng.standard_normal((4, V)) - z.max(1, keepdims=True))
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    pick = np.array([0, 1, 2, 3, 0, 1, 2, 3, 3, 2, 1, 0])
    p, q = p[pick], q[pick]
    d = np.array([rng.choice(V, size=k, p=q[r]) for r in range(rows)])
    u = rng.random((rows, k + 2))
    u[::3, k] = U_MAX  # many rejections: the residual path runs on a subset of rows
    out = ot.optimal(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    assert bool((out.accepted == ot.NOT_ACCEPTED).any())  # some rows went through the residual draw
    for r in range(rows):
        o = npo.sample(p[r], q[r], d[r], SeqRng(u[r]))
        want = (o.token, ot.NOT_ACCEPTED if o.accepted is None else o.accepted)
        assert (int(out.token[r]), int(out.accepted[r])) == want, r
