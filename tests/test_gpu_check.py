"""``make gpu-check``'s script in its quick mode on the CPU: the same code a GPU machine runs, so it cannot rot."""

from __future__ import annotations

import json

import pytest
from scripts import load_script

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("gpu_check")


def test_quick_mode_writes_its_report_and_the_planted_bug_is_rejected(gpu_check, tmp_path):
    assert gpu_check.main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    laws = {r["verifier"]: r for r in report["laws"]}
    import otm.torch as ot

    assert set(ot.VERIFIERS) < set(laws) and all(r["ok"] for r in laws.values())
    planted = [r for name, r in laws.items() if name.startswith("planted")]
    assert len(planted) == 1 and planted[0]["reject"]
    timed = {r["verifier"] for r in report["timings"]}
    assert set(ot.VERIFIERS) < timed and "transformers _speculative_sampling" in timed
    runs = {r["contender"]: r for r in report["decoder"]["runs"]}
    assert runs["autoregressive"]["block_efficiency"] == 1.0
    ceiling = runs["speculative k=1 L=4, the target as its own draft"]
    assert ceiling["block_efficiency"] > 3.0 and ceiling["host_reads_per_step"]["accept"] == 1.0
    assert "verify" not in ceiling["host_reads_per_step"]  # the walk reads nothing back (tests/test_decoder_syncs.py)
    static = runs["kseq k=4 L=2, 2-layer draft, static step"]  # the static-shape step's rows (quick: eager kernels)
    assert static["tokens"] == runs["kseq k=4 L=2, 2-layer draft"]["tokens"] and runs["autoregressive, static step"]
    for name in ("gpu_check.md", "verify_us.png", "verify_us.svg"):
        assert (tmp_path / name).stat().st_size > 0
    assert "## (c) the decoder" in (tmp_path / "gpu_check.md").read_text()
    engines = {(r["engine"], r["how"]): r for r in report["engines"]}  # (d): the engines' kernels in their layouts
    rewrite = engines["SGLang", "rewrite (otm.certify.tree_kernels, CPU)"]
    assert rewrite["verdict"] == "certified" and "--scheme top " in rewrite["command"]
    for engine in ("SGLang", "FlashInfer"):  # no CUDA kernel runs on the CPU: each says why
        real = [r for (e, how), r in engines.items() if e == engine and not how.startswith("rewrite")]
        assert len(real) == 1 and real[0]["verdict"] in ("not run: needs CUDA", "not installed (ModuleNotFoundError)")
    assert "## (d) the engines' kernels" in (tmp_path / "gpu_check.md").read_text()


def test_full_mode_without_a_gpu_says_so_in_one_line(gpu_check, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the full check would run")
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--quick" in err
