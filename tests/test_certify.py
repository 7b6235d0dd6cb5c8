"""otm.certify: the built-in verifiers certified over the whole bank, broken rules refuted, the power
guarantee of the statistical run checked against the noncentral chi-square, and the CLI.

Every built-in verifier x scheme is certified here in its three forms: the exact law (every draft
tuple of 16 fixed adversarial cases plus a hypothesis search), the numpy sampler (statistical, TV
0.05 detected with power >= 0.99 per case, to keep the suite short; the CLI default is 0.01) and the
batched torch verifier (statistical at the default TV 0.01). The planted-bug catalogue
(:mod:`otm.certify.mutants`) is refuted in tests/test_mutants.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import lru_cache

import numpy as np
import pytest
import torch

import otm.torch as ot
from otm.certify import certify, draws_for, load_rule
from otm.certify.rules import LAW_TOLERANCE, POWER
from otm.laws import OtmError
from otm.schemes import make_scheme
from otm.testing import chi2_power
from otm.verifiers import greedy, kseq, lp_optimal, rrs, rrs_without_replacement, spechub, speculative

EXACT = [
    (speculative, "iid", 1), (speculative, "without_replacement", 1), (kseq, "iid", 2), (kseq, "iid", 4),
    (rrs, "iid", 2), (rrs, "iid", 3), (rrs_without_replacement, "without_replacement", 2),
    (rrs_without_replacement, "without_replacement", 4), (greedy, "greedy", 2), (greedy, "greedy", 3),
    (spechub, "spechub", 2),
]
TORCH = [
    (ot.speculative, "iid", 1), (ot.kseq, "iid", 3), (ot.rrs, "iid", 3), (ot.rrs_without_replacement, "without_replacement", 3),
    (ot.greedy, "greedy", 3), (ot.spechub, "spechub", 2),
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize("module,scheme,k", EXACT, ids=lambda x: getattr(x, "__name__", str(x)).split(".")[-1])
def test_builtin_laws_certified_exactly(module, scheme, k):
    report = certify(module.law, kind="law", scheme=scheme, k=k, examples=150, seed=1)
    assert report.certified, str(report)
    assert all(c.law_error <= LAW_TOLERANCE for c in report.cases)
    assert all(c.acceptance <= c.optimum + LAW_TOLERANCE for c in report.cases)
    skipped = [n for n in report.notes if n.startswith("skipped")]
    assert len(report.cases) + len(skipped) == 16 and len(report.cases) >= 10  # every case checked or listed


def lp_optimal_law(scheme: str, k: int):
    """The LP-optimal rule as law(target, draft, drafts): one LP per (target, draft), cached."""

    @lru_cache(maxsize=None)
    def bound(t: bytes, q: bytes):
        target, draft = np.frombuffer(t), np.frombuffer(q)
        return lp_optimal.bind(target, make_scheme(scheme, draft, k))

    def law(target, draft, drafts):
        return bound(target.tobytes(), draft.tobytes()).law(drafts)

    return law


@pytest.mark.parametrize("scheme,k", [("iid", 2), ("without_replacement", 2), ("greedy", 3)])
def test_lp_optimal_certified_and_reaches_the_optimum(scheme, k):
    report = certify(lp_optimal_law(scheme, k), kind="law", scheme=scheme, k=k, examples=0)
    assert report.certified, str(report)
    for case in report.cases:
        assert abs(case.acceptance - case.optimum) < 1e-7, case.name


@pytest.mark.parametrize("module,scheme,k", EXACT[::2], ids=lambda x: getattr(x, "__name__", str(x)).split(".")[-1])
def test_builtin_samplers_certified(module, scheme, k):
    report = certify(module.sample, kind="sampler", scheme=scheme, k=k, tv=0.05, seed=2)
    assert report.certified, str(report)
    level = 1e-3 / (2 * len(report.cases))  # Bonferroni over the cases run
    assert report.detectable_tv == 0.05 and all(c.draws == draws_for(c.target, 0.05, level) for c in report.cases)


@pytest.mark.parametrize("rule,scheme,k", TORCH, ids=lambda x: getattr(x, "__name__", str(x)))
def test_builtin_torch_verifiers_certified_at_tv_001(rule, scheme, k):
    report = certify(rule, kind="torch", scheme=scheme, k=k, seed=3)
    assert report.certified, str(report)
    assert report.detectable_tv == 0.01


def test_wrong_scheme_refuted_with_reproducible_counterexample(capsys):
    """RRS with replacement on drafts drawn without replacement: refuted exactly, the shrunk hypothesis
    counterexample is small, and the report's command re-checks the worst case alone (exit 1)."""
    report = certify(rrs.law, kind="law", scheme="without_replacement", k=2, examples=200, name="otm.verifiers.rrs:law")
    assert not report.certified and report.exit_code == 1
    assert report.worst.law_error > 0.05
    shrunk = [c for c in report.cases if c.name.startswith("hypothesis")]
    assert shrunk and shrunk[0].target.size <= 4 and not shrunk[0].passed and shrunk[0].law_error > 0.01
    from otm.cli import main

    argv = report.command.split()[2:]  # drop "otm certify"
    assert main(["certify", *argv, "--json"]) == 1
    again = json.loads(capsys.readouterr().out)
    assert again["verdict"] == "refuted" and abs(again["worst"]["law_error"] - report.worst.law_error) < 1e-12


def test_acceptance_above_optimum_is_a_proof_of_invalidity():
    """A rule that always outputs its first draft accepts surely (1 > alpha*): refuted by the law kind
    and, statistically, by the acceptance interval even where the token test alone is weak."""

    def first_draft_law(target, draft, drafts):
        out = np.zeros_like(target)
        out[drafts[0]] = 1.0
        return out

    report = certify(first_draft_law, kind="law", scheme="iid", k=2, examples=0)
    assert not report.certified
    assert any("above alpha*" in c.reason for c in report.cases)

    def first_draft_sample(target, draft, drafts, rng):
        return int(drafts[0])

    # k = 1, TV(target, draft) = 0.02: the output law (the draft's) is off by only 0.02, alpha* = 0.98
    case = certify(first_draft_sample, kind="sampler", scheme="iid", k=1, tv=0.05,
                   target=[0.5, 0.3, 0.2], draft=[0.48, 0.32, 0.2]).cases[0]
    assert abs(case.optimum - 0.98) < 1e-12
    assert not case.passed and "above alpha*" in case.reason and case.acceptance_ci[0] > case.optimum


def test_boundary_probe_catches_u_leq_ratio():
    """``u * q <= p`` accepts a zero-target-mass draft when u == 0.0 exactly (SGLang #35771): a
    probability-0 event for continuous uniforms, caught by the probe, not by the chi-square."""

    def leq_sample(target, draft, drafts, rng):
        x = int(drafts[0])
        if rng.random() * draft[x] <= target[x]:
            return x
        res = np.maximum(target - draft, 0)
        return int(np.searchsorted(np.cumsum(res), rng.random() * res.sum(), side="right"))

    report = certify(leq_sample, kind="sampler", scheme="iid", k=1, tv=0.05)
    assert not report.certified
    failing = [c for c in report.cases if not c.passed]
    assert failing and all("exactly 0.0" in c.reason for c in failing)
    assert all(c.pvalue > 1e-5 for c in failing)  # the chi-square alone does not see it
    assert certify(speculative.sample, kind="sampler", scheme="iid", k=1, tv=0.05).certified


def test_torch_boundary_probe_and_bad_returns():
    def torch_leq(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
        out = ot.speculative(target, draft, drafts, uniforms=uniforms, generator=generator, validate=validate)
        if uniforms is not None:  # the planted bug: u <= ratio also takes zero-mass drafts when u == 0
            x = drafts[:, 0]
            take = uniforms[:, 0] * draft.gather(1, drafts)[:, 0] <= target.gather(1, drafts)[:, 0]
            return ot.Verified(torch.where(take, x, out.token), out.accepted)
        return out

    report = certify(torch_leq, kind="torch", scheme="iid", k=1, tv=0.05)
    assert not report.certified and any("exactly 0.0" in c.reason for c in report.cases)

    def no_uniforms(target, draft, drafts, *, generator=None):
        return ot.kseq(target, draft, drafts, generator=generator)

    report = certify(no_uniforms, kind="torch", scheme="iid", k=2, tv=0.1)
    assert report.certified and "boundary probe not run: the torch rule takes no uniforms= argument" in report.notes

    def wrong_shape(target, draft, drafts, *, generator=None):
        return drafts  # [n, k], not [n]

    report = certify(wrong_shape, kind="torch", scheme="iid", k=2, tv=0.05)
    assert not report.certified and "not a token tensor" in report.worst.reason


@pytest.mark.parametrize("tv", [0.01, 0.03])
def test_draws_give_the_stated_power_against_every_alternative(tv):
    """The sample size guarantees power >= 0.99 at TV = tv: checked with ``chi2_power`` against the least
    favourable alternative (shift proportional to the target) and against 200 random alternatives at
    exactly that TV on the merged cells, at the Bonferroni level of a 16-case bank."""
    level = 1e-3 / 32
    rng = np.random.default_rng(0)
    for target in (np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.3, 0.2, 0.07, 0.03]), rng.dirichlet(np.ones(6))):
        n = draws_for(target, tv, level)
        worst = target.copy()
        half = target.size // 2  # move tv of mass, in proportion to the target, from one half to the other
        d = np.concatenate([target[:half] / target[:half].sum(), -target[half:] / target[half:].sum()]) * tv
        assert abs(0.5 * np.abs(d).sum() - tv) < 1e-12
        assert chi2_power(n, target, worst + d, alpha=level) >= POWER - 1e-9
        for _ in range(200):
            raw = rng.normal(size=target.size)
            raw -= raw.mean()
            shift = raw / np.abs(raw).sum() * 2 * tv
            alt = target + shift
            if alt.min() < 0:
                continue
            assert chi2_power(n, target, alt, alpha=level) >= POWER - 1e-9
        assert chi2_power(n // 3, target, worst + d, alpha=level) < POWER  # and n is not wildly oversized
    point = np.array([0.0, 1.0, 0.0])
    n = draws_for(point, tv, level)
    assert 1 - (1 - tv) ** n >= POWER > 1 - (1 - tv) ** (n - 1)


def test_statistical_run_catches_a_realistic_small_bug():
    """K-SEQ with rho* computed for k - 1 drafts instead of k: its exact TV to the target is at least
    0.01 on some bank case (asserted), and the default torch run at TV 0.01 refutes it; the right rule
    passes the same run (test_builtin_torch_verifiers_certified_at_tv_001)."""

    def kseq_rho_k_minus_1(target, draft, drafts, *, generator=None, validate=True):
        rho = ot.rho_star(target, draft, drafts.shape[1] - 1)
        return ot.kseq(target, draft, drafts, rho=rho, generator=generator, validate=validate)

    def law(target, draft, drafts):
        return kseq.law(target, draft, drafts, rho=kseq.rho_star(target, draft, drafts.size - 1))

    exact = certify(law, kind="law", scheme="iid", k=3, examples=0)
    assert max(c.tv for c in exact.cases) >= 0.01
    assert not certify(kseq_rho_k_minus_1, kind="torch", scheme="iid", k=3).certified


def test_load_rule_and_bad_input(tmp_path):
    path = tmp_path / "my_rule.py"
    path.write_text("import numpy as np\n\ndef law(target, draft, drafts):\n    return np.asarray(target)\n")
    rule = load_rule(f"{path}:law")
    report = certify(rule, kind="law", scheme="iid", k=2, examples=10)
    assert report.certified  # emitting y ~ target, ignoring the drafts, is exact (and accepts little)
    assert all(c.acceptance <= c.optimum + 1e-12 for c in report.cases)
    for spec in ("nocolon", f"{tmp_path}/missing.py:law", f"{path}:nope", "otm.no_such_module:f", ":f", "otm.laws:SUM_TOLERANCE"):
        with pytest.raises(OtmError) as err:
            load_rule(spec)
        assert "\n" not in str(err.value)
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(OtmError, match="boom"):
        load_rule(f"{bad}:law")
    for kwargs in (dict(kind="nope"), dict(kind="law", k=0), dict(kind="law", scheme="greedy2"),
                   dict(kind="sampler", tv=0.0), dict(kind="sampler", alpha=2.0), dict(kind="law", target=[0.5, 0.5]),
                   dict(kind="law", target=[0.5, 0.5], draft=[0.2, 0.2, 0.6]),
                   dict(kind="law", target=[1.5, -0.5], draft=[0.5, 0.5]), dict(kind="law", examples=-1),
                   dict(kind="law", scheme="top", k=9)):
        rule = kseq.sample if kwargs["kind"] == "sampler" else kseq.law
        with pytest.raises(OtmError) as err:
            certify(rule, **kwargs)
        assert "\n" not in str(err.value)


def test_cli_certify_exit_codes_and_json(tmp_path):
    """Through a real subprocess: exit 0 certified, 1 refuted, 2 bad input with one line and no traceback."""
    otm = [sys.executable, "-m", "otm.cli", "certify"]

    def run(*args):
        return subprocess.run([*otm, *args], capture_output=True, text=True, timeout=300)

    ok = run("otm.verifiers.kseq:law", "--kind", "law", "-k", "2", "--examples", "20", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["verdict"] == "certified" and len(report["cases"]) == 16 + 0 and report["worst"]["law_error"] < 1e-9
    bad = run("otm.verifiers.rrs:law", "--kind", "law", "--scheme", "without_replacement", "-k", "2", "--examples", "0")
    assert bad.returncode == 1 and "REFUTED" in bad.stdout and "reproduce: otm certify" in bad.stdout
    for args in (["otm.verifiers.rrs:nope", "--kind", "law"], ["otm.verifiers.kseq:sample", "--kind", "law"],
                 ["otm.verifiers.kseq:law", "--kind", "law", "-k", "0"], ["otm.verifiers.kseq:law", "--kind", "law", "--target", "0.5,x"],
                 ["otm.verifiers.kseq:law", "--kind", "wrong"], ["otm.verifiers.kseq:law", "--kind", "law", "--scheme", "top", "-k", "9"]):
        r = run(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("otm: error:") and "Traceback" not in r.stderr, (args, r.stderr)
