"""The decoder's host reads per step: each is a device sync on a GPU.

Counted with ``count_host_reads`` (:mod:`otm.decode.host_reads`) on a tiny random-weight Llama pair, with the
torch verifiers' device path (``otm.torch._rho.FORCE_DEVICE_PATH``: what a GPU runs) and ``validate=False``:

* every level-by-level decoder verifier (``kseq``, ``rrs``, ``optimal``, ``speculative`` with i.i.d. rows;
  ``rrs_without_replacement``, ``kseq_without_replacement``, ``optimal_embedded``, ``speculative`` without
  replacement; ``greedy`` and ``spechub`` are not decoder verifiers: the decoder draws no such drafts) reads at
  most 2 values per step: the drafted rows (the tree is built on the host) and the step's outcome (phase
  "accept"), none in the verify phase, none in the target pass or the rollback; eager and static step, both
  rollbacks;
* negative controls: the node-by-node walk (the walk before the device walk: one read of the verifier's token at
  each node) and a planted ``.item()`` inside the verifier call are counted in the verify phase;
* the device walk keeps the exact law: the exact mode's door, made to take the device walk, gives the target's
  law to 1e-12 (its node-by-node walk is checked by tests/test_decode.py);
* at temperature 0 (every choice a point mass) the device walk gives the node-by-node walk's tokens and counts
  of verifications and acceptances by depth (it caught a device walk that counted the root as accepted after a
  rejection);
* the whole-tree rules with numpy arithmetic (block, hsd, traversal, gbv, spectr_gbv, layer) read the step's laws
  in one copy, with the uniforms of their decisions: pinned.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from otm.decode import speculative_decode
from otm.decode.chance import Enumerated, Sampled
from otm.torch import _rho

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

LEVEL_BY_LEVEL = [("iid", "kseq", 3), ("iid", "rrs", 3), ("iid", "speculative", 1), ("iid", "optimal", 3),
                  ("without_replacement", "rrs_without_replacement", 3), ("without_replacement", "speculative", 1),
                  ("without_replacement", "kseq_without_replacement", 3),
                  ("without_replacement", "optimal_embedded", 3)]


def tiny_llama(seed: int, V: int = 24) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.5,
                      attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(1), tiny_llama(2)


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", True)


def reads(pair, scheme, verifier, k, **options):
    target, draft = pair
    s = speculative_decode(target, draft, [1, 2, 3], k=k, length=3, verifier=verifier, scheme=scheme, seed=0,
                           max_new_tokens=14, validate=False, count_host_reads=True, **options).stats
    return s.steps, dict(s.host_reads)


@pytest.mark.parametrize("scheme, verifier, k", LEVEL_BY_LEVEL)
def test_level_by_level_verifiers_read_at_most_two_values_per_step(pair, device_path, scheme, verifier, k):
    for options in (dict(target_rollback="gather"), dict(target_rollback="refeed", static=True)):
        steps, counts = reads(pair, scheme, verifier, k, **options)
        assert steps >= 4 and counts.get("accept") == steps, (options, counts)  # one read of each step's outcome
        assert counts.get("draft", 0) <= steps  # the drafted rows (the last step may draft nothing)
        assert not {p: c for p, c in counts.items() if p not in ("draft", "accept", "other")}, (options, counts)


def test_the_node_by_node_walk_reads_in_the_verify_phase(pair, device_path, monkeypatch):
    """Negative control: the walk that reads each node's token back (the decoder's walk before the device walk)
    costs one verify read per verified node, at least one per step."""
    monkeypatch.setattr(Sampled, "device_walk", False)
    steps, counts = reads(pair, "iid", "kseq", 3)
    assert counts.get("verify", 0) >= steps and "accept" not in counts


def test_a_planted_item_in_the_verify_step_is_counted(pair, device_path, monkeypatch):
    """Negative control: a realistic sync planted in the verifier call (a scalar read back, as a per-call
    ``rho`` or ``acceptance`` logged with ``.item()``) shows up in the verify phase, once per call."""
    calls = []
    real = Sampled.verify_batch

    def verify_with_a_read(self, verifier, target, draft, drafts):
        calls.append(float(target.max().item()))  # the planted sync
        return real(self, verifier, target, draft, drafts)

    monkeypatch.setattr(Sampled, "verify_batch", verify_with_a_read)
    steps, counts = reads(pair, "iid", "kseq", 3)
    assert counts.get("verify") == len(calls) >= steps


class _DeviceWalkDoor(Enumerated):
    device_walk = True  # the exact mode's door, made to take the sampled run's device walk


@pytest.mark.parametrize("scheme, verifier, k", [("iid", "kseq", 2), ("without_replacement", "rrs_without_replacement", 2)])
def test_the_device_walk_keeps_the_target_law_exactly(monkeypatch, device_path, scheme, verifier, k):
    """Every node verified and every leaf's bonus drawn, only the accepted path's decisions used: the exact law
    of the decoder's output is the target's (law error < 1e-12; ToyLM V = 2, T = 3 so that depth 2 occurs). The
    walk taken is the device walk (counted), and the planted realistic bug "every node verified with row 0's
    draft law" (the wrong row) is caught by the same check under it (law error 0.039 iid, 0.059 without
    replacement)."""
    from otm.certify.decoder_mutants import DECODER_MUTANTS
    from otm.decode import exact_mode
    from otm.decode.exact_mode import exact_decode, law_error, target_law
    from otm.decode.toy import ToyLM, model_law
    from otm.decode.tree_rules import LevelByLevel

    walks = []
    real = LevelByLevel.device_walk
    monkeypatch.setattr(LevelByLevel, "device_walk", lambda self, *a: walks.append(1) or real(self, *a))
    monkeypatch.setattr(exact_mode, "Enumerated", _DeviceWalkDoor)
    target, draft = ToyLM(2, seed=1), ToyLM(2, seed=2)
    reference = target_law(model_law(target, [0, 1]), 3)

    def error():
        result = exact_decode(target, draft, [0, 1], max_new_tokens=3, k=k, length=2, verifier=verifier, scheme=scheme)
        return law_error(result.law, reference)

    assert error() < 1e-12 and walks
    with DECODER_MUTANTS["wrong_row_law"].plant():
        assert error() > 1e-2


@pytest.mark.parametrize("verifier, k", [("block", 1), ("hsd", 1), ("traversal", 3), ("gbv", 3), ("spectr_gbv", 3), ("layer", 3)])
def test_numpy_tree_rules_read_the_steps_laws_once(pair, device_path, verifier, k):
    """A whole-tree rule doing its arithmetic in numpy reads the step's laws back in one copy (phase "laws", with
    the uniforms of its decisions, drawn on the host), besides the drafted rows: at most 2 reads per step, none
    in "verify" (a step without drafts reads its bonus token in "accept" instead)."""
    steps, counts = reads(pair, "iid", verifier, k)
    assert counts.get("draft", 0) <= steps and "target" not in counts and "rollback" not in counts
    assert 1 <= counts["laws"] == steps - counts.get("accept", 0) and "verify" not in counts, counts


NOISE = 0.2


@pytest.mark.parametrize("scheme, verifier", [("iid", "kseq"), ("without_replacement", "rrs_without_replacement")])
def test_greedy_runs_give_the_node_by_node_walks_tokens_and_counts(pair, scheme, verifier, monkeypatch):
    """At temperature 0 every choice is a point mass, so both walks must give the same tokens and the same
    verifications and acceptances by depth (a walk that counts the root as accepted after a rejection, or
    stops one node late, differs here)."""
    import copy

    from otm.decode import Sampling

    target = pair[0]
    draft = copy.deepcopy(target)  # the target with noise on its weights: its argmax agrees often, not always
    torch.manual_seed(0)
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(NOISE * torch.randn_like(w))

    def run():
        return speculative_decode(target, draft, [1, 2, 3], k=3, length=3, verifier=verifier, scheme=scheme, seed=0,
                                  sampling=Sampling(temperature=0), max_new_tokens=20, validate=False)

    from otm.decode.host_reads import device_paths
    from otm.decode.tree_rules import LevelByLevel

    walks = []
    real = LevelByLevel.device_walk
    monkeypatch.setattr(LevelByLevel, "device_walk", lambda self, *a: walks.append(1) or real(self, *a))
    with device_paths():  # the device walk, on the CPU
        device = run()
    taken = len(walks)
    assert taken  # it was taken
    node_by_node = run()  # the CPU's own walk
    assert len(walks) == taken  # which does not call it
    assert device.tokens == node_by_node.tokens
    assert device.stats.verified_by_depth == node_by_node.stats.verified_by_depth
    assert device.stats.accepted_by_depth == node_by_node.stats.accepted_by_depth
    assert 0 < sum(device.stats.accepted_by_depth) < sum(device.stats.verified_by_depth)  # both outcomes occur


def test_the_cpu_keeps_its_node_by_node_walk(pair):
    """On the CPU a read costs nothing and the node-by-node walk verifies only the accepted path's nodes, so the
    CPU keeps it unless the device path is forced (``otm.decode.host_reads.device_paths``): the same run reads in
    its verify phase there, and none forced."""
    from otm.decode.host_reads import device_paths

    _, cpu = reads(pair, "iid", "kseq", 3)
    with device_paths():
        _, forced = reads(pair, "iid", "kseq", 3)
    assert cpu.get("verify", 0) > 0 and "verify" not in forced
