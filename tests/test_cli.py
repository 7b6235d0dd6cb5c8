import json
import subprocess
import sys

import pytest

from otm.cli import main

BASE = ["acceptance", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "-k", "2"]


def run(args):
    """The installed console entry, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "otm.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("scheme", ["iid", "without_replacement", "greedy", "spechub"])
def test_json_is_one_object_with_every_applicable_verifier(scheme, capsys):
    assert main([*BASE, "--scheme", scheme, "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)  # exactly one JSON document
    assert set(report) == {"scheme", "k", "optimal", "verifiers"}
    assert report["scheme"] == scheme and report["k"] == 2
    assert abs(report["optimal"]["lp"] - report["optimal"]["fast"]) < 1e-9
    expected = {
        "iid": {"kseq", "rrs", "lp_optimal"},
        "without_replacement": {"rrs_without_replacement", "lp_optimal"},
        "greedy": {"greedy", "lp_optimal"},
        "spechub": {"spechub", "lp_optimal"},
    }[scheme]
    assert set(report["verifiers"]) == expected
    for r in report["verifiers"].values():
        assert r["law_error"] < 1e-9
        assert r["acceptance"] <= report["optimal"]["lp"] + 1e-9
    assert abs(report["verifiers"]["lp_optimal"]["acceptance"] - report["optimal"]["lp"]) < 1e-9


def test_k1_lists_speculative(capsys):
    assert main(["acceptance", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "-k", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert abs(report["verifiers"]["speculative"]["acceptance"] - 0.6) < 1e-12


def test_table_output(capsys):
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert "kseq" in out and "optimum" in out and "law error" in out


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--target", "0.5,-0.3,0.8", "--draft", "0.2,0.2,0.6"], "negative"),
        (["--target", "0.5,nan,0.5", "--draft", "0.2,0.2,0.6"], "non-finite"),
        (["--target", "0.5,0.3,0.3", "--draft", "0.2,0.2,0.6"], "sums to"),
        (["--target", "0.5,0.5", "--draft", "0.2,0.2,0.6"], "same vocabulary"),
        (["--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "-k", "0"], "k must be >= 1"),
        (["--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "-k", "x"], "invalid int"),
        (["--target", "a,b", "--draft", "0.2,0.2,0.6"], "comma-separated"),
        (["--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "--scheme", "beam"], "invalid choice"),
        (
            ["--target", ",".join(["0.0625"] * 16), "--draft", ",".join(["0.0625"] * 16), "-k", "4",
             "--max-lp-variables", "1000"],
            "variables",
        ),
    ],
)
def test_bad_input_one_line_nonzero_no_traceback(args, fragment):
    proc = run(["acceptance", *args])
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("otm: error:") and fragment in lines[0]
    assert "Traceback" not in proc.stderr


def test_console_script_json():
    proc = run([*BASE, "--json"])
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["scheme"] == "iid"


def test_demo_tables_without_models(capsys):
    assert main(["demo", "--no-decode"]) == 0
    out = capsys.readouterr().out
    assert out.count("optimum alpha* (LP, HiGHS)") == len(__import__("otm.cli").cli.DEMO_CASES)
    assert "part 2" not in out


def test_demo_bad_token_budget_fails_before_printing():
    proc = run(["demo", "--max-new-tokens", "0"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("otm: error:") and "max-new-tokens" in proc.stderr


@pytest.mark.model
def test_demo_decodes_with_the_embedded_models():
    proc = subprocess.run([sys.executable, "-m", "otm.cli", "demo", "--prompts", "1", "--max-new-tokens", "8"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "contender" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["autoregressive", "speculative k=1 L=4", "kseq k=4 L=4"]
    for r in rows:
        assert int(r.split("|")[2]) == 8  # every contender emitted its 8 tokens
