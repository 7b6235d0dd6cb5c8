"""The planted-bug catalogue (otm.certify.mutants): ``otm certify`` refutes every mutant in every form
it is written in, exactly (law form: every draft tuple of the bank) or statistically (sampler at TV
0.05, torch at the default TV 0.01, both with power >= 0.99 per case), and the size of each bug, its
exact total variation from the target, is what docs/certify.md lists. The correct rules pass the same
runs (tests/test_certify.py): each mutant's refutation is the negative control of that pass."""

from __future__ import annotations

import pytest

from otm.certify import certify
from otm.certify.mutants import MUTANTS, RARE_BRANCH, exact_tv

FORMS = [(name, form) for name, m in MUTANTS.items() for form in m.forms]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_catalogue_has_ten_realistic_bugs_with_a_stated_size():
    assert len(MUTANTS) >= 10
    for m in MUTANTS.values():
        assert m.forms and m.mistake and m.breaks.startswith("otm.")
        tv = exact_tv(m)
        if m.law is not None:
            assert tv > 1e-3, (m.name, tv)  # a real deviation of the output law, measured exactly


def test_rare_branch_is_small_yet_caught_exactly():
    """A 5% wrong branch moves at most 0.02 of mass: below what a TV-0.01 run sees on most laws, still
    caught by the exact law on every draft tuple."""
    tv = exact_tv(MUTANTS["kseq_rare_naive_branch"])
    assert 1e-3 < tv < 0.05 and RARE_BRANCH == 0.05


@pytest.mark.parametrize("name,form", FORMS)
def test_certify_refutes_every_mutant(name, form):
    m = MUTANTS[name]
    rule = {"law": m.law, "sampler": m.sample, "torch": m.torch}[form]
    report = certify(rule, kind=form, scheme=m.scheme, k=m.k, tv=0.05 if form == "sampler" else 0.01, examples=100)
    assert not report.certified, str(report)
    assert not report.worst.passed and report.worst.reason
    assert report.command.startswith("otm certify ")
