"""The torch verifiers' device path reads nothing back from the device.

A value read back to the host (``.item()``, ``bool(tensor)``, ``nonzero``, a copy to numpy) is a device sync:
it stalls a GPU stream, and it breaks a CUDA graph or a ``torch.compile(fullgraph=True)`` graph. On the CPU
(``otm.torch._rho.FORCE_DEVICE_PATH``) the device path of each level-by-level verifier

* runs on meta tensors (shapes only: any read of a value raises), given its uniforms and ``validate=False``;
* traces into one graph with ``torch.compile(fullgraph=True)`` (dynamo only: ``backend="eager"``), with the
  tokens of the uncompiled call;
* for ``kseq``, whose host path stops each row's search for rho* early and builds the residual of the
  rejecting rows only, gives the host path's tokens and indices on the same uniforms.

A verifier with a planted ``.item()`` fails the first two checks (the negative control). ``optimal``'s device
path is its own set-up (``otm.torch._optimal_device``: fixed ratio groups, no numpy), tested for its law in
tests/test_optimal_device.py; ``optimal_embedded``'s device path is its torch walk (also checked here alone:
meta tensors, one graph) followed by that ``optimal``. ``kseq_without_replacement``'s root search is traced
with 2 of its ``ROOT_STEPS`` and K-SEQ's rho* search within it with 4 steps (every step is the same code;
tracing them all takes ~80 s; ``kseq``'s own test traces the full rho* search).
"""

from __future__ import annotations

import pytest
import torch

import otm.torch as ot
from otm.torch import _rho, _wor, _wor_trials

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SYNC_FREE = {  # verifier: (draft sampler, k, uniform columns)
    "speculative": ("sample_iid", 1, 2),
    "kseq": ("sample_iid", 3, 4),
    "rrs": ("sample_iid", 3, 4),
    "rrs_without_replacement": ("sample_without_replacement", 3, 4),
    "greedy": ("sample_greedy", 3, 4),
    "spechub": ("sample_spechub", 2, 3),
    "kseq_without_replacement": ("sample_without_replacement", 3, 6),
    "optimal": ("sample_iid", 3, 5),
    "optimal_embedded": ("sample_without_replacement", 3, 7),
}
HOST_SET_UP: set[str] = set()  # every verifier has a sync-free device path


def test_every_verifier_is_sorted_into_one_of_the_two_lists():
    assert set(SYNC_FREE) | HOST_SET_UP == set(ot.VERIFIERS) and not set(SYNC_FREE) & HOST_SET_UP


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", True)


def _planted_item(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
    """kseq with a realistic sync planted: a per-call scalar read back (``rho`` as a Python float)."""
    rho = float(ot.rho_star(target, draft, drafts.shape[1], validate=False).max().item())
    return ot.kseq(target, draft, drafts, uniforms=uniforms, rho=rho, validate=False)


def _case(name, batch=8, V=20, seed=0):
    sampler, k, width = SYNC_FREE[name]
    g = torch.Generator().manual_seed(seed)
    dirichlet = torch.distributions.Dirichlet(torch.full((V,), 0.5, dtype=torch.float64))
    torch.manual_seed(seed)
    p, q = dirichlet.sample((batch,)), dirichlet.sample((batch,))
    d = getattr(ot, sampler)(q, k, generator=g)
    u = torch.rand(batch, width, generator=g, dtype=torch.float64)
    return p, q, d, u


@pytest.mark.parametrize("name", sorted(SYNC_FREE))
def test_device_path_runs_on_meta_tensors(name, device_path):
    _, k, width = SYNC_FREE[name]
    laws = torch.empty(4, 11, device="meta", dtype=torch.float32)
    drafts = torch.empty(4, k, device="meta", dtype=torch.int64)
    u = torch.empty(4, width, device="meta", dtype=torch.float64)
    out = ot.VERIFIERS[name](laws, laws, drafts, uniforms=u, validate=False)
    assert out.token.device.type == "meta" and tuple(out.token.shape) == (4,) and out.token.dtype == torch.int64
    assert tuple(out.accepted.shape) == (4,)


def test_a_planted_sync_fails_on_meta_tensors(device_path):
    laws = torch.empty(4, 11, device="meta", dtype=torch.float32)
    drafts = torch.empty(4, 3, device="meta", dtype=torch.int64)
    u = torch.empty(4, 4, device="meta", dtype=torch.float64)
    with pytest.raises((RuntimeError, NotImplementedError)):
        _planted_item(laws, laws, drafts, uniforms=u)


@pytest.mark.parametrize("name", sorted(SYNC_FREE))
def test_device_path_compiles_into_one_graph(name, device_path, monkeypatch):
    if name == "kseq_without_replacement":  # its two searches traced with a few steps each (see the docstring)
        monkeypatch.setattr(_wor_trials, "ROOT_STEPS", 2)
        monkeypatch.setattr(_rho, "RHO_DEVICE_STEPS", 4)
    p, q, d, u = _case(name)
    fn = ot.VERIFIERS[name]
    want = fn(p, q, d, uniforms=u, validate=False)
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="eager")(p, q, d, uniforms=u, validate=False)
    assert torch.equal(got.token, want.token) and torch.equal(got.accepted, want.accepted)


def test_embedded_walk_runs_on_meta_tensors_and_compiles_into_one_graph():
    meta = torch.empty(4, 11, device="meta", dtype=torch.float64)
    path = _wor.embedded_walk(meta, torch.empty(4, 3, device="meta", dtype=torch.int64),
                              torch.empty(4, 2, device="meta", dtype=torch.float64))
    assert path.device.type == "meta" and tuple(path.shape) == (4, 3) and path.dtype == torch.int64
    _, q, d, u = _case("rrs_without_replacement")
    q = q / q.sum(-1, keepdim=True)
    want = _wor.embedded_walk(q, d, u[:, :2])
    torch._dynamo.reset()
    got = torch.compile(_wor.embedded_walk, fullgraph=True, backend="eager")(q, d, u[:, :2])
    assert torch.equal(got, want) and bool((want[:, 0] == 0).all()) and bool((want[:, 1:] > 0).any())


def test_a_planted_sync_breaks_the_graph(device_path):
    p, q, d, u = _case("kseq")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)graph break|item|unsupported"):
        torch.compile(_planted_item, fullgraph=True, backend="eager")(p, q, d, uniforms=u)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_kseq_device_path_gives_the_host_paths_tokens(k, monkeypatch):
    """300 rows (50 with target = draft), the same uniforms: the host path (early stops, residual of the
    rejecting rows only) and the sync-free device path (64 Brent steps, every row's residual) agree token by
    token and index by index; their rho* agree to 1e-14."""
    g = torch.Generator().manual_seed(k)
    torch.manual_seed(k)
    dirichlet = torch.distributions.Dirichlet(torch.full((50,), 0.3, dtype=torch.float64))
    p, q = dirichlet.sample((300,)), dirichlet.sample((300,))
    p[:50] = q[:50]
    d = ot.sample_iid(q, k, generator=g)
    u = torch.rand(300, k + 1, generator=g, dtype=torch.float64)
    host, rho_host = ot.kseq(p, q, d, uniforms=u), ot.rho_star(p, q, k)
    monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", True)
    dev, rho_dev = ot.kseq(p, q, d, uniforms=u), ot.rho_star(p, q, k)
    assert torch.equal(host.token, dev.token) and torch.equal(host.accepted, dev.accepted)
    assert float(((rho_host - rho_dev).abs() / rho_host).max()) < 1e-14


# -- the decoder's host reads per step, by phase (otm.decode.host_reads) -----------------------------------


def _toy_pair():
    from otm.decode.toy import ToyLM

    return ToyLM(5, seed=1), ToyLM(5, seed=2)


def test_decoder_counts_its_host_reads_by_phase():
    from otm.decode import autoregressive_decode, speculative_decode

    from otm.decode.host_reads import device_paths

    target, draft = _toy_pair()
    with device_paths():  # what a GPU would read (the CPU keeps its own paths otherwise)
        s = speculative_decode(target, draft, [0, 1], k=3, length=2, max_new_tokens=12, seed=0, count_host_reads=True).stats
    assert s.steps > 0 and {"draft", "verify", "accept"} <= set(s.host_reads) and all(v > 0 for v in s.host_reads.values())
    assert s.host_reads["accept"] == s.steps and "target" not in s.host_reads  # the laws' checks go with the reads
    plain = speculative_decode(target, draft, [0, 1], k=3, length=2, max_new_tokens=12, seed=0).stats
    assert plain.host_reads == {}  # nothing counted unless asked
    with device_paths():
        ar = autoregressive_decode(target, [0, 1], max_new_tokens=12, seed=0, count_host_reads=True).stats
    assert "draft" not in ar.host_reads and ar.host_reads["accept"] == ar.steps


def test_a_planted_read_in_the_walk_is_counted_in_verify(monkeypatch):
    """Negative control: one extra ``.item()`` per walk adds exactly one verify read per walk of the rule (every
    step but a last one without drafts), and nothing to the other phases."""
    from otm.decode import speculative_decode
    from otm.decode import tree_rules

    target, draft = _toy_pair()
    run = dict(k=3, length=2, verifier="traversal", max_new_tokens=12, seed=0, count_host_reads=True)
    base = speculative_decode(target, draft, [0, 1], **run).stats
    walk = tree_rules.Traversal.walk

    calls = []

    def walk_with_a_read(self, dec, tree, drafts, target_laws):
        calls.append(target_laws[0, 0].item())  # the planted sync
        return walk(self, dec, tree, drafts, target_laws)

    monkeypatch.setattr(tree_rules.Traversal, "walk", walk_with_a_read)
    planted = speculative_decode(target, draft, [0, 1], **run).stats
    assert planted.steps == base.steps
    assert planted.host_reads["verify"] == base.host_reads.get("verify", 0) + len(calls) and len(calls) >= base.steps - 1
    assert {p: c for p, c in planted.host_reads.items() if p != "verify"} == \
        {p: c for p, c in base.host_reads.items() if p != "verify"}
