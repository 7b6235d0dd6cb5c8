"""Optimality-gap tools: RRSw acceptance, the adversarial search (with negative controls), `otm gap`."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from otm.analysis import gap
from otm.verifiers import rrs_without_replacement
from otm.cli import main
from otm.exact import evaluate
from otm.laws import OtmError
from otm.schemes import WithoutReplacement
from otm.analysis.worst_case import bound, search
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- RRSw acceptance


def _cases(n, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        V = int(rng.integers(2, 7))
        k = int(rng.integers(1, min(V, 4) + 1))
        a = float(rng.choice([0.3, 1.0, 3.0]))
        p, q = rng.dirichlet(np.full(V, a)), rng.dirichlet(np.full(V, a))
        if i % 4 == 0 and V > k:  # a draft zero
            q[int(rng.integers(V))] = 0.0
            q /= q.sum()
        if i % 5 == 0:  # a target zero
            p[int(rng.integers(V))] = 0.0
            p /= p.sum()
        yield p, q, k


def test_rrsw_exact_matches_enumeration():
    worst = 0.0
    for p, q, k in _cases(40):
        ev = evaluate("rrs_without_replacement", WithoutReplacement(q, k), p)
        worst = max(worst, abs(rrs_without_replacement.acceptance_exact(p, q, k) - ev.acceptance))
    assert worst < 1e-12


def test_rrsw_monte_carlo_is_unbiased_within_its_error():
    # 30 independent estimates: the standardised errors must look like N(0, 1):
    # |z| < 4.5 each (a 1-in-150000 event per case) and a mean square below 3.
    zs = []
    rng = np.random.default_rng(1)
    for i in range(30):
        V = int(rng.integers(4, 8))
        k = int(rng.integers(2, 4))
        p, q = rng.dirichlet(np.full(V, 0.7)), rng.dirichlet(np.full(V, 0.7))
        truth = rrs_without_replacement.acceptance_exact(p, q, k)
        est = rrs_without_replacement.acceptance_monte_carlo(p, q, k, paths=3000, rng=i)
        if est.se < 1e-10:  # every path scores the same (k = 1, or a single rejection branch)
            assert abs(est.value - truth) < 1e-10
            continue
        zs.append((est.value - truth) / est.se)
    zs = np.array(zs)
    assert zs.size >= 25 and np.abs(zs).max() < 4.5 and (zs**2).mean() < 3.0


def test_rrsw_monte_carlo_negative_control():
    # the same z-test catches an estimator that is off by 1%: a wrong acceptance must fail it
    p, q = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.2, 0.3, 0.4])
    truth = rrs_without_replacement.acceptance_exact(p, q, 3)
    est = rrs_without_replacement.acceptance_monte_carlo(p, q, 3, paths=20000, rng=0)
    assert abs(est.value - truth) < 4.5 * est.se
    assert abs(est.value * 0.99 - truth) > 4.5 * est.se


def test_rrsw_acceptance_falls_back_to_monte_carlo_and_errors():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(40)), rng.dirichlet(np.ones(40))
    est = rrs_without_replacement.acceptance(p, q, 6, paths=500, rng=0, max_states=10_000)
    assert est.method == "monte_carlo" and est.se > 0 and 0 < est.value < 1
    assert rrs_without_replacement.acceptance(p, q, 2).method == "exact"
    with pytest.raises(OtmError, match="max_states"):
        rrs_without_replacement.acceptance_exact(p, q, 5, max_states=1000)
    with pytest.raises(OtmError, match="at least k=3"):
        rrs_without_replacement.acceptance_exact([0.5, 0.5, 0.0], [0.5, 0.5, 0.0], 3)
    with pytest.raises(OtmError, match="paths >= 2"):
        rrs_without_replacement.acceptance_monte_carlo(p, q, 2, paths=1)


# ----------------------------------------------------------------------------- adversarial search


SEARCH = dict(starts=2, maxiter=40, polish=200, seed=0)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_search_never_breaks_the_kseq_bound(k):
    w = search("kseq", k, 4, **SEARCH)
    assert w.ratio >= bound(k) - 1e-9
    assert w.ratio <= 1.0 + 1e-12
    # the search is doing work: it finds a pair well below ratio 1 (random pairs sit near 0.95+)
    assert w.ratio < 0.9
    # and the returned laws really give that ratio
    from otm.optimum import optimal_acceptance
    from otm.verifiers import kseq

    again = kseq.acceptance(w.target, w.draft, k) / optimal_acceptance(w.target, w.draft, k, "iid")
    assert again == pytest.approx(w.ratio, abs=1e-12)


def first_draft(p, q, k):
    """Negative control: single-draft speculative sampling on the first of the k i.i.d. drafts,
    sum_x min(p, q), a valid rule that ignores k - 1 drafts; its ratio tends to 1/k (target one-hot
    on a token of small draft mass), below 1-(1-1/k)^k for every k >= 2."""
    from otm.analysis.worst_case import MIN_OPTIMUM
    from otm.optimum import optimal_acceptance

    opt = optimal_acceptance(p, q, k, "iid")
    return float(np.minimum(p, q).sum()) / opt if opt >= MIN_OPTIMUM else 2.0  # as the search's own rules


def kseq_x08(p, q, k):
    """Negative control: K-SEQ's ratio scaled by 0.8."""
    from otm.analysis.worst_case import RULES

    return 0.8 * RULES["kseq"](p, q, k)


@pytest.mark.parametrize("rule", [first_draft, kseq_x08])
@pytest.mark.parametrize("k", [2, 3])
def test_search_negative_control_finds_a_violation(rule, k):
    # the same search, run on rules known to fall below 1-(1-1/k)^k, must find it
    w = search(rule, k, 4, **SEARCH)
    assert w.ratio < bound(k) - 1e-3


def test_search_bad_input():
    with pytest.raises(OtmError, match="unknown rule"):
        search("nope", 2, 4)
    with pytest.raises(OtmError, match="V >= 2"):
        search("kseq", 2, 1)


# ----------------------------------------------------------------------------- sweep and CLI


def test_bound_values():
    assert gap.bound(1) == 1.0
    assert gap.bound(2) == pytest.approx(0.75)
    assert np.all(np.diff(gap.bound(np.arange(1, 30))) < 0)
    assert gap.bound(1000) == pytest.approx(1 - 1 / np.e, abs=1e-3)


def test_evaluate_pair_consistent():
    t, d = gap.make_pair("dirichlet", 1.0, 0, 8, 0)
    row = gap.evaluate_pair(t, d, 3, paths=100, rng=0)
    assert row["rrsw_method"] == "exact"
    assert row["kseq"] <= row["opt_iid"] + 1e-12 and row["rrs"] <= row["opt_iid"] + 1e-12
    assert row["rrsw"] <= row["opt_wo"] + 1e-12
    assert row["kseq"] >= bound(3) * row["opt_iid"]
    assert row["greedy"] == pytest.approx(row["opt_greedy"], abs=1e-12)


def test_temperature_family_shares_base_pairs():
    a = gap.make_pair("temperature", 1.0, 3, 10, 0)
    b = gap.make_pair("temperature", 0.5, 3, 10, 0)
    # softmax(z/T) at T = 0.5 is the square of the T = 1 law, renormalised
    assert np.allclose(b[0], a[0] ** 2 / (a[0] ** 2).sum())
    with pytest.raises(OtmError, match="unknown family"):
        gap.make_pair("nope", 1.0, 0, 5, 0)


def test_otm_gap_cli_writes_outputs_and_resumes(tmp_path, capsys):
    argv = ["gap", "--out", str(tmp_path), "--V", "6", "--pairs", "2", "--kmax", "3", "--paths", "50", "--no-progress"]
    assert main(argv) == 0
    for stem in ("gap_ratios", "scheme_optimum", "temperature"):
        assert (tmp_path / f"{stem}.csv").stat().st_size > 0
        assert (tmp_path / f"{stem}.md").read_text().startswith(("Acceptance", "Median"))
    for fig in ("gap_ratio_vs_k", "scheme_optimum_vs_k", "acceptance_vs_temperature"):
        assert (tmp_path / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
        assert "<svg" in (tmp_path / f"{fig}.svg").read_text()[:1000]
    with (tmp_path / "gap_ratios.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["ratio"] for r in rows} == {"kseq", "rrs", "rrsw"}
    assert all(float(r["min"]) >= float(r["bound"]) - 1e-9 for r in rows if r["ratio"] == "kseq")
    # resume: drop one cached row and tear the one before (an interrupted write), rerun: both come
    # back identical, the rest is reused, and a second rerun computes nothing more
    cache = next((tmp_path / "cache").rglob("dirichlet-0.1.jsonl"))
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:20])
    assert main(argv) == 0
    again = cache.read_text().splitlines()
    assert again[:-3] == lines[:-2] and again[-3] == lines[-2][:20]
    assert sorted(again[-2:]) == sorted(lines[-2:])
    assert main(argv) == 0
    assert cache.read_text().splitlines() == again
    out = capsys.readouterr().out
    assert "wrote" in out


def test_otm_gap_bad_input(capsys):
    assert main(["gap", "--V", "4", "--kmax", "8", "--out", "/tmp/unused"]) == 2
    assert "kmax < V" in capsys.readouterr().err


def test_committed_worst_cases_respect_the_bound():
    path = ROOT / "docs" / "results" / "worst_cases.json"
    if not path.exists():
        pytest.skip("docs/results/worst_cases.json not generated yet")
    data = json.loads(path.read_text())
    kseq = [w for w in data["worst"] if w["rule"] == "kseq"]
    assert kseq and all(w["ratio"] >= bound(w["k"]) - 1e-9 for w in kseq)
    from otm.optimum import optimal_acceptance
    from otm.verifiers import kseq as kseq_rule

    for w in kseq:  # the saved laws reproduce the saved ratio
        t, d = np.array(w["target"]), np.array(w["draft"])
        r = kseq_rule.acceptance(t / t.sum(), d / d.sum(), w["k"]) / optimal_acceptance(t / t.sum(), d / d.sum(), w["k"], "iid")
        assert r == pytest.approx(w["ratio"], abs=1e-9)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="paper_table needs torch")
def test_paper_table_on_tiny_models(tmp_path):
    mod = load_script("paper_table")
    rows = mod.run(mod.tiny_loader, out=tmp_path, prompts=2, positions=2, ks=(2, 4), temperature=1.0, paths=50)
    assert {r["k"] for r in rows} == {2, 4}
    for r in rows:
        assert r["kseq"] <= r["opt_iid"] + 1e-9 and r["rrs"] <= r["opt_iid"] + 1e-9
        assert r["rrsw"] <= r["opt_wo"] + 3 * r["rrsw_se"] + 1e-9
        assert r["optimal"] - 1e-9 <= r["emb"] <= r["opt_wo"] + 3 * r["emb_se"] + 1e-9  # embedded: >= its iid rule
        assert max(r["kseq"], r["opt_wo"] / 2) - 1e-9 <= r["kseqw"] <= r["opt_wo"] + 1e-9  # proved bounds
        assert r["greedy"] == pytest.approx(r["opt_greedy"], abs=1e-9)
    assert (tmp_path / "paper_table.md").read_text().count("|") > 10
