"""The batched torch verifiers against their numpy twins: in law, uniform by uniform, and at the edges.

* Law: for each verifier, N = 20,000 rows of one instance (V = 6) go through one
  batched call; the counts of (output token, output is a draft) are compared with
  the exact cell probabilities of the numpy ``law()`` by the calibrated chi-square
  test of :mod:`otm.testing` at ALPHA = 1e-3. Each verifier has a planted torch bug
  whose exact law is known; the test's power against it is asserted >= 0.99 and
  the bug's samples must be rejected by the same test (negative control). Run in
  float32 and float64, and through the two-level (block) inverse CDF.
* Uniform by uniform: with the same uniforms, torch and numpy pick the same token
  and index. In float64 they agree on every row; in float32 the rows where they
  differ are counted and each one is shown to be a boundary case: moving one
  uniform by at most 1e-5 makes numpy give torch's answer.
* Edges: zero and point masses, identical and disjoint laws, all uniforms 0.0 or
  the largest float below 1: a token of zero target mass is never emitted, and
  ``accepted`` always names a draft equal to the token. bf16/fp16 inputs give
  exactly what their float32 upcast gives.
* rho*: equal to numpy's to 1e-9 (float64) / 1e-5 (float32) on random rows up to
  V = 49,152, and to the exact root (rational arithmetic) on degenerate rows, where
  numpy's own error is reported.

Seeds are fixed, so outcomes are reproducible on a given device.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import otm.torch as ot
from otm.laws import OtmError
from otm.schemes import IID, Greedy, SpecHub, WithoutReplacement
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.torch import _core, _rho
from otm.verifiers import greedy as np_greedy
from otm.verifiers import kseq as np_kseq
from otm.verifiers import rrs as np_rrs
from otm.verifiers import rrs_without_replacement as np_rrsw
from otm.verifiers import spechub as np_spechub
from otm.verifiers import speculative as np_speculative
from otm.verifiers.base import positive_part

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
N = 20_000
ALPHA = 1e-3
MIN_POWER = 0.99
TARGET = np.array([0.35, 0.05, 0.3, 0.1, 0.2, 0.0])
DRAFT = np.array([0.1, 0.3, 0.1, 0.25, 0.1, 0.15])
V = TARGET.size
U_MAX = 1.0 - 2.0**-53  # the largest float64 below 1

NUMPY = {
    "speculative": np_speculative,
    "kseq": np_kseq,
    "rrs": np_rrs,
    "rrs_without_replacement": np_rrsw,
    "greedy": np_greedy,
    "spechub": np_spechub,
}
SCHEME = {
    "speculative": lambda q, k: IID(q, 1),
    "kseq": IID,
    "rrs": IID,
    "rrs_without_replacement": WithoutReplacement,
    "greedy": Greedy,
    "spechub": lambda q, k: SpecHub(q),
}
LAW_K = {"speculative": 1, "kseq": 3, "rrs": 2, "rrs_without_replacement": 3, "greedy": 3, "spechub": 2}


class SeqRng:
    """Hands out given uniforms in order, as ``rng.random()`` / ``rng.random(n)`` would."""

    def __init__(self, values):
        self.values, self.used = [float(v) for v in values], 0

    def random(self, size=None):
        if size is None:
            self.used += 1
            return self.values[self.used - 1]
        out = np.array(self.values[self.used : self.used + size])
        self.used += size
        return out


def numpy_uniforms(name: str, u: np.ndarray) -> np.ndarray:
    """The numpy sampler's sequence of uniforms for a torch row of ``k + 1`` uniforms."""
    k = u.size - 1
    return u[k - 1 :] if name == "greedy" else u  # greedy tests only its last draft (uniform k-1)


def numpy_outcome(name, target, draft, drafts, u):
    o = NUMPY[name].sample(target, draft, drafts, SeqRng(numpy_uniforms(name, u)))
    return o.token, ot.NOT_ACCEPTED if o.accepted is None else o.accepted


def t(x, dtype=torch.float64, device="cpu"):
    return torch.as_tensor(np.asarray(x), device=device).to(dtype)


def assert_outcome_meaning(target: torch.Tensor, drafts: torch.Tensor, out) -> None:
    """No token of zero target mass; ``accepted`` names a draft exactly when the token is one, and that draft."""
    assert bool((target.gather(1, out.token[:, None])[:, 0] > 0).all())
    hit = out.accepted >= 0
    assert torch.equal(hit, (drafts == out.token[:, None]).any(1))
    assert torch.equal(drafts[hit].gather(1, out.accepted[hit, None])[:, 0], out.token[hit])


# -- law: chi-square against the exact numpy law, with planted torch bugs ---------------------


def exact_cells(law_of, scheme) -> np.ndarray:
    """Exact P(output = y, output in drafts) for the 2V cells (y, member)."""
    return membership_cells(law_of, scheme, V)


def draw_tuples(scheme, n, seed) -> np.ndarray:
    tuples, probs = scheme.enumerate()
    return tuples[np.random.default_rng(seed).choice(len(probs), size=n, p=probs)]


def bug_speculative(target, draft, drafts, *, generator, dtype):
    """Resamples the target instead of the residual (p - q)_+ after a rejection."""
    p, q = t(target, dtype).expand(len(drafts), V), t(draft, dtype).expand(len(drafts), V)
    u = torch.rand(len(drafts), 2, dtype=torch.float64, generator=generator)
    x = drafts[:, 0]
    accept = u[:, 0] * q.gather(1, drafts)[:, 0].double() < p.gather(1, drafts)[:, 0].double()
    y = _core.categorical(p, u[:, 1:])[:, 0]
    return torch.where(accept, x, y)


def law_bug_speculative(target, scheme):
    def law(d):
        x = d[0]
        a = min(1.0, target[x] / scheme.draft[x])
        out = (1 - a) * target
        out[x] += a
        return out

    return law


def bug_kseq(target, draft, drafts, *, generator, dtype):
    """K-SEQ with rho = 1: every draft accepted with min(1, p/q) (invalid for k >= 2)."""
    n = len(drafts)
    return ot.kseq(t(target, dtype).expand(n, V), t(draft, dtype).expand(n, V), drafts, generator=generator, rho=1.0).token


def law_bug_kseq(target, scheme):
    return lambda d: np_kseq.law(target, scheme.draft, d, rho=1.0)


def bug_rrs(target, draft, drafts, *, generator, dtype):
    """RRS that never updates the residual: every draft is tested against the target."""
    n, k = drafts.shape
    p, q = t(target, dtype).expand(n, V), t(draft, dtype).expand(n, V)
    u = torch.rand(n, k + 1, dtype=torch.float64, generator=generator)
    accept = u[:, :k] * q.gather(1, drafts).double() < p.gather(1, drafts).double()
    first = accept.to(torch.uint8).argmax(-1, keepdim=True)
    y = _core.categorical((p - q).clamp_min(0), u[:, k:])[:, 0]
    return torch.where(accept.any(-1), drafts.gather(1, first)[:, 0], y)


def law_bug_rrs(target, scheme):
    def law(d):
        out, stay = np.zeros(V), 1.0
        for x in d:
            a = min(1.0, target[x] / scheme.draft[x])
            out[x] += stay * a
            stay *= 1 - a
        res = positive_part(target - scheme.draft)
        return out + stay * res / res.sum()

    return law


def bug_rrs_without_replacement(target, draft, drafts, *, generator, dtype):
    """Forgets to remove the rejected draft from q: RRS with replacement on distinct drafts."""
    n = len(drafts)
    return ot.rrs(t(target, dtype).expand(n, V), t(draft, dtype).expand(n, V), drafts, generator=generator).token


def law_bug_rrs_without_replacement(target, scheme):
    return lambda d: np_rrs.law(target, scheme.draft, d)


def bug_greedy(target, draft, drafts, *, generator, dtype):
    """Tests the last draft against the full draft law q instead of q' (the law it was drawn from)."""
    n, k = drafts.shape
    p, q = t(target, dtype).expand(n, V), t(draft, dtype).expand(n, V)
    u = torch.rand(n, 2, dtype=torch.float64, generator=generator)
    x = drafts[:, k - 1 :]
    accept = u[:, 0] * q.gather(1, x)[:, 0].double() < p.gather(1, x)[:, 0].double()
    y = _core.categorical((p - q).clamp_min(0), u[:, 1:])[:, 0]
    return torch.where(accept, x[:, 0], y)


def law_bug_greedy(target, scheme):
    def law(d):
        x = d[-1]
        a = min(1.0, target[x] / scheme.draft[x])
        res = positive_part(target - scheme.draft)
        out = (1 - a) * res / res.sum()
        out[x] += a
        return out

    return law


def bug_spechub(target, draft, drafts, *, generator, dtype):
    """Ignores the order of the pair: always verifies as if the hub came second."""
    n = len(drafts)
    hub = int(np.argmax(draft))
    swapped = torch.where((drafts[:, :1] == hub), drafts.flip(1), drafts)
    return ot.spechub(t(target, dtype).expand(n, V), t(draft, dtype).expand(n, V), swapped, generator=generator).token


def law_bug_spechub(target, scheme):
    def law(d):
        d = d[::-1].copy() if d[0] == scheme.hub else d
        return np_spechub.law(target, scheme.draft, d)

    return law


BUGS = {
    "speculative": (bug_speculative, law_bug_speculative),
    "kseq": (bug_kseq, law_bug_kseq),
    "rrs": (bug_rrs, law_bug_rrs),
    "rrs_without_replacement": (bug_rrs_without_replacement, law_bug_rrs_without_replacement),
    "greedy": (bug_greedy, law_bug_greedy),
    "spechub": (bug_spechub, law_bug_spechub),
}


def cell_counts(token: torch.Tensor, drafts: torch.Tensor) -> np.ndarray:
    token, drafts = token.cpu().numpy(), drafts.cpu().numpy()
    member = (drafts == token[:, None]).any(1)
    return np.bincount(token + V * member, minlength=2 * V).astype(float)


@pytest.fixture
def block_cdf(monkeypatch):
    """Send every inverse-CDF draw through the two-level (block) path, with blocks of 4 tokens."""
    monkeypatch.setattr(_core, "CDF_DIRECT_MAX", 0)
    monkeypatch.setattr(_core, "CDF_BLOCK", 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(NUMPY))
def test_law_matches_numpy_and_catches_planted_bug(name, dtype, device):
    run_law_test(name, dtype, device)


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_law_through_block_cdf(name, block_cdf):
    run_law_test(name, torch.float32, "cpu")


def run_law_test(name, dtype, device):
    scheme = SCHEME[name](DRAFT, LAW_K[name])
    bug, bug_law = BUGS[name]
    p0 = exact_cells(lambda d: NUMPY[name].law(TARGET, DRAFT, d), scheme)
    p1 = exact_cells(bug_law(TARGET, scheme), scheme)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12  # the exact law marginalises to the target
    assert np.abs(p1[:V] + p1[V:] - TARGET).max() > 1e-3  # the bug's does not
    power = chi2_power(N, p0, p1, alpha=ALPHA)
    assert power >= MIN_POWER, f"{name}: power {power:.4f} against the planted bug"

    drafts = torch.as_tensor(draw_tuples(scheme, N, seed=5), device=device)
    gen = torch.Generator(device=device).manual_seed(11)
    out = ot.VERIFIERS[name](t(TARGET, dtype, device).expand(N, V), t(DRAFT, dtype, device).expand(N, V), drafts, generator=gen)
    assert out.token.dtype == out.accepted.dtype == torch.int64 and out.token.shape == (N,)
    # membership meaning of `accepted`: a draft index exactly when the token is a draft
    member = (drafts == out.token[:, None]).any(1)
    assert torch.equal(out.accepted >= 0, member)
    hit = out.accepted >= 0
    assert torch.equal(drafts[hit].gather(1, out.accepted[hit, None])[:, 0], out.token[hit])
    result = chi2_gof(cell_counts(out.token, drafts), p0, alpha=ALPHA)
    assert not result.reject, f"{name}: {result}"

    bad = bug(TARGET, DRAFT, drafts, generator=torch.Generator(device=device).manual_seed(12), dtype=dtype)
    control = chi2_gof(cell_counts(bad, drafts), p0, alpha=ALPHA)
    assert control.reject, f"{name} planted bug not caught: {control}"


# -- uniform by uniform against numpy -----------------------------------------------------


def random_law(rng, size):
    kind = rng.integers(4)
    x = rng.random(size)
    if kind == 1:
        x[rng.random(size) < 0.4] = 0.0
    elif kind == 2:
        x = np.where(rng.random(size) < 0.3, rng.choice([1e-12, 1e-10, 1e-9, 1e-7], size), x)
    elif kind == 3:
        x = rng.dirichlet(np.full(size, 0.2))
    if not x.sum() > 0:
        x[rng.integers(size)] = 1.0
    return x / x.sum()


def random_pair(rng, size):
    """(target, draft, kind): random laws with zeros and tiny masses, and the edge kinds."""
    kind = rng.choice(["random"] * 4 + ["identical", "disjoint", "point_target", "point_draft"])
    target, draft = random_law(rng, size), random_law(rng, size)
    if kind == "identical":
        draft = target.copy()
    elif kind == "disjoint":
        cut = int(rng.integers(1, size))
        target = np.concatenate([random_law(rng, cut), np.zeros(size - cut)])
        draft = np.concatenate([np.zeros(cut), random_law(rng, size - cut)])
    elif kind == "point_target":
        target = np.eye(size)[rng.integers(size)]
    elif kind == "point_draft":
        draft = np.eye(size)[rng.integers(size)]
    return target, draft, kind


def batch_of_instances(name, size, k, rows, rng):
    """Rows of (target, draft, drafts, uniforms, kind) whose scheme exists, uniforms with exact 0s and maxima."""
    targets, drafts_, tuples, kinds = [], [], [], []
    while len(targets) < rows:
        target, draft, kind = random_pair(rng, size)
        try:
            scheme = SCHEME[name](draft, k)
        except OtmError:
            continue  # e.g. fewer than k tokens of positive draft mass
        targets.append(target)
        drafts_.append(draft)
        tuples.append(scheme.sample(rng))
        kinds.append(kind)
    u = rng.random((rows, k + 1))
    u[rng.random(u.shape) < 0.1] = 0.0
    u[rng.random(u.shape) < 0.05] = U_MAX
    return np.array(targets), np.array(drafts_), np.array(tuples), u, np.array(kinds)


def explained_by_a_nudge(name, target, draft, drafts, u, wanted, step=1e-5) -> bool:
    """Does moving one uniform by at most ``step`` make numpy give ``wanted``?

    Or, for K-SEQ's residual draw, does ``wanted`` carry a rounding-level residual mass
    (<= 1e-12 of the residual): at rho*(1 + SAFETY) the exact residual is ~1e-14 p on the
    tokens with p < rho q, which float64 numpy may round to 0 and the torch search keeps.
    """
    if name == "kseq" and wanted[1] == ot.NOT_ACCEPTED:
        res = NUMPY[name]._residual(target, draft, len(drafts), NUMPY[name].rho_star(target, draft, len(drafts)))
        if res[wanted[0]] <= 1e-12 * res.sum() and target[wanted[0]] > 0:
            v = u.copy()
            v[-1] = min(v[-1] + step, U_MAX)  # the token after the rounding-level one is numpy's
            if numpy_outcome(name, target, draft, drafts, v) == numpy_outcome(name, target, draft, drafts, u):
                return True
    for j in range(u.size):
        for s in (-step, step):
            v = u.copy()
            v[j] = min(max(v[j] + s, 0.0), U_MAX)
            if numpy_outcome(name, target, draft, drafts, v) == wanted:
                return True
    return False


SHAPES = [(2, 1), (3, 2), (5, 3), (8, 4), (6, 2)]


def compare_with_numpy(name, dtype, seed, rows=60):
    """Per row: (numpy outcome, torch outcome, row data) over several V and k."""
    rng = np.random.default_rng(seed)
    out = []
    for size, k in SHAPES:
        k = {"speculative": 1, "spechub": 2}.get(name, k)
        if name == "greedy" and k > size - 1:
            continue
        target, draft, drafts, u, kinds = batch_of_instances(name, size, k, rows, rng)
        got = ot.VERIFIERS[name](t(target, dtype), t(draft, dtype), torch.as_tensor(drafts), uniforms=t(u))
        for i in range(rows):
            want = numpy_outcome(name, target[i], draft[i], drafts[i], u[i])
            out.append((want, (int(got.token[i]), int(got.accepted[i])), (target[i], draft[i], drafts[i], u[i], kinds[i])))
    return out


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_same_uniforms_same_outcome_float64(name):
    rows = compare_with_numpy(name, torch.float64, seed=1)
    mismatches = [(w, g, data) for w, g, data in rows if w != g]
    # the only float64 differences allowed: K-SEQ rows where numpy's rho* is off by its
    # cancellation on flat g (identical or nearly point laws, see otm.torch._rho), and only
    # at uniforms within 1e-5 of the moved threshold
    for want, got, (target, draft, drafts, u, kind) in mismatches:
        assert name == "kseq" and kind != "random", (name, kind, want, got, target, draft, drafts, u)
        assert explained_by_a_nudge(name, target, draft, drafts, u, got), (want, got, target, draft, drafts, u)
    assert len(mismatches) <= 0.01 * len(rows)
    random_rows = [r for r in rows if r[2][4] == "random"]
    assert len(random_rows) > 50 and all(w == g for w, g, _ in random_rows)


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_same_uniforms_same_outcome_float32_up_to_boundaries(name):
    rows = compare_with_numpy(name, torch.float32, seed=2)
    mismatches = [(w, g, data) for w, g, data in rows if w != g]
    for want, got, (target, draft, drafts, u, kind) in mismatches:
        assert explained_by_a_nudge(name, target, draft, drafts, u, got), (want, got, target, draft, drafts, u)
    # float32 rounding of the laws moves thresholds by ~1e-7: mismatches are rare
    assert len(mismatches) <= 0.02 * len(rows), f"{len(mismatches)} of {len(rows)} rows differ"


def numpy_threshold(name, target, draft, drafts, u, j, steps=60):
    """The first uniform value at which numpy's outcome changes when uniform ``j`` sweeps [0, 1), or None."""
    lo_u, hi_u = u.copy(), u.copy()
    lo_u[j], hi_u[j] = 0.0, U_MAX
    low = numpy_outcome(name, target, draft, drafts, lo_u)
    if numpy_outcome(name, target, draft, drafts, hi_u) == low:
        return None
    lo, hi = 0.0, U_MAX
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        v = u.copy()
        v[j] = mid
        lo, hi = (mid, hi) if numpy_outcome(name, target, draft, drafts, v) == low else (lo, mid)
    return hi


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_float32_differs_from_numpy_only_within_1e5_of_a_threshold(name):
    """Uniforms placed at numpy's thresholds, then moved by +-offset.

    Two sweeps per row: the uniform of the first accept test (the others random), and the
    residual uniform with every other uniform at 0.999 (all drafts rejected unless a ratio
    exceeds 0.999). float32 agrees with numpy from offset 1e-5 on; float64 at every offset
    down to 1e-12, except K-SEQ rows of the edge kinds, where numpy's own rho* is off by up
    to ~5e-6 (flat g, see otm.torch._rho). The disagreement rates are printed (pytest -s).
    """
    rng = np.random.default_rng(12)
    k = {"speculative": 1, "spechub": 2}.get(name, 3)
    target, draft, drafts, _, kinds = batch_of_instances(name, 7, k, 80, rng)
    first = 0 if name != "greedy" else k - 1  # the uniform of the first accept test
    cases = []
    for i in range(len(target)):
        for j, base in ((first, rng.random(k + 1)), (k, np.full(k + 1, 0.999))):
            at = numpy_threshold(name, target[i], draft[i], drafts[i], base, j)
            if at is not None:
                cases.append((i, j, base, at))
    assert len(cases) > 50
    offsets = (1e-4, 1e-5, 1e-7, 1e-9, 1e-12)
    rates = {}
    for offset in offsets:
        rows, us = [], []
        for i, j, base, at in cases:
            for sign in (-1.0, 1.0):
                if not 0.0 <= at + sign * offset <= U_MAX:
                    continue  # clipped, it would not be offset from the threshold
                v = base.copy()
                v[j] = at + sign * offset
                rows.append(i)
                us.append(v)
        rows, us = np.array(rows), np.array(us)
        want = [numpy_outcome(name, target[i], draft[i], drafts[i], v) for i, v in zip(rows, us)]
        for dtype in (torch.float32, torch.float64):
            got = ot.VERIFIERS[name](t(target[rows], dtype), t(draft[rows], dtype), torch.as_tensor(drafts[rows]), uniforms=t(us))
            differ = [r for r, w, g in zip(rows, want, zip(got.token.tolist(), got.accepted.tolist())) if w != g]
            rates[offset, dtype] = len(differ) / len(rows)
            if dtype == torch.float32 and offset >= 1e-5:
                assert not differ, (offset, [(kinds[r], target[r], draft[r]) for r in differ[:3]])
            if dtype == torch.float64:
                numpy_noise = name == "kseq" and offset < 1e-5
                assert all(numpy_noise and kinds[r] != "random" for r in differ), (offset, [kinds[r] for r in differ])
    print(name, " ".join(f"{o:g}:{rates[o, torch.float32]:.3f}/{rates[o, torch.float64]:.3f}" for o in offsets))


# -- edges ------------------------------------------------------------------------------------

EDGE_PAIRS = {
    "zero masses": ([0.0, 0.5, 0.0, 0.5, 0.0], [0.3, 0.1, 0.3, 0.1, 0.2]),
    "point target": ([0.0, 0.0, 1.0, 0.0, 0.0], [0.3, 0.1, 0.3, 0.1, 0.2]),
    "point draft off target": ([0.4, 0.3, 0.0, 0.3, 0.0], [0.0, 0.0, 0.9, 0.0, 0.1]),
    "identical": ([0.1, 0.2, 0.3, 0.4, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0]),
    "disjoint": ([0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.2, 0.3, 0.5]),
    "tiny masses": ([1e-12, 0.5, 1e-9, 0.5, 0.0], [0.25, 1e-12, 0.5, 0.25 - 1e-7, 1e-7]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edge", sorted(EDGE_PAIRS))
@pytest.mark.parametrize("name", sorted(NUMPY))
def test_edges_never_emit_zero_target_tokens(name, edge, device):
    target, draft = (np.array(x) / np.sum(x) for x in EDGE_PAIRS[edge])
    k = LAW_K[name]
    try:
        scheme = SCHEME[name](draft, k)
    except OtmError:
        pytest.skip(f"the {name} scheme does not exist for this draft")
    tuples, _ = scheme.enumerate()
    n = len(tuples)
    drafts = torch.as_tensor(tuples, device=device)
    for fill in (0.0, U_MAX, None):
        u = torch.full((n, k + 1), fill, dtype=torch.float64, device=device) if fill is not None else None
        for dtype in (torch.float32, torch.float64):
            gen = torch.Generator(device=device).manual_seed(3)
            p, q = t(target, dtype, device).expand(n, -1), t(draft, dtype, device).expand(n, -1)
            token, accepted = ot.VERIFIERS[name](p, q, drafts, uniforms=u, generator=gen)
            assert (t(target, torch.float64, device)[token] > 0).all(), (edge, fill, dtype, token)
            hit = accepted >= 0
            assert torch.equal(drafts[hit].gather(1, accepted[hit, None])[:, 0], token[hit])
            if fill is not None and dtype == torch.float64:  # same uniforms: numpy's outcome
                for i in range(n):
                    want = numpy_outcome(name, target, draft, tuples[i], np.full(k + 1, fill))
                    assert want == (int(token[i]), int(accepted[i])), (edge, fill, tuples[i], want)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(NUMPY))
def test_half_precision_inputs_equal_their_float32_upcast(name, half):
    rng = np.random.default_rng(4)
    size, k = 50, LAW_K[name]
    z = torch.as_tensor(rng.standard_normal((64, size)) * 2)
    noisy = z + torch.as_tensor(rng.standard_normal(z.shape))
    noisy[:, 7] = -torch.inf  # a zero draft mass
    target, draft = torch.softmax(z, -1).to(half), torch.softmax(noisy, -1).to(half)
    sampler = {"speculative": "iid", "kseq": "iid", "rrs": "iid"}.get(name, name.replace("rrs_", ""))
    gen = torch.Generator().manual_seed(0)
    drafts = ot.sample_drafts(sampler, draft, k, generator=gen)
    u = torch.rand(64, k + 1, dtype=torch.float64, generator=gen)
    u[:8] = 0.0
    low = ot.VERIFIERS[name](target, draft, drafts, uniforms=u)
    # the upcast rows sum to 1 only within the half-precision rounding (~2e-3): skip the float32 check
    up = ot.VERIFIERS[name](target.float(), draft.float(), drafts, uniforms=u, validate=False)
    assert torch.equal(low.token, up.token) and torch.equal(low.accepted, up.accepted)
    assert (target.float().gather(1, low.token[:, None]) > 0).all()


# -- rho* -------------------------------------------------------------------------------------


def llm_like(rng, size):
    z = rng.standard_normal(size) * 2.5
    target = np.exp(z - z.max())
    d = z + rng.standard_normal(size)
    draft = np.exp(d - d.max())
    return target / target.sum(), draft / draft.sum()


def random_rows(rng, size, rows):
    out = []
    for i in range(rows):
        if i % 3 == 0:
            out.append(llm_like(rng, size))
        else:
            a = [0.1, 0.5, 2.0][i % 3]
            out.append((rng.dirichlet(np.full(size, a)), rng.dirichlet(np.full(size, a))))
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


@pytest.mark.parametrize("size, rows", [(6, 40), (100, 40), (49152, 3)])
@pytest.mark.parametrize("k", [2, 3, 8])
def test_rho_star_equals_numpy_on_random_rows(size, rows, k):
    rng = np.random.default_rng(size * 10 + k)
    target, draft = random_rows(rng, size, rows)
    want = np.array([np_kseq.rho_star(target[i], draft[i], k) for i in range(rows)])
    got64 = ot.rho_star(t(target), t(draft), k).numpy()
    got32 = ot.rho_star(t(target, torch.float32), t(draft, torch.float32), k).numpy()
    assert np.abs(got64 - want).max() <= 1e-9 * want.max()
    assert np.abs(got32 - want).max() <= 1e-5 * want.max()
    one = ot.rho_star(t(target[:1]), t(draft[:1]), k)  # the single-row (Python float) path
    assert abs(float(one[0]) - got64[0]) <= 1e-14 * got64[0]


def exact_g(target, draft, k, rho: Fraction) -> Fraction:
    beta = sum(min(q, p / rho) for p, q in zip(target, draft))
    return 1 - (1 - beta) ** k - rho * beta


def exact_rho_star(target, draft, k) -> Fraction:
    """Smallest rho in [1, k] with g(rho) <= 0, by bisection in rational arithmetic (to 2^-60)."""
    if exact_g(target, draft, k, Fraction(1)) <= 0:
        return Fraction(1)
    lo, hi = Fraction(1), Fraction(k)
    while hi - lo > Fraction(1, 2**60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if exact_g(target, draft, k, mid) > 0 else (lo, mid)
    return hi


def as_fractions(law: np.ndarray):
    f = [Fraction(x) for x in law]
    total = sum(f)
    return [x / total for x in f]


def test_rho_star_is_exact_on_degenerate_rows():
    """Identical, disjoint, near point and tiny-mass rows: torch's rho* against the exact root.

    numpy's rho* carries the ~1e-16 noise of 1 - (1-beta)^k - rho beta where g is flat;
    its worst error on these rows is printed (pytest -s) and is far larger than torch's.
    """
    rng = np.random.default_rng(7)
    rows, worst_numpy, worst_torch = [], 0.0, 0.0
    while len(rows) < 120:
        target, draft, kind = random_pair(rng, int(rng.integers(2, 7)))
        if kind != "random" or rng.random() < 0.2:
            rows.append((target, draft, int(rng.integers(2, 9))))
    for target, draft, k in rows:
        exact = exact_rho_star(as_fractions(target), as_fractions(draft), k)
        got = float(ot.rho_star(t(target[None]), t(draft[None]), k)[0])
        worst_torch = max(worst_torch, abs(got - float(exact)) / float(exact))
        worst_numpy = max(worst_numpy, abs(np_kseq.rho_star(target, draft, k) - float(exact)) / float(exact))
        assert abs(got - float(exact)) <= 1e-9 * float(exact), (target, draft, k, got, float(exact))
        assert exact_g(as_fractions(target), as_fractions(draft), k, Fraction(got)) <= 0  # valid exactly
    print(f"worst relative error on degenerate rows: torch {worst_torch:.1e}, numpy {worst_numpy:.1e}")
    assert worst_torch <= 1e-12


def test_rho_star_backends_agree(monkeypatch):
    """Python-float (one row), numpy (several rows) and torch-tensor (other devices) searches agree."""
    rng = np.random.default_rng(8)
    target, draft = random_rows(rng, 300, 9)
    target[3], draft[3] = draft[3], draft[3]  # identical
    target[4] = np.eye(300)[5]  # point target
    p, q = t(target), t(draft)
    several = ot.rho_star(p, q, 5)
    singles = torch.cat([ot.rho_star(p[i : i + 1], q[i : i + 1], 5) for i in range(9)])
    monkeypatch.setattr(_rho, "_backend", lambda x: _rho._Torch(x.shape[0], x.device))
    tensors = ot.rho_star(p, q, 5)
    assert torch.allclose(several, singles, rtol=1e-14, atol=0) and torch.allclose(several, tensors, rtol=1e-14, atol=0)


def test_rho_star_stopped_early_is_still_valid():
    rng = np.random.default_rng(9)
    target, draft = random_rows(rng, 40, 6)
    full = ot.rho_star(t(target), t(draft), 4)
    for steps in (0, 1, 2):
        early = ot.rho_star(t(target), t(draft), 4, max_iterations=steps)
        assert (early >= full - 1e-12).all() and (early <= 4).all()
        for i in range(6):
            assert np_kseq.g(target[i], draft[i], 4, float(early[i])) <= 1e-15


def test_kseq_residual_lies_where_p_exceeds_rho_q():
    """All drafts rejected: the residual token has p >= rho* q, so it is none of the rejected drafts.

    (Like numpy's, the residual at rho = rho* (1 + SAFETY) keeps a mass ~1e-14 p on the
    tokens with p < rho q; the grid of residual uniforms below avoids u = 0, where the
    first such token would be drawn.)
    """
    rng = np.random.default_rng(10)
    target, draft = random_rows(rng, 1000, 4)
    rho = ot.rho_star(t(target), t(draft), 4).numpy()
    drafts = torch.as_tensor(np.argsort(-(draft - target / rho[:, None]), 1)[:, :4].copy())  # p < rho q there
    u = torch.full((4, 5), U_MAX, dtype=torch.float64)
    rows = np.arange(4)
    for j in range(1, 200):
        u[:, 4] = j / 200
        out = ot.kseq(t(target), t(draft), drafts, uniforms=u)
        y = out.token.numpy()
        assert (out.accepted == ot.NOT_ACCEPTED).all()
        assert (target[rows, y] >= rho * draft[rows, y] * (1 - 1e-12)).all()
        assert not (drafts.numpy() == y[:, None]).any()


@pytest.mark.parametrize("batch", [1, 40])
def test_kseq_early_settling_equals_the_full_search(batch):
    """On the CPU K-SEQ stops searching rho* once a bracket settles every row's first acceptance.

    Given rho* itself (``rho=``, the full path), the same uniforms give the same tokens and indices.
    """
    rng = np.random.default_rng(13)
    same = settled = 0
    for trial in range(60 if batch == 1 else 12):  # batch 40: rows settle and leave the search at different steps
        size, k = int(rng.choice([50, 3000])), int(rng.integers(2, 9))
        target, draft = random_rows(rng, size, batch)
        p, q = t(target), t(draft)
        drafts = ot.sample_iid(q, k, generator=torch.Generator().manual_seed(trial))
        u = t(rng.random((batch, k + 1)))
        lazy = ot.kseq(p, q, drafts, uniforms=u)
        full = ot.kseq(p, q, drafts, uniforms=u, rho=ot.rho_star(p, q, k))
        same += torch.equal(lazy.token, full.token) and torch.equal(lazy.accepted, full.accepted)
        settled += bool((lazy.accepted >= 0).all())
    assert same == (60 if batch == 1 else 12)
    assert settled > 20 or batch > 1  # at batch 1 most calls end early (all 40 rows accepting is rare)


# -- input checks -----------------------------------------------------------------------------


def test_outputs_live_on_the_input_device_and_generator_is_reproducible():
    for device in DEVICES:
        p, q = t(TARGET, device=device).expand(50, V), t(DRAFT, device=device).expand(50, V)
        d = ot.sample_iid(q, 3, generator=torch.Generator(device=device).manual_seed(0))
        for name in ("kseq", "rrs"):
            a = ot.VERIFIERS[name](p, q, d, generator=torch.Generator(device=device).manual_seed(1))
            b = ot.VERIFIERS[name](p, q, d, generator=torch.Generator(device=device).manual_seed(1))
            assert a.token.device.type == device and torch.equal(a.token, b.token) and torch.equal(a.accepted, b.accepted)


P2, Q2 = t([[0.5, 0.5]]), t([[0.5, 0.5]])


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: ot.kseq(P2[0], Q2, torch.tensor([[0]])), "shape [batch, V]"),
        (lambda: ot.kseq(P2, t([[0.5, 0.25, 0.25]]), torch.tensor([[0]])), "same rows and vocabulary"),
        (lambda: ot.kseq(P2.long(), Q2, torch.tensor([[0]])), "float16, bfloat16, float32 or float64"),
        (lambda: ot.kseq(P2, Q2, torch.tensor([[0.0]])), "integer token ids"),
        (lambda: ot.kseq(P2, Q2, torch.tensor([[0], [1]])), "one row of drafts per row"),
        (lambda: ot.kseq(P2, Q2, torch.tensor([[2]])), "must lie in 0..1"),
        (lambda: ot.kseq(P2, t([[1.0, 0.0]]), torch.tensor([[1]])), "zero draft probability"),
        (lambda: ot.kseq(t([[0.5, 0.6]]), Q2, torch.tensor([[0]])), "sums to 1.1"),
        (lambda: ot.kseq(t([[1.5, -0.5]]), Q2, torch.tensor([[0]])), "non-negative"),
        (lambda: ot.kseq(P2, Q2, torch.tensor([[0]]), uniforms=t([[0.5]])), "shape [batch, 2]"),
        (lambda: ot.kseq(P2, Q2, torch.tensor([[0]]), uniforms=t([[0.5, 1.0]])), "[0, 1)"),
        (lambda: ot.kseq(P2, Q2, torch.tensor([[0]]), compute_dtype=torch.float16), "compute_dtype"),
        (lambda: ot.speculative(P2, Q2, torch.tensor([[0, 1]])), "exactly 1 drafts"),
        (lambda: ot.spechub(P2, Q2, torch.tensor([[0]])), "exactly 2 drafts"),
        (lambda: ot.spechub(t([[0.3, 0.3, 0.4]]), t([[0.2, 0.2, 0.6]]), torch.tensor([[0, 1]])), "(i, hub) or (hub, i)"),
        (lambda: ot.rrs_without_replacement(P2, Q2, torch.tensor([[1, 1]])), "distinct drafts"),
        (lambda: ot.greedy(t([[0.3, 0.3, 0.4]]), t([[0.2, 0.2, 0.6]]), torch.tensor([[0, 1]])), "top 1 draft tokens"),
        (lambda: ot.rho_star(P2, Q2, 0), "k must be"),
    ],
)
def test_bad_input_one_line_errors(call, fragment):
    with pytest.raises(OtmError) as exc:
        call()
    assert fragment in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_not_accepted_is_minus_one_and_float64_decisions():
    assert ot.NOT_ACCEPTED == -1 and _core.DECISION_DTYPE == torch.float64
    assert math.isclose(float(ot.rho_star(t([[0.5, 0.3, 0.2]]), t([[0.2, 0.2, 0.6]]), 2)[0]), 1.463325, rel_tol=1e-6)


# -- derived from the registry: every rule registered with a torch twin ------------------------------


def test_the_registry_names_every_torch_twin():
    """``otm.verifiers.VERIFIERS[name].torch`` is the one list of twins: no twin unregistered, none missing."""
    from otm.verifiers import VERIFIERS as REGISTRY

    assert {n for n, v in REGISTRY.items() if v.torch} == set(ot.VERIFIERS)


def _registered_twins() -> list[str]:
    from otm.verifiers import VERIFIERS as REGISTRY

    return sorted(n for n, v in REGISTRY.items() if v.torch)


def _first_draft_one_row_in_twenty(token: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """Planted bug: one row in twenty emits its first draft untested (a verifier that skips its test on some rows)."""
    bad = token.clone()
    bad[::20] = drafts[::20, 0]
    return bad


@pytest.mark.parametrize("name", _registered_twins())
def test_every_registered_twin_samples_its_numpy_law(name):
    """Every rule registered with ``torch=True`` (so a new one is tested by its registry line alone): N = 20,000
    rows of one instance (V = 6) through its twin against its numpy ``law()`` under the scheme its registry record
    names, by the calibrated chi-square at ALPHA = 1e-3. Negative control: the same output with one row in twenty
    emitting its first draft untested (TV 0.028 on the cells, 0.048 for greedy), whose power is asserted >= 0.99
    and whose samples the same test rejects."""
    from otm.schemes import make_scheme
    from otm.verifiers import VERIFIERS as REGISTRY

    record = REGISTRY[name]
    k = 1 if record.only_k1 else 2 if record.optimum_scheme == "spechub" else 3
    scheme = make_scheme(record.optimum_scheme, DRAFT, k)
    p0 = exact_cells(lambda d: record.module.law(TARGET, DRAFT, d), scheme)
    p1 = exact_cells(lambda d: 0.95 * record.module.law(TARGET, DRAFT, d) + 0.05 * np.eye(V)[d[0]], scheme)
    assert chi2_power(N, p0, p1, alpha=ALPHA) >= MIN_POWER
    drafts = torch.as_tensor(draw_tuples(scheme, N, seed=5))
    out = ot.VERIFIERS[name](t(TARGET, torch.float64, "cpu").expand(N, V), t(DRAFT, torch.float64, "cpu").expand(N, V),
                             drafts, generator=torch.Generator().manual_seed(11))
    assert not chi2_gof(cell_counts(out.token, drafts), p0, alpha=ALPHA).reject
    assert chi2_gof(cell_counts(_first_draft_one_row_in_twenty(out.token, drafts), drafts), p0, alpha=ALPHA).reject
