"""The research searches of ``analysis/research/`` run from their place, as their README says, and a short
run of each still finds what its claim says (``research``: ``make test-slow``, about 30 s on one core).

Each script runs as a subprocess from the repository root with a few cases; the assertion is the script's
claim on those cases (no counterexample, no mismatch, the bound holds), so a script that breaks, or a
change to the code it checks that breaks the claim, fails here. The full runs behind the quoted results
are in ``analysis/research/README.md``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from scripts import ROOT

pytestmark = pytest.mark.research  # research scripts: make test-slow, not make test


def run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, f"analysis/research/{script}", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_kseq_wor_search_finds_no_violation_of_the_proved_bounds(tmp_path):
    run("kseq_wor_search.py", "--cases", "20", "--attacks", "1", "--iters", "30", "--rrsw-attacks", "1",
        "--out", str(tmp_path))
    result = json.loads((tmp_path / "kseq_wor_search.json").read_text())
    assert result["violations_of_the_bounds"] == 0


def test_prefix_property_search_finds_no_counterexample():
    text = run("prefix_property_search.py", "--seconds", "3")
    gap = float(re.search(r"largest prefix gap .*?: (\S+)", text).group(1))
    slack = float(re.search(r"smallest relative slack of \(E\): (\S+)", text).group(1))
    assert 0 <= gap < 1e-14 and slack > -1e-12


def test_window_vs_reference_finds_no_mismatch():
    text = run("window_vs_reference.py", "--seconds", "3", "--max-log10-V", "2.5")
    cases, mismatches = map(int, re.search(r"(\d+) cases, (\d+) mismatches", text).groups())
    assert cases > 0 and mismatches == 0


def test_wor_selection_search_layered_luce_reaches_alpha_star():
    text = run("wor_selection_search.py", "--cases", "30", "--luce")
    cases = int(re.search(r"^(\d+) cases", text, re.M).group(1))
    exact = int(re.search(r"^layer_luce\s+exact\(gap<1e-12\)\s+(\d+)", text, re.M).group(1))
    assert cases > 0 and exact == cases


def test_gbv_table_lp_equals_block_verification_at_one_path():
    text = run("tree_rules/gbv_table.py", "a")
    assert float(re.search(r"largest \|LP - block\| = (\S+)", text).group(1)) < 1e-12
