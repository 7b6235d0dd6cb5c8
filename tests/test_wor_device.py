"""The sync-free device set-up of ``otm.torch.kseq_without_replacement`` (``otm.torch._wor_trials``) and the
torch walk of ``otm.torch.optimal_embedded``, run on the CPU through ``otm.torch._rho.FORCE_DEVICE_PATH``.

* The quadrature: the device's E[N_rho] against the host's ``expected_trials`` (same grid start and step,
  relative difference below 1e-12; measured 3e-14) on Dirichlet, peaked, equal and near-disjoint rows.
* Same uniforms, same outcome: the device path (its call counted) gives the host path's (and so numpy's)
  token and index on every row (V = 3-8, k = 1-4, targets with zeros, float32 and float64 rows; V = 49152
  LLM-like rows), and its rho is the host's to 1e-9 (relative; measured at
  most 2.5e-10 on these 160 rows) wherever the host's rho lies below max p/q (above it every rho is valid
  and the host keeps the first it meets).
* Exact law of the real set-up: with the device's rho and E[N_rho] in the rule, the law summed over the
  draft tuples equals the target to 1e-9 (hypothesis: V 2-6, k 1-4, targets with zeros).
* In law: N = 8,000 rows (V = 6, k = 3) through the device path against the exact cells, chi-square at
  ALPHA = 1e-3; planted bug: rho 10% too high with E[N_rho] kept (TV 0.0335), power asserted >= 0.99
  and its samples rejected. The set-up is computed on one row and broadcast (its every operation is
  row-wise: asserted on a mixed batch), as the host path shares one set-up between equal rows.
* ``optimal_embedded``: the torch walk then the iid ``otm.torch.optimal`` give numpy's token and index on
  the same uniforms (negative control: the walk reading the race's uniforms); the exact law of the torch
  walk (every path's box of uniforms, run at its centre, gives that path, and the boxes' volumes are
  ``walk_weights`` to 1e-12; V = 6, k = 1-4; negative control: the unseen mass one step stale).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import otm.torch as ot
from otm.schemes import WithoutReplacement
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.torch import _rho
from otm.torch import _wor_trials as W
from otm.verifiers import kseq_without_replacement as npk
from otm.verifiers import optimal_embedded as npe
from otm.verifiers.embedding import mass_outside, unseen_mass

from test_torch_verifiers import ALPHA, MIN_POWER, TARGET, V, SeqRng, cell_counts, t
from test_wor_torch import LAW_DRAFT, K, numpy_outcome, pair

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", True)


def _rows(rng, size, n, k):
    out = []
    for i in range(n):
        p, q = pair(rng, size, k)
        if i % 4 == 1:
            p = q.copy()  # equal laws: the bounded region
        if i % 4 == 2:
            q = np.r_[1 - 1e-6, np.full(size - 1, 1e-6 / (size - 1))][rng.permutation(size)]  # a dominant draft
        out.append((p, q))
    return np.array([a for a, _ in out]), np.array([b for _, b in out])


@pytest.mark.parametrize("size,k", [(6, 2), (6, 4), (60, 3)])
def test_device_quadrature_is_the_hosts(size, k):
    rng = np.random.default_rng(size + k)
    p, q = _rows(rng, size, 12, k)
    for rho in (1.0, 1.7, 40.0):
        got = W.expected_trials(t(p), t(q), k, torch.full((12,), rho, dtype=torch.float64))
        want = [npk.bounded(p[r], q[r], npk.expected_trials(p[r], q[r], k, rho), rho) for r in range(12)]
        rel = max(abs(float(got.value[r]) - w.value) / w.value for r, w in enumerate(want))
        assert rel < 1e-12, rel


def _counted(monkeypatch, module, name):
    """``module.name`` wrapped to count its calls (a test of the device path must take it)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("size,k,dtype", [(3, 2, torch.float64), (5, 3, torch.float32), (8, 4, torch.float64),
                                          (8, 1, torch.float64)])
def test_device_path_gives_the_host_paths_outcomes(size, k, dtype, device_path, monkeypatch):
    rng = np.random.default_rng(100 * size + k)
    rows = 40
    p, q = _rows(rng, size, rows, k)
    if dtype == torch.float32:  # the float32 rows, upcast exactly: what both paths normalise in float64
        p, q = p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
    d = np.array([WithoutReplacement(q[r], k).sample(rng) for r in range(rows)])
    u = rng.random((rows, 2 * k))
    calls = _counted(monkeypatch, W, "root")
    out = ot.kseq_without_replacement(t(p, dtype), t(q, dtype), torch.as_tensor(d), uniforms=t(u))
    assert calls == [1]  # the device set-up ran
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    for r in range(rows):
        assert (int(out.token[r]), int(out.accepted[r])) == numpy_outcome(p[r], q[r], d[r], u[r]), r
    root = W.root(t(p), t(q), k)
    host = np.array([npk.rule(p[r], q[r], k).rho for r in range(rows)])
    ratio = np.array([np.max(np.where(q[r] > 0, p[r] / np.where(q[r] > 0, q[r], 1), np.where(p[r] > 0, np.inf, 0)))
                      for r in range(rows)])
    below = host < ratio * (1 - 1e-9)
    rel = np.abs(root.rho.numpy() - host) / host
    assert below.sum() >= rows // 2 and rel[below].max() < 1e-9, (rel[below].max(), below.sum())
    assert bool(root.converged.all())


def test_full_vocabulary_rows(device_path, monkeypatch):
    """V = 49152 LLM-like rows (k = 4): the device path's outcomes are numpy's; rows 2, 3 reject every draft."""
    rng = np.random.default_rng(3)
    Vb, k = 49152, 4
    z = rng.standard_normal((2, Vb))
    p = np.exp(8 * (z - z.max(1, keepdims=True)))
    q = np.exp(8 * (0.9 * z + 0.44 * rng.standard_normal((2, Vb))) - 8 * z.max(1, keepdims=True))
    p, q = (p / p.sum(1, keepdims=True))[[0, 1, 0, 1]], (q / q.sum(1, keepdims=True))[[0, 1, 0, 1]]
    d = np.array([WithoutReplacement(q[r], k).sample(rng) for r in range(4)])
    u = rng.random((4, 2 * k))
    u[2:, ::2] = 1 - 2**-53
    calls = _counted(monkeypatch, W, "root")
    out = ot.kseq_without_replacement(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    assert calls == [1]
    for r in range(4):
        assert (int(out.token[r]), int(out.accepted[r])) == numpy_outcome(p[r], q[r], d[r], u[r]), r


def _law_with(p, q, k, rho, trials, scheme):
    rule = npk.TrialsRule(p, q, k, rho, npk.Trials(trials, 0.0, 0), rho, 0)
    return membership_cells(lambda d: npk._law(rule, np.asarray(d), npk.mass_outside(q, np.asarray(d))), scheme, p.size)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 20), min_size=n, max_size=n), st.lists(st.integers(0, 20), min_size=n, max_size=n),
    st.integers(1, 4))))
def test_exact_law_with_the_device_setup(case):
    a, b, k = case
    p, q = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    assume(p.sum() > 0 and (q > 0).sum() >= k)
    p, q = p / p.sum(), q / q.sum()
    r = W.root(t(p[None]), t(q[None]), k)
    cells = _law_with(p, q, k, float(r.rho[0]), float(r.trials[0]), WithoutReplacement(q, k))
    assert np.abs(cells[: p.size] + cells[p.size :] - p).max() < 1e-9
    assert float(r.rho[0]) >= float(r.rho_iid[0]) * (1 - 1e-15)


def test_setup_is_row_wise():
    rng = np.random.default_rng(9)
    p, q = _rows(rng, 7, 6, 3)
    whole = W.root(t(p), t(q), 3)
    for r in range(6):
        one = W.root(t(p[r : r + 1]), t(q[r : r + 1]), 3)
        assert float(one.rho[0]) == float(whole.rho[r]) and float(one.trials[0]) == float(whole.trials[r])


def _shared_root(factor=1.0):
    """``root`` computed on the first row and broadcast (every row is the same law here); ``factor``
    plants the bug: rho scaled, E[N_rho] kept."""
    real = W.root

    def root(p, q, k, steps=None):
        r = real(p[:1], q[:1], k, steps)
        n = p.shape[0]
        return W.Root(*(x.expand(n) for x in (r.rho * factor, r.trials, r.rho_iid, r.converged)))

    return root


def test_law_of_the_device_path_and_a_planted_bug(device_path, monkeypatch):
    n = 8_000
    scheme = WithoutReplacement(LAW_DRAFT, K)
    p0 = membership_cells(lambda d: npk.law(TARGET, LAW_DRAFT, d), scheme, V)
    tuples, probs = scheme.enumerate()
    drafts = torch.as_tensor(tuples[np.random.default_rng(7).choice(len(probs), size=n, p=probs)])
    p, q = t(TARGET).expand(n, V), t(LAW_DRAFT).expand(n, V)
    monkeypatch.setattr(W, "root", _shared_root())
    out = ot.kseq_without_replacement(p, q, drafts, generator=torch.Generator().manual_seed(21))
    assert not chi2_gof(cell_counts(out.token, drafts), p0, alpha=ALPHA).reject
    r = W.Root(*(x[0] for x in _shared_root()(t(TARGET[None]), t(LAW_DRAFT[None]), K)))
    p1 = _law_with(TARGET, LAW_DRAFT, K, float(r.rho) * 1.1, float(r.trials), scheme)
    tv = 0.5 * np.abs(p1 - p0).sum()
    assert 0.01 < tv < 0.05, tv  # 0.0335
    assert chi2_power(n, p0, p1, alpha=ALPHA) >= MIN_POWER
    monkeypatch.setattr(W, "root", _shared_root(1.1))
    bad = ot.kseq_without_replacement(p, q, drafts, generator=torch.Generator().manual_seed(22))
    assert chi2_gof(cell_counts(bad.token, drafts), p0, alpha=ALPHA).reject


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_embedded_walk_then_optimal_gives_numpys_outcomes(k, device_path, monkeypatch):
    rng = np.random.default_rng(700 + k)
    rows, size = 60, 6
    p, q = _rows(rng, size, rows, k)
    d = np.array([WithoutReplacement(q[r], k).sample(rng) for r in range(rows)])
    u = rng.random((rows, 2 * k + 1))
    u[::5, 2 * k - 1] = 1 - 2**-53  # rejections: the residual draw runs
    from otm.torch import _wor

    calls = _counted(monkeypatch, _wor, "embedded_walk")
    # the walk on the device's path, then optimal's host set-up (numpy's rule: its device set-up races other
    # groups, the same law by tests/test_optimal_device.py, other tokens for the same uniforms)
    device_optimal = _wor.optimal

    def host_optimal(*args, **kwargs):
        monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", False)
        try:
            return device_optimal(*args, **kwargs)
        finally:
            monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", True)

    monkeypatch.setattr(_wor, "optimal", host_optimal)
    out = ot.optimal_embedded(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    assert calls == [1]
    for r in range(rows):
        o = npe.sample(p[r], q[r], d[r], SeqRng(u[r]))
        want = (o.token, ot.NOT_ACCEPTED if o.accepted is None else o.accepted)
        assert (int(out.token[r]), int(out.accepted[r])) == want, r
    if k > 1:  # negative control: the walk reading the race's uniforms
        perm = np.r_[k - 1 : 2 * k - 1, 0 : k - 1, 2 * k - 1 : 2 * k + 1]
        bad = ot.optimal_embedded(t(p), t(q), torch.as_tensor(d), uniforms=t(u[:, perm]))
        assert any(int(bad.token[r]) != npe.sample(p[r], q[r], d[r], SeqRng(u[r])).token for r in range(rows))


def _walk_off_by_one(q, d, u):
    """Bug: the walk's new-draft weight is the unseen mass one step stale (``1 - q(A_{m-1})``)."""
    batch, k = d.shape
    q_s = q.gather(1, d)
    avail = (q.sum(-1) - q_s.sum(-1)).unsqueeze(1) + q_s.flip(1).cumsum(1).flip(1)
    cq, cols = q_s.cumsum(1), torch.arange(k)
    m, steps = torch.ones(batch, 1, dtype=torch.int64), [torch.zeros(batch, dtype=torch.int64)]
    for i in range(1, k):
        t = u[:, i - 1 : i] * (cq.gather(1, m - 1) + avail.gather(1, m - 1))
        j = ((cq <= t) & (cols < m)).sum(1)
        steps.append(j)
        m = m + (j.unsqueeze(1) == m).to(torch.int64)
    return torch.stack(steps, dim=1)


def _walk_law_error(walk, q, d):
    """Exact law of a torch walk against :func:`otm.verifiers.optimal_embedded.walk_weights`: every path's
    region of uniforms is a box (step i with m drafts seen splits [0, 1) at the cumulative weights of
    ``(q(s_1)..q(s_m), 1 - q(A_m))``); the walk is run at every box's centre and must give the box's path,
    whose probability is the box's volume. Returns the largest error over the paths (1 for a wrong path)."""
    k = d.size
    q_s = q[d]
    avail = unseen_mass(q_s, mass_outside(q, d))
    paths = npe.walk_paths(k)
    centres, volumes = np.zeros((len(paths), max(k - 1, 1))), np.ones(len(paths))
    for r, path in enumerate(paths):
        m = 1
        for i in range(1, k):
            w = np.append(q_s[:m], avail[m])
            cuts = np.r_[0.0, np.cumsum(w)] / w.sum()
            centres[r, i - 1] = 0.5 * (cuts[path[i]] + cuts[path[i] + 1])
            volumes[r] *= cuts[path[i] + 1] - cuts[path[i]]
            m += path[i] == m
    n = len(paths)
    got = walk(t(q).expand(n, q.size), torch.as_tensor(d).expand(n, k), t(centres[:, : k - 1]))
    if not torch.equal(got, torch.as_tensor(paths.copy())):
        return 1.0
    return float(np.abs(volumes - npe.walk_weights(q_s, mass_outside(q, d))).max())


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_law_of_the_torch_walk(k):
    from otm.torch import _wor

    rng = np.random.default_rng(40 + k)
    for _ in range(5):
        _, q = pair(rng, 6, k)
        d = WithoutReplacement(q, k).sample(rng)
        assert _walk_law_error(_wor.embedded_walk, q, d) < 1e-12
    if k > 2:  # negative control: the stale unseen mass moves the boxes' edges: a centre gives another path
        assert _walk_law_error(_walk_off_by_one, np.array([0.4, 0.3, 0.1, 0.1, 0.05, 0.05]), np.array([0, 1, 2, 3][:k])) > 1e-3
