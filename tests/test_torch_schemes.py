"""Batched draft samplers against the ``enumerate()`` laws of the numpy schemes.

* Law: N = 20,000 draft tuples from one batched call (V = 6, k = 3; SpecHub k = 2),
  binned by ordered tuple and compared with the exact tuple law by the calibrated
  chi-square test of :mod:`otm.testing` at ALPHA = 1e-3. Each sampler has a planted
  bug with a known exact law; the power against it is asserted >= 0.99 and its
  samples must be rejected (negative control). The iid sampler is also run against
  the without-replacement law (its repeated tokens are impossible cells there).
* Uniform by uniform: with explicit uniforms, ``sample_iid``, ``sample_greedy`` and
  ``sample_spechub`` give exactly the tuples of ``IID.sample``, ``Greedy.sample`` and
  ``SpecHub.sample`` fed the same numbers; ``top_tokens`` breaks ties to the lower
  index like ``Greedy``; with explicit noise the exponential race is the argsort of
  ``E / q``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import otm.torch as ot
from otm.laws import OtmError
from otm.schemes import IID, Greedy, SpecHub, WithoutReplacement
from otm.testing import chi2_gof, chi2_power

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
N = 20_000
ALPHA = 1e-3
MIN_POWER = 0.99
DRAFT = np.array([0.1, 0.3, 0.1, 0.25, 0.1, 0.15])  # three tied tokens: greedy's tie-breaking matters
V, K = DRAFT.size, 3
SCHEMES = {
    "iid": lambda: IID(DRAFT, K),
    "without_replacement": lambda: WithoutReplacement(DRAFT, K),
    "greedy": lambda: Greedy(DRAFT, K),
    "spechub": lambda: SpecHub(DRAFT),
}


class SeqRng:
    def __init__(self, values):
        self.values, self.used = [float(v) for v in values], 0

    def random(self):
        v = self.values[self.used]
        self.used += 1
        return v


def codes(tuples: np.ndarray) -> np.ndarray:
    """Ordered tuple -> integer cell (base V)."""
    return (tuples * V ** np.arange(tuples.shape[1])).sum(1)


def tuple_law(tuples: np.ndarray, probs: np.ndarray, k: int) -> np.ndarray:
    law = np.zeros(V**k)
    np.add.at(law, codes(tuples), probs)
    return law


def counts(drafts: torch.Tensor) -> np.ndarray:
    d = drafts.cpu().numpy()
    return np.bincount(codes(d), minlength=V ** d.shape[1]).astype(float)


def q_tensor(dtype, device, n=N):
    return torch.as_tensor(DRAFT, dtype=dtype, device=device).expand(n, V)


# -- planted bugs (torch) and their exact laws ---------------------------------------------


def bug_iid(q, k, gen):
    """One uniform reused for all k draws: every tuple is (x, x, ..., x)."""
    u = torch.rand(q.shape[0], 1, dtype=torch.float64, generator=gen, device=q.device)
    return ot.sample_iid(q, k, uniforms=u.expand(-1, k).contiguous())


def law_bug_iid(k):
    xs = np.arange(V)
    return tuple_law(np.stack([xs] * k, 1), DRAFT, k)


def bug_without_replacement(q, k, gen):
    """Gumbel-top-k without the top-k order: the k winners in token order."""
    return ot.sample_without_replacement(q, k, generator=gen).sort(-1).values


def law_bug_without_replacement(k):
    tuples, probs = WithoutReplacement(DRAFT, k).enumerate()
    return tuple_law(np.sort(tuples, 1), probs, k)


def bug_greedy(q, k, gen):
    """The last draft drawn from the full draft law, not from q restricted to the tokens outside D."""
    fixed = ot.top_tokens(q, k - 1)
    return torch.cat([fixed, ot.sample_iid(q, 1, generator=gen)], 1)


def law_bug_greedy(k):
    fixed = Greedy(DRAFT, k).fixed
    xs = np.arange(V)
    return tuple_law(np.concatenate([np.broadcast_to(fixed, (V, k - 1)), xs[:, None]], 1), DRAFT, k)


def bug_spechub(q, k, gen):
    """The second draft always drawn from q without the hub, even when the first one is not the hub."""
    x1 = ot.sample_iid(q, 1, generator=gen)
    hub = q.argmax(-1, keepdim=True)
    other = ot.sample_iid(q.scatter(1, hub, 0.0) / (1 - q.gather(1, hub)), 1, generator=gen)
    return torch.cat([x1, other], 1)


def law_bug_spechub(k):
    hub = int(np.argmax(DRAFT))
    others = np.where(np.arange(V) == hub, 0.0, DRAFT) / (1 - DRAFT[hub])
    i, j = np.meshgrid(np.arange(V), np.arange(V), indexing="ij")
    return tuple_law(np.stack([i.ravel(), j.ravel()], 1), (DRAFT[:, None] * others[None, :]).ravel(), 2)


BUGS = {
    "iid": (bug_iid, law_bug_iid),
    "without_replacement": (bug_without_replacement, law_bug_without_replacement),
    "greedy": (bug_greedy, law_bug_greedy),
    "spechub": (bug_spechub, law_bug_spechub),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_sampler_law_matches_enumerate_and_catches_planted_bug(name, dtype, device):
    scheme = SCHEMES[name]()
    k = scheme.k
    p0 = tuple_law(*scheme.enumerate(), k)
    bug, bug_law = BUGS[name]
    p1 = bug_law(k)
    assert abs(p1.sum() - 1) < 1e-12 and np.abs(p1 - p0).sum() > 1e-2
    power = chi2_power(N, p0, p1, alpha=ALPHA)
    assert power >= MIN_POWER, f"{name}: power {power:.4f} against the planted bug"

    gen = torch.Generator(device=device).manual_seed(21)
    drafts = ot.SAMPLERS[name](q_tensor(dtype, device), k, generator=gen)
    assert drafts.shape == (N, k) and drafts.dtype == torch.int64 and drafts.device.type == device
    result = chi2_gof(counts(drafts), p0, alpha=ALPHA)
    assert not result.reject, f"{name}: {result}"

    bad = bug(q_tensor(dtype, device), k, torch.Generator(device=device).manual_seed(22))
    control = chi2_gof(counts(bad), p0, alpha=ALPHA)
    assert control.reject, f"{name} planted bug not caught: {control}"


def test_iid_sampler_fails_the_without_replacement_law():
    """Negative control across schemes: with replacement, repeats land in impossible cells."""
    p0 = tuple_law(*WithoutReplacement(DRAFT, K).enumerate(), K)
    p1 = tuple_law(*IID(DRAFT, K).enumerate(), K)
    assert chi2_power(N, p0, p1, alpha=ALPHA) >= MIN_POWER
    drafts = ot.sample_iid(q_tensor(torch.float64, "cpu"), K, generator=torch.Generator().manual_seed(23))
    result = chi2_gof(counts(drafts), p0, alpha=ALPHA)
    assert result.reject and result.impossible > 0


# -- uniform by uniform against numpy -----------------------------------------------------


def random_drafts(rng, rows, size):
    out = []
    for _ in range(rows):
        x = rng.random(size)
        x[rng.random(size) < 0.3] = 0.0
        x = np.where(rng.random(size) < 0.2, rng.choice([1e-12, 1e-9], size), x)
        x[rng.integers(size)] += 0.5  # at least one positive mass
        out.append(x / x.sum())
    return np.array(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_explicit_uniforms_reproduce_numpy_samplers(dtype):
    rng = np.random.default_rng(24)
    size, rows = 7, 300
    q = random_drafts(rng, rows, size)
    u = rng.random((rows, 3))
    u[rng.random(u.shape) < 0.1] = 0.0
    qt = torch.as_tensor(q).to(dtype)
    iid = ot.sample_iid(qt, 3, uniforms=torch.as_tensor(u))
    greedy = ot.sample_greedy(qt, 3, uniforms=torch.as_tensor(u[:, :1]), validate=False)
    hub = ot.sample_spechub(qt, uniforms=torch.as_tensor(u[:, :2]), validate=False)
    mismatch = 0
    for i in range(rows):
        mismatch += not np.array_equal(IID(q[i], 3).sample(SeqRng(u[i])), iid[i].numpy())
        try:
            mismatch += not np.array_equal(Greedy(q[i], 3).sample(SeqRng(u[i, :1])), greedy[i].numpy())
        except OtmError:
            pass  # no mass outside the top 2
        try:
            mismatch += not np.array_equal(SpecHub(q[i]).sample(SeqRng(u[i, :2])), hub[i].numpy())
        except OtmError:
            pass  # a single token of positive mass
    # float64: identical; float32: laws rounded to float32 may move a CDF boundary past a uniform
    assert mismatch == 0 if dtype == torch.float64 else mismatch <= 3
    # zero draft mass is never drawn, even at u = 0
    zeros = torch.zeros(rows, 3, dtype=torch.float64)
    assert (qt.gather(1, ot.sample_iid(qt, 3, uniforms=zeros)) > 0).all()
    has_rest = (qt.scatter(1, ot.top_tokens(qt, 2), 0.0).sum(1) > 0)[:, None]
    last = ot.sample_greedy(qt, 3, uniforms=zeros[:, :1], validate=False)[:, 2:]
    assert ((qt.gather(1, last) > 0) | ~has_rest).all()


def test_top_tokens_break_ties_to_the_lower_index():
    rng = np.random.default_rng(25)
    q = rng.integers(0, 4, size=(500, 9)).astype(float) + 1e-3  # many exact ties
    q /= q.sum(1, keepdims=True)
    for m in (1, 2, 4, 8):
        got = ot.top_tokens(torch.as_tensor(q), m).numpy()
        want = np.sort(np.argsort(-q, axis=1, kind="stable")[:, :m], axis=1)
        assert np.array_equal(got, want)
        assert all(np.array_equal(Greedy(q[i], m + 1).fixed, got[i]) for i in range(20))
    assert ot.top_tokens(torch.as_tensor(q), 0).shape == (500, 0)


def test_exponential_race_with_given_noise_is_the_argsort_of_e_over_q():
    rng = np.random.default_rng(26)
    q = random_drafts(rng, 50, 12)
    e = rng.exponential(size=q.shape)
    keys = np.where(q > 0, e / np.where(q > 0, q, 1), np.inf)
    want = np.argsort(keys, axis=1, kind="stable")[:, :3]
    got = ot.sample_without_replacement(torch.as_tensor(q), 3, exponentials=torch.as_tensor(e), validate=False)
    support = (q > 0).sum(1) >= 3
    assert np.array_equal(got.numpy()[support], want[support])
    assert (np.take_along_axis(q, got.numpy(), 1)[support] > 0).all()


def test_without_replacement_noise_is_float64_even_for_float32_laws():
    """The race is run on float64 keys (float32 Exp noise truncates below 2^-24: vLLM #43150)."""
    q = torch.tensor([[1 - 3e-9, 1e-9, 1e-9, 1e-9]], dtype=torch.float32)
    e = torch.tensor([[1.0, 2e-10, 1.0, 1.0]], dtype=torch.float64)  # the tail token's key 0.2 beats the head's 1.0
    assert ot.sample_without_replacement(q, 1, exponentials=e).tolist() == [[1]]
    drafts = ot.sample_without_replacement(q.expand(1000, 4), 2, generator=torch.Generator().manual_seed(0))
    assert (drafts[:, 0] != drafts[:, 1]).all()


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: ot.sample_without_replacement(torch.tensor([[0.5, 0.5, 0.0]]), 3), "at least 3"),
        (lambda: ot.sample_greedy(torch.tensor([[0.5, 0.5]]), 3), "k <= V"),
        (lambda: ot.sample_greedy(torch.tensor([[0.5, 0.5, 0.0]]), 3), "outside the top 2"),
        (lambda: ot.sample_spechub(torch.tensor([[0.5, 0.5]]), 3), "exactly k=2"),
        (lambda: ot.sample_spechub(torch.tensor([[1.0, 0.0]])), "at least 2"),
        (lambda: ot.sample_iid(torch.tensor([[0.5, 0.5]]), 0), "k must be"),
        (lambda: ot.sample_iid(torch.tensor([0.5, 0.5]), 1), "shape [batch, V]"),
        (lambda: ot.sample_drafts("beam", torch.tensor([[0.5, 0.5]]), 1), "unknown scheme"),
        (lambda: ot.sample_without_replacement(torch.tensor([[0.5, 0.5]]), 1, exponentials=torch.ones(2)), "exponentials"),
    ],
)
def test_bad_sampler_input_one_line_errors(call, fragment):
    with pytest.raises(OtmError) as exc:
        call()
    assert fragment in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
