"""otm certify --kind tree: tree kernels judged in their engines' layouts inside the real decoder
(otm.certify.tree_kernels). A correct generic kernel certified; our rewrite of SGLang's
tree_speculative_sampling_target_only certified with thresholds 1 under the engines' top-k drafting and
refuted with thresholds below 1 (lossy by design); planted tree bugs refuted, each with its exact TV."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from otm.certify.decoder import certify_decoder
from otm.certify.tree_kernels import (LAYOUTS, PLANTED, TREE_SETTINGS, SGLangRuleLaw, certify_tree, exact_walk,
                                      planted_kernel, sglang_target_only)
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_a_correct_generic_kernel_is_certified():
    report = certify_tree("rrs", layout="generic", k=2, length=2, tv=0.3)
    assert report.certified, str(report)
    assert report.kind == "tree" and report.method.startswith("generic layout")
    assert len(report.cases) == len(TREE_SETTINGS)
    assert "--kind tree --layout generic" in report.command


def test_sglang_rewrite_with_thresholds_1_is_certified_under_top_k_drafting():
    report = certify_tree("sglang", layout="sglang", k=3, length=2, tv=0.3, scheme="top_k")
    assert report.certified, str(report)
    assert report.scheme == "top_k" and "top-k drafting" in report.method
    assert all(c.acceptance is not None and c.acceptance > 0 for c in report.cases)
    # the boundary probe finds the kernel's `coin <= prob_acc` at coin 0 (sglang#35771), reported as a note
    assert any("sglang#35771" in note for note in report.notes)


@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_sglang_rule_is_exactly_lossless_with_thresholds_1(scheme):
    """The rule as we read it, its decisions from their exact laws: law error < 1e-12 on every setting."""
    report = certify_decoder(SGLangRuleLaw(), scheme=scheme, k=2, length=2)
    assert report.certified and report.method.startswith("exact") and max(c.law_error for c in report.cases) < 1e-12


def test_sglang_thresholds_below_1_are_refuted_with_their_exact_tv():
    """Lossy by design: threshold_single 0.5 accepts any child the target gives >= 0.5 (exact TV 0.47 on the
    toy settings); the rewrite is refuted statistically, its empirical TV near the exact one."""
    exact = certify_decoder(SGLangRuleLaw(threshold_single=0.5), k=2, length=2)
    tv = max(c.tv for c in exact.cases)
    assert not exact.certified and 0.45 < tv < 0.49
    lossy = functools.partial(sglang_target_only, threshold_single=0.5)
    report = certify_tree(lossy, layout="sglang", k=2, length=2, tv=0.4)
    assert not report.certified and report.worst.pvalue < 1e-10 and abs(report.worst.tv - tv) < 0.1
    assert report.rule == "otm.certify.tree_kernels:sglang_target_only(threshold_single=0.5)"


@pytest.mark.parametrize("bug,low,high", [
    ("residual_not_updated", 0.12, 0.14), ("bonus_from_parent", 0.6, 0.7),
    pytest.param("correction_from_target", 0.12, 0.14, marks=pytest.mark.research)])
def test_planted_tree_bugs_have_these_exact_tvs(bug, low, high):
    """The planted walk with its draws through the decoder's door of chance: its exact TV (decoder's exact mode)."""
    report = certify_decoder(exact_walk(bug), k=2, length=2)
    assert not report.certified and low < max(c.tv for c in report.cases) < high


def test_planted_bonus_from_the_parents_law_is_refuted_statistically():
    """Planted: the bonus token after a fully accepted path drawn from the parent's law (exact TV 0.67)."""
    report = certify_tree(planted_kernel("bonus_from_parent"), layout="generic", k=2, length=2, tv=0.45)
    assert not report.certified and report.worst.pvalue < 1e-6


@pytest.mark.research
@pytest.mark.parametrize("bug", ["residual_not_updated", "correction_from_target"])
def test_planted_residual_bugs_are_refuted_statistically_with_power(bug):
    """Planted (exact TV 0.13 each): refuted at tv = 0.12, where the power against them is >= 0.99."""
    report = certify_tree(planted_kernel(bug), layout="generic", k=2, length=2, tv=0.12)
    assert not report.certified


def test_a_rule_for_sampled_drafts_is_refuted_on_top_k_drafts():
    """Recursive rejection sampling reads the draft law as the law the drafts were drawn from: on the engines'
    deterministic top-k drafts it is not lossless (llama.cpp's case, peers.md Part C)."""
    report = certify_tree("rrs", layout="generic", k=2, length=2, tv=0.45, scheme="top_k")
    assert not report.certified


def test_sglang_layout_reads_its_arrays_as_the_engine_does():
    """A hand-made tree (root, children 5 then 6, 6 has child 7) with point-mass targets: the path 6, 7 is
    accepted, the bonus after 7 is the target's token 2; predicts hold the next token at each accepted position."""
    V = 8
    target = torch.zeros((1, 4, V))
    target[0, 0, 6] = target[0, 2, 7] = target[0, 3, 2] = target[0, 1, 1] = 1.0
    arrays = dict(predicts=torch.full((4,), -1, dtype=torch.int32),
                  accept_index=torch.full((1, 3), -1, dtype=torch.int32),
                  accept_token_num=torch.zeros(1, dtype=torch.int32))
    sglang_target_only(**arrays, candidates=torch.tensor([[0, 5, 6, 7]]), retrive_index=torch.tensor([[0, 1, 2, 3]]),
                       retrive_next_token=torch.tensor([[1, -1, 3, -1]]),
                       retrive_next_sibling=torch.tensor([[-1, 2, -1, -1]]),
                       uniform_samples=torch.full((1, 4), 0.5), uniform_samples_for_final_sampling=torch.tensor([0.5]),
                       target_probs=target, draft_probs=torch.zeros((1, 4, V)))
    assert arrays["accept_token_num"].tolist() == [2] and arrays["accept_index"].tolist() == [[0, 2, 3]]
    assert [arrays["predicts"][i].item() for i in (0, 2, 3)] == [6, 7, 2]


def _emits_a_wrong_path(parents, tokens, draft_probs, target_probs, generator):
    return [int(tokens[1]) + 1, 0], [1]  # the accepted node's token is not the emitted one


def test_bad_input_and_malformed_outputs():
    with pytest.raises(OtmError, match="unknown tree layout 'vllm'") as e:
        certify_tree("sglang", layout="vllm")
    assert len(str(e.value).splitlines()) == 1 and set(LAYOUTS) <= set(str(e.value).replace(",", " ").split())
    with pytest.raises(OtmError, match="in the sglang layout: give --layout sglang"):
        certify_tree("sglang", layout="generic")
    with pytest.raises(OtmError, match="k must be a whole number from 1 to 4"):
        certify_tree("rrs", layout="generic", k=5)
    with pytest.raises(OtmError, match="length must be a whole number from 1 to 3"):
        certify_tree("rrs", layout="generic", length=0)
    with pytest.raises(OtmError, match="unknown drafting scheme"):
        certify_tree("rrs", layout="generic", scheme="beam")
    with pytest.raises(OtmError, match="unknown tree kernel 'eagle'"):
        certify_tree("eagle", layout="generic")
    with pytest.raises(OtmError, match="must be a callable"):
        certify_tree(3, layout="generic")
    report = certify_tree(_emits_a_wrong_path, layout="generic", tv=0.5)  # a malformed output is a failing case
    assert not report.certified and "emitted token" in report.worst.reason
    assert set(PLANTED) == {"residual_not_updated", "bonus_from_parent", "correction_from_target"}


def test_the_command_line_refutes_a_planted_tree_kernel_and_names_bad_input_in_one_line(capsys):
    """`otm certify MODULE:FN --kind tree`: the planted bonus bug (exact TV 0.67) exits 1; a built-in kernel given
    another layout exits 2 with one line."""
    from otm.cli import main

    code = main(["certify", "tests.test_certify_tree:bonus_from_parent", "--kind", "tree", "--layout", "generic",
                 "--tv", "0.45", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["verdict"] == "refuted" and report["kind"] == "tree"
    assert main(["certify", "sglang", "--kind", "tree", "--layout", "generic"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--layout sglang" in err


bonus_from_parent = planted_kernel("bonus_from_parent")
