"""otm certify --kind decoder: a verifier certified end to end inside the real decoder (exact mode on toy
models), a broken rule refuted exactly and statistically, every planted decoder bug refuted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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


@pytest.mark.slow
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


@pytest.mark.slow
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
        code, err = _main_in_process(["certify", *args])  # otm's own main: the CLI's code, without a 2 s start
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)


def _main_in_process(argv):
    """``(exit code, stderr)`` of ``otm.cli.main(argv)`` run in this process."""
    import contextlib
    import io

    from otm.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def test_bad_input():
    with pytest.raises(OtmError, match="exact law"):
        certify_decoder(lambda t, q, d, *, generator=None, validate=True: None, exact=True)
    with pytest.raises(OtmError):
        certify_decoder("kseq", scheme="without_replacement")


# -- whole-tree rules: built-in by name, and a user's own TreeRule -----------------------------------------

USER_TREE_RULES = '''
"""A user's whole-tree rules: block verification of the first row only (exact), and the same with the
classic slip of resampling the target after a rejection instead of drawing from the residual."""
import torch
from otm.decode.tree_rules import TreeRule, block_law


class FirstRowBlock(TreeRule):
    name = "first-row block"
    resample_target = False

    def walk(self, dec, tree, drafts, target_laws):
        nodes = tree.node_of[0].tolist()  # row 0's chain: root, depth 1 .. L
        chain = torch.tensor([int(tree.tokens[n]) for n in nodes[1:]])
        q = torch.cat([dec.node_draft_law(tree, n, drafts) for n in nodes[:-1]])
        tau_law, residuals = block_law(target_laws[nodes], q, chain)
        tau = dec.chance.index(tau_law[None])
        emitted = chain[:tau].tolist()
        if tau == len(chain) or self.resample_target:
            emitted.append(dec.bonus(tree, nodes[tau], target_laws))
        else:
            emitted.append(dec.chance.index(residuals[tau : tau + 1]))
        return emitted, nodes[1 : tau + 1]


class ResamplesTarget(FirstRowBlock):
    name = "first-row block, resampling the target"
    resample_target = True
'''


@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_traversal_is_certified_by_name_in_the_decoder(scheme):
    report = certify("traversal", kind="decoder", scheme=scheme, k=2, length=2)
    assert report.certified, str(report)
    assert all(c.law_error < 1e-12 for c in report.cases) and report.method.startswith("exact")
    assert "otm certify traversal --kind decoder" in report.command


@pytest.mark.slow
def test_a_users_tree_rule_is_certified_or_refuted_from_the_cli(tmp_path):
    path = tmp_path / "my_tree_rules.py"
    path.write_text(USER_TREE_RULES)
    ok = subprocess.run([sys.executable, "-m", "otm.cli", "certify", f"{path}:FirstRowBlock", "--kind", "decoder", "-k", "2",
                         "--length", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["certified"] is True
    bad = subprocess.run([sys.executable, "-m", "otm.cli", "certify", f"{path}:ResamplesTarget", "--kind", "decoder", "-k",
                          "2", "--length", "2"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "REFUTED" in bad.stdout, bad.stdout + bad.stderr
    code, err = _main_in_process(["certify", "travesal", "--kind", "decoder"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "traversal" in err and "Traceback" not in err
