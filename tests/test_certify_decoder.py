"""otm certify --kind decoder: a verifier certified end to end inside the real decoder (exact mode on toy
models), a broken rule refuted exactly and statistically, every planted decoder bug refuted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import otm.torch as ot
from otm.certify import certify
from otm.certify.decoder import SETTINGS, certify_decoder
from otm.certify.decoder_mutants import DECODER_MUTANTS, NOT_EXACTNESS_BUGS, exact_tv
from otm.laws import OtmError

from test_decode import naive_torch

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize("verifier,scheme,k", [(ot.kseq, "iid", 3), (ot.rrs, "iid", 2), (ot.speculative, "iid", 1),
                                               (ot.rrs_without_replacement, "without_replacement", 2)])
def test_builtin_verifiers_certified_exactly_in_the_decoder(verifier, scheme, k):
    report = certify(verifier, kind="decoder", scheme=scheme, k=k, length=2)
    assert report.certified, str(report)
    assert len(report.cases) == len(SETTINGS) and all(c.law_error < 1e-12 for c in report.cases)
    assert report.method.startswith("exact")


def test_naive_rule_refuted_exactly_and_statistically():
    exact = certify_decoder(naive_torch, k=2, length=2)
    assert not exact.certified and exact.worst.law_error > 1e-3

    def opaque(target, draft, drafts, *, generator=None, validate=True):  # the same rule, no exact law
        return naive_torch(target, draft, drafts, generator=generator, validate=validate)

    stat = certify_decoder(opaque, k=2, length=2, tv=0.1)
    assert not stat.certified and stat.method.startswith("statistical") and stat.worst.pvalue < 1e-3

    def opaque_kseq(target, draft, drafts, *, generator=None, validate=True):
        return ot.kseq(target, draft, drafts, generator=generator, validate=validate)

    assert certify_decoder(opaque_kseq, k=2, length=2, tv=0.1, seed=1).certified  # the same run passes a valid rule


@pytest.mark.parametrize("name", sorted(DECODER_MUTANTS))
def test_every_planted_decoder_bug_is_refuted(name):
    mutant = DECODER_MUTANTS[name]
    assert exact_tv(mutant) > 1e-3
    with mutant.plant():
        report = certify(ot.kseq, kind="decoder", scheme="iid", k=2, length=2)
    assert not report.certified, name


def test_a_bug_that_only_lowers_acceptance_is_not_flagged():
    for mutant in NOT_EXACTNESS_BUGS.values():
        with mutant.plant():
            assert certify(ot.kseq, kind="decoder", scheme="iid", k=2, length=3).certified


def test_cli_kind_decoder(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "otm.cli", "certify", *args], capture_output=True, text=True,
                              timeout=300)

    ok = run("otm.torch:rrs", "--kind", "decoder", "-k", "2", "--length", "2", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "certified"
    path = tmp_path / "naive.py"
    path.write_text("import sys\nsys.path.insert(0, %r)\nfrom test_decode import naive_torch\n" % str(
        __import__("pathlib").Path(__file__).parent))
    bad = run(f"{path}:naive_torch", "--kind", "decoder", "-k", "2")
    assert bad.returncode == 1 and "REFUTED" in bad.stdout
    for args in (["otm.torch:kseq", "--kind", "decoder", "--length", "0"], ["otm.torch:kseq", "--kind", "law", "--length", "2"],
                 ["otm.torch:kseq", "--kind", "decoder", "--target", "0.5,0.5"]):
        r = run(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_bad_input():
    with pytest.raises(OtmError, match="exact law"):
        certify_decoder(lambda t, q, d, *, generator=None, validate=True: None, exact=True)
    with pytest.raises(OtmError):
        certify_decoder("kseq", scheme="without_replacement")
