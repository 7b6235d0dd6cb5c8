"""``otm.torch.kseq_without_replacement`` and ``otm.torch.optimal_embedded`` against their numpy twins, and
the decoder with them in exact mode.

* Uniform by uniform: each row takes 2k uniforms (test of draft m: 2m; the repeat phase after it:
  2m + 1; the residual draw: 2k - 1), in the order the numpy ``sample`` consumes them; with the same
  numbers torch and numpy give the same token and index on every row (float64; uniforms with exact
  0s and the largest float below 1; targets with zeros; V = 3-8, k = 1-4; and V = 49152 rows).
* Law: N = 20,000 rows of one instance (V = 6, k = 3) through one batched call; counts of (token,
  token is a draft) against the exact numpy cells by the calibrated chi-square of :mod:`otm.testing`
  at ALPHA = 1e-3, float32 and float64. Planted torch bug with an exactly known law: the repeat
  phase reads the uniform of the next test (uniform 2m + 2 instead of 2m + 1: the two decisions
  become dependent; TV 0.0207 of the cells); its power is asserted >= 0.99 (1 - 1e-12) and its
  samples must be rejected.
* Registry, certification (``certify(..., kind="torch")``) and the decoder's exact mode: the law of
  the first T = 3 tokens equals the target's to 1e-12.
* ``optimal_embedded``: its decisions run through the numpy sampler itself, so the tests check the
  wiring: the uniforms' order and the rows (same uniforms, same outcome as ``optimal_embedded.sample``
  on rows of different laws), the law (chi-square as above; negative control: the iid ``optimal`` rule
  on the same drafts, TV 0.188), registry, certification and the decoder's exact mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import otm.torch as ot
import otm.torch._wor as twor
from otm.certify import certify
from otm.decode.chance import exact_law_of
from otm.decode.cli import ALL_VERIFIERS
from otm.decode.decoder import VERIFIERS as DECODER_VERIFIERS
from otm.decode.decoder import resolve_verifiers
from otm.decode.exact_mode import exact_decode, law_error, target_law
from otm.decode.toy import model_law
from otm.schemes import WithoutReplacement
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.verifiers import kseq_without_replacement as npk
from otm.verifiers import optimal as npo
from otm.verifiers import optimal_embedded as npe

from test_kseq_without_replacement import _given_stale  # the rule's planted off-by-one
from test_optimal_torch import SETTINGS, T, exact_decode_checked  # the decoder's exact mode on the toy settings
from test_torch_verifiers import (  # the shared cases, uniforms and cells of the torch verifier tests
    ALPHA, DEVICES, assert_outcome_meaning, MIN_POWER, N, TARGET, U_MAX, V, SeqRng, cell_counts, t)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

K = 3
LAW_DRAFT = np.array([0.4, 0.2, 0.1, 0.1, 0.1, 0.1])  # a heavier first token than the shared DRAFT: repeat phases matter


def pair(rng, size, k):
    while True:
        p, q = rng.dirichlet(np.ones(size) * 0.5), rng.dirichlet(np.ones(size) * 0.5)
        if rng.random() < 0.4:
            p[rng.integers(size)] = 0.0
            p /= p.sum()
        if rng.random() < 0.3:  # a dominant draft token: long repeat phases
            q = np.r_[0.9, np.full(size - 1, 0.1 / (size - 1))][rng.permutation(size)]
        if (q > 0).sum() >= k:
            return p, q


def numpy_outcome(p, q, d, u):
    o = npk.sample(p, q, d, SeqRng(u))
    return o.token, ot.NOT_ACCEPTED if o.accepted is None else o.accepted


# -- uniform by uniform ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [3, 5, 8])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_same_uniforms_same_outcome_as_numpy(size, k):
    if k >= size:
        pytest.skip("k distinct drafts need k < V here")
    rng = np.random.default_rng(100 * size + k)
    rows = 40
    laws = [pair(rng, size, k) for _ in range(rows)]
    p = np.array([a for a, _ in laws])
    q = np.array([b for _, b in laws])
    d = np.array([WithoutReplacement(q[r], k).sample(rng) for r in range(rows)])
    u = rng.random((rows, 2 * k))
    edge = np.arange(0, rows, 4)  # the edges 0 and U_MAX in every column in turn
    u[edge, (edge // 4) % (2 * k)] = 0.0
    u[edge + 1, (edge // 4) % (2 * k)] = U_MAX
    out = ot.kseq_without_replacement(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    kinds = set()
    for r in range(rows):
        want = numpy_outcome(p[r], q[r], d[r], u[r])
        got = (int(out.token[r]), int(out.accepted[r]))
        assert got == want, (r, p[r], q[r], d[r], u[r])
        kinds.add(got[1] == ot.NOT_ACCEPTED)
    assert kinds == {True, False} or k == 1 or size == 3  # both accepted and residual rows were met


def test_full_vocabulary_rows_match_numpy():
    rng = np.random.default_rng(3)
    Vb, k, rows = 49152, 4, 4
    z = rng.standard_normal((2, Vb))
    p = np.exp(8 * (z - z.max(1, keepdims=True)))
    q = np.exp(8 * (0.9 * z + 0.44 * rng.standard_normal((2, Vb))) - 8 * z.max(1, keepdims=True))
    p, q = (p / p.sum(1, keepdims=True))[[0, 1, 0, 1]], (q / q.sum(1, keepdims=True))[[0, 1, 0, 1]]
    d = np.array([WithoutReplacement(q[r], k).sample(rng) for r in range(rows)])
    u = rng.random((rows, 2 * k))
    u[2:, ::2] = U_MAX  # rows 2, 3: every test rejects
    out = ot.kseq_without_replacement(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    for r in range(rows):
        assert (int(out.token[r]), int(out.accepted[r])) == numpy_outcome(p[r], q[r], d[r], u[r])


@pytest.mark.parametrize("fill", [0.0, U_MAX])
def test_edges_never_emit_zero_target_tokens(fill):
    p = t([[0.0, 0.6, 0.4, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25] * 4, [0.0, 0.0, 0.0, 1.0]])
    q = t([[0.5, 0.0, 0.1, 0.4], [0.25] * 4, [0.25] * 4, [0.5, 0.3, 0.2, 0.0]])
    d = t([[0, 3, 2], [1, 2, 3], [0, 1, 2], [0, 1, 2]], torch.int64)
    assert_outcome_meaning(p, d, ot.kseq_without_replacement(p, q, d, uniforms=torch.full((4, 6), fill, dtype=torch.float64)))


def test_bad_input():
    p, q = t([[0.5, 0.3, 0.2]]), t([[0.2, 0.2, 0.6]])
    with pytest.raises(Exception, match="distinct drafts"):
        ot.kseq_without_replacement(p, q, t([[1, 1]], torch.int64))
    with pytest.raises(Exception, match=r"shape \[batch, 4\]"):
        ot.kseq_without_replacement(p, q, t([[1, 2]], torch.int64), uniforms=torch.zeros(1, 3, dtype=torch.float64))


# -- in law, with a planted bug ------------------------------------------------------------------


def _phase_reads_next_uniform(fn):
    """Bug: the repeat phase after draft m reads uniform 2m + 2 (the next test's) instead of 2m + 1."""

    def wrapped(target, draft, drafts, *, generator=None, **kw):
        k = drafts.shape[1]
        u = torch.rand(drafts.shape[0], 2 * k, dtype=torch.float64, generator=generator, device=drafts.device)
        u[:, 1 : 2 * k - 2 : 2] = u[:, 2 : 2 * k - 1 : 2]
        return fn(target, draft, drafts, uniforms=u, **kw)

    return wrapped


def _law_phase_reads_next_uniform(rl, d, rest):
    """The bug's exact law given S: a repeat phase with uniform v (accept repeat j iff v falls in its
    cell) followed by the test of the next draft with the SAME v (accept iff v q < b)."""
    q_s = rl.draft[d]
    b = np.minimum(q_s, rl.target[d] / rl.rho)
    avail = npk.unseen_mass(q_s, rest)
    k = d.size
    acc, surv = np.zeros(k), 1.0
    a0 = b[0] / q_s[0]
    acc[0] += a0
    surv = 1.0 - a0
    for m in range(k - 1):
        w = np.append(b[: m + 1], avail[m + 1])
        cuts = np.cumsum(w) / w.sum()  # v < cuts[j] (and >= cuts[j-1]): repeat j; v >= cuts[m]: new draft
        a_next = b[m + 1] / q_s[m + 1]  # the next test accepts iff v < a_next
        lo = 0.0
        for j in range(m + 1):
            acc[j] += surv * (cuts[j] - lo)
            lo = cuts[j]
        # the new draft is reached iff v >= cuts[m]; it is accepted iff also v < a_next
        acc[m + 1] += surv * max(0.0, a_next - cuts[m])
        surv *= 1.0 - max(cuts[m], a_next)
    return acc, surv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_law_matches_numpy_and_catches_a_planted_bug(dtype, device, monkeypatch):
    scheme = WithoutReplacement(LAW_DRAFT, K)
    p0 = membership_cells(lambda d: npk.law(TARGET, LAW_DRAFT, d), scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    tuples, probs = scheme.enumerate()
    drafts = torch.as_tensor(tuples[np.random.default_rng(5).choice(len(probs), size=N, p=probs)], device=device)
    p, q = t(TARGET, dtype, device).expand(N, V), t(LAW_DRAFT, dtype, device).expand(N, V)
    out = ot.kseq_without_replacement(p, q, drafts, generator=torch.Generator(device=device).manual_seed(11))
    member = (drafts == out.token[:, None]).any(1)
    assert torch.equal(out.accepted >= 0, member)
    result = chi2_gof(cell_counts(out.token, drafts), p0, alpha=ALPHA)
    assert not result.reject, str(result)
    with monkeypatch.context() as m:
        m.setattr(npk, "_given", _law_phase_reads_next_uniform)
        p1 = membership_cells(npk.bind(TARGET, scheme).law, scheme, V)
    tv = 0.5 * np.abs(p0 - p1).sum()
    assert 0.01 < tv < 0.05, tv  # 0.0207
    assert chi2_power(N, p0, p1, alpha=ALPHA) >= MIN_POWER
    bad = _phase_reads_next_uniform(ot.kseq_without_replacement)(p, q, drafts, generator=torch.Generator(device=device).manual_seed(12))
    control = chi2_gof(cell_counts(bad.token, drafts), p0, alpha=ALPHA)
    assert control.reject, str(control)


# -- registry, certification, the decoder ---------------------------------------------------------


def test_registered_everywhere():
    assert ot.VERIFIERS["kseq_without_replacement"] is ot.kseq_without_replacement is twor.kseq_without_replacement
    assert exact_law_of(ot.kseq_without_replacement) is npk.law
    assert "kseq_without_replacement" in DECODER_VERIFIERS["without_replacement"]
    assert "kseq_without_replacement" in ALL_VERIFIERS
    root, below, name = resolve_verifiers("kseq_without_replacement", "without_replacement", 3)
    assert root is ot.kseq_without_replacement and below is ot.speculative


@pytest.mark.parametrize("k", [2, 3])
def test_certified(k):
    report = certify(ot.kseq_without_replacement, kind="torch", scheme="without_replacement", k=k, seed=3)
    assert report.certified, str(report)


@pytest.mark.parametrize("setting,k,length", [(0, 2, 1), (0, 2, 2), (1, 2, 2), (1, 3, 1)])
def test_exact_mode_of_the_decoder(setting, k, length):
    exact_decode_checked("kseq_without_replacement", setting, k, length, "without_replacement")


def test_exact_mode_of_the_decoder_catches_the_stale_unseen_mass(monkeypatch):
    """Negative control: the rule's off-by-one (the repeat phase reading 1 - q(A_{m-1}), TV 0.0289 in the
    sampler test) planted in the law the decoder's exact mode enumerates: the decoder's law of the first
    T tokens moves off the target's by more than 1e-3."""
    target, draft, prompt, sampling = SETTINGS[1]
    reference = target_law(model_law(target, prompt, sampling), T)
    monkeypatch.setattr(npk, "_given", _given_stale)
    ex = exact_decode(target, draft, prompt, verifier="kseq_without_replacement", max_new_tokens=T, k=3, length=1,
                      scheme="without_replacement", sampling=sampling)
    assert law_error(ex.law, reference) > 1e-3


# -- optimal_embedded ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_embedded_same_uniforms_same_outcome_as_numpy(k):
    rng = np.random.default_rng(500 + k)
    rows, size = 200, 6
    pool = [pair(rng, size, k) for _ in range(6)]  # rows share rules: the per-rule batched sampler over its rows
    laws = [pool[i] for i in rng.integers(0, len(pool), rows)]
    p = np.array([a for a, _ in laws])
    q = np.array([b for _, b in laws])
    d = np.array([WithoutReplacement(q[r], k).sample(rng) for r in range(rows)])
    u = rng.random((rows, 2 * k + 1))
    u[::5, 2 * k - 1] = U_MAX  # rejections: the residual draw runs
    out = ot.optimal_embedded(t(p), t(q), torch.as_tensor(d), uniforms=t(u))
    for r in range(rows):
        o = npe.sample(p[r], q[r], d[r], SeqRng(u[r]))
        want = (o.token, ot.NOT_ACCEPTED if o.accepted is None else o.accepted)
        assert (int(out.token[r]), int(out.accepted[r])) == want, (r, p[r], q[r], d[r], u[r])
    assert bool((out.accepted == ot.NOT_ACCEPTED).any()) or k == 1
    if k > 1:  # negative control: a wiring bug (the race reading the walk's uniforms first) is seen
        perm = np.r_[k - 1 : 2 * k - 1, 0 : k - 1, 2 * k - 1 : 2 * k + 1]
        bad = ot.optimal_embedded(t(p), t(q), torch.as_tensor(d), uniforms=t(u[:, perm]))
        want = [npe.sample(p[r], q[r], d[r], SeqRng(u[r])) for r in range(rows)]
        assert any(int(bad.token[r]) != w.token for r, w in enumerate(want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedded_law_matches_numpy(dtype):
    scheme = WithoutReplacement(LAW_DRAFT, K)
    p0 = membership_cells(lambda d: npe.law(TARGET, LAW_DRAFT, d), scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    tuples, probs = scheme.enumerate()
    drafts = torch.as_tensor(tuples[np.random.default_rng(6).choice(len(probs), size=N, p=probs)])
    p, q = t(TARGET, dtype).expand(N, V), t(LAW_DRAFT, dtype).expand(N, V)
    out = ot.optimal_embedded(p, q, drafts, generator=torch.Generator().manual_seed(13))
    assert torch.equal(out.accepted >= 0, (drafts == out.token[:, None]).any(1))
    result = chi2_gof(cell_counts(out.token, drafts), p0, alpha=ALPHA)
    assert not result.reject, str(result)
    # negative control: the iid optimal rule run on these drafts as if they were iid (the walk forgotten),
    # TV 0.188; the subtle bugs of the shared sampler (the walk's off-by-one, TV 0.0295) are planted in
    # tests/test_optimal_embedded.py, and the wiring (uniform order, rows) by the same-uniforms test above
    p1 = membership_cells(lambda d: npo.law(TARGET, LAW_DRAFT, d), scheme, V)
    assert 0.1 < 0.5 * np.abs(p1 - p0).sum() < 0.3 and chi2_power(N, p0, p1, alpha=ALPHA) >= MIN_POWER
    bad = ot.optimal(p, q, drafts, generator=torch.Generator().manual_seed(14))
    assert chi2_gof(cell_counts(bad.token, drafts), p0, alpha=ALPHA).reject


def test_embedded_registered_certified_and_exact_in_the_decoder():
    assert ot.VERIFIERS["optimal_embedded"] is ot.optimal_embedded is twor.optimal_embedded
    assert exact_law_of(ot.optimal_embedded) is npe.law
    assert "optimal_embedded" in DECODER_VERIFIERS["without_replacement"] and "optimal_embedded" in ALL_VERIFIERS
    report = certify(ot.optimal_embedded, kind="torch", scheme="without_replacement", k=2, seed=3)
    assert report.certified, str(report)
    for k, length in ((2, 1), (2, 2)):
        exact_decode_checked("optimal_embedded", 0, k, length, "without_replacement")
