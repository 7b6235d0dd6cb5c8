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
    assert set(report) == {"scheme", "k", "V", "optimal", "methods", "verifiers", "skipped"}
    assert report["scheme"] == scheme and report["k"] == 2
    assert abs(report["optimal"]["lp"] - report["optimal"]["fast"]) < 1e-9
    expected = {
        "iid": {"kseq", "rrs", "lp_optimal", "optimal"},
        "without_replacement": {"rrs_without_replacement", "lp_optimal", "optimal_without_replacement", "optimal_embedded",
                                "kseq_without_replacement"},
        "greedy": {"greedy", "lp_optimal"},
        "spechub": {"spechub", "lp_optimal"},
    }[scheme]
    assert set(report["verifiers"]) == expected
    for r in report["verifiers"].values():
        assert r["law_error"] < 1e-9
        assert r["acceptance"] <= report["optimal"]["lp"] + 1e-9
    assert abs(report["verifiers"]["lp_optimal"]["acceptance"] - report["optimal"]["lp"]) < 1e-9


def test_table_columns_line_up_with_the_longest_verifier_name(capsys):
    """optimal_without_replacement (27 characters) once ran into its acceptance column."""
    assert main([*BASE, "--scheme", "without_replacement"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ") and "draft tuples" in line]
    assert any(r.split()[0] == "optimal_without_replacement" for r in rows)
    ends = {line.index(line.split()[1]) + len(line.split()[1]) for line in rows}  # where each acceptance ends
    assert len(ends) == 1 and all(line.split()[0] + " " in line for line in rows)


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
        (["--target", "/nonexistent/t.npy", "--draft", "0.2,0.2,0.6"], "does not exist"),
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
    import re

    choice = [line for line in proc.stdout.splitlines() if line.startswith("auto: ")]
    assert len(choice) == 1, proc.stdout[-2000:]
    found = re.match(r"auto: (\w+) k=(\d+) L=(\d+), predicted", choice[0])
    if found is None:  # no tree predicted to beat autoregressive sampling here: said in one line, no table
        assert "no configuration tried is predicted to beat autoregressive" in choice[0] and not rows
        return
    v, k, L = found.group(1), int(found.group(2)), int(found.group(3))
    names = ["autoregressive", f"speculative k=1 L={L}"] + ([f"{v} k={k} L={L}"] if k > 1 else [])
    assert [r.split("|")[1].strip() for r in rows] == names
    for r in rows:
        assert int(r.split("|")[2]) == 8  # every contender emitted its 8 tokens
    best = [line for line in proc.stdout.splitlines() if line.startswith("autoregressive: ")]
    assert len(best) == 1 and "best speculative row: " in best[0] and "x autoregressive (this run" in best[0]


def test_lp_too_large_is_skipped_and_said(capsys):
    """An LP over --max-lp-variables is not built; the optimum and every verifier but lp_optimal come from
    closed forms, and the output says which method gave each number."""
    laws = ",".join(["0.0625"] * 16)
    assert main(["acceptance", "--target", laws, "--draft", laws, "-k", "4", "--max-lp-variables", "1000", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["optimal"]["lp"] is None and "not built" in report["methods"]["lp"]
    assert abs(report["optimal"]["fast"] - 1.0) < 1e-12
    assert "lp_optimal" in report["skipped"] and set(report["verifiers"]) == {"kseq", "rrs", "optimal"}


def test_laws_from_files_at_real_vocabulary(tmp_path, capsys):
    """.npy / .json / .txt laws, one or a batch of rows; at V = 2000 the numbers come from closed forms
    (which agree with enumeration where both run, checked at V = 3)."""
    import numpy as np

    rng = np.random.default_rng(0)
    V = 2000
    t, d = rng.dirichlet(np.full(V, 0.1), size=2), rng.dirichlet(np.full(V, 0.1), size=2)
    np.save(tmp_path / "t.npy", t)
    np.save(tmp_path / "d.npy", d)
    assert main(["acceptance", "--target", str(tmp_path / "t.npy"), "--draft", str(tmp_path / "d.npy"), "-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 2 and out["rows"][0]["V"] == V
    for row in out["rows"]:
        assert row["verifiers"]["kseq"]["method"].startswith("closed form")
        assert row["verifiers"]["kseq"]["acceptance"] <= row["optimal"]["fast"] + 1e-12
    assert abs(out["mean"]["optimal"] - np.mean([r["optimal"]["fast"] for r in out["rows"]])) < 1e-12
    small_t, small_d = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    (tmp_path / "t.json").write_text(json.dumps(small_t))
    (tmp_path / "d.txt").write_text("# a draft law\n0.2 0.2 0.6\n")
    assert main(["acceptance", "--target", str(tmp_path / "t.json"), "--draft", str(tmp_path / "d.txt"), "-k", "2", "--json"]) == 0
    from_files = json.loads(capsys.readouterr().out)
    assert main(["acceptance", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "-k", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == from_files
    from otm.verifiers import VERIFIERS

    for name, value in from_files["verifiers"].items():
        if name != "lp_optimal":
            assert abs(VERIFIERS[name].acceptance(np.array(small_t), np.array(small_d), 2)[0] - value["acceptance"]) < 1e-12


def test_law_files_bad_input(tmp_path):
    import numpy as np

    np.save(tmp_path / "three.npy", np.full((3, 4), 0.25))
    np.save(tmp_path / "two.npy", np.full((2, 4), 0.25))
    np.save(tmp_path / "cube.npy", np.full((2, 2, 2), 0.25))
    (tmp_path / "ragged.txt").write_text("0.5 0.5\n0.2 0.3 0.5\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "neg.txt").write_text("0.5 0.5\n1.5 -0.5\n")
    cases = [
        (["--target", str(tmp_path / "three.npy"), "--draft", str(tmp_path / "two.npy")], "give as many of each"),
        (["--target", str(tmp_path / "cube.npy"), "--draft", "0.5,0.5"], "shape"),
        (["--target", str(tmp_path / "ragged.txt"), "--draft", "0.5,0.5"], "different lengths"),
        (["--target", str(tmp_path / "bad.json"), "--draft", "0.5,0.5"], "not a law"),
        (["--target", str(tmp_path / "neg.txt"), "--draft", "0.5,0.5"], "target row 1 has a negative mass"),
        (["--target", str(tmp_path / "three.npy"), "--draft", "0.5,0.5"], "same vocabulary"),
    ]
    for args, fragment in cases:
        proc = run(["acceptance", *args])
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_a_rule_whose_exact_law_has_its_own_limit_falls_back_to_its_closed_form(monkeypatch):
    from otm.cli import acceptance_report
    from otm.verifiers import optimal_embedded

    monkeypatch.setattr(optimal_embedded, "MAX_K", 2)  # its law now refuses k = 3
    report = acceptance_report([0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], 3, "without_replacement")
    entry = report["verifiers"]["optimal_embedded"]
    assert entry["law_error"] is None and "selection acceptance" in entry["method"]
    assert report["verifiers"]["rrs_without_replacement"]["law_error"] < 1e-9  # the others still enumerated
