"""Certify anyone's rule: a proof of exactness, or the smallest counterexample, and the gap to alpha*.

A researcher or engine developer hands ``otm`` a verifier in one of four forms and gets a
:class:`~otm.certify.report.Report`: certified or refuted, every case checked, the worst case
with a one-line command that reproduces it, and the acceptance against the scheme's optimum.

===========  ========================================================  ==========================
kind         the rule                                                  certified by
===========  ========================================================  ==========================
``law``      ``law(target, draft, drafts) -> [V]`` (numpy)             enumeration + hypothesis
``sampler``  ``sample(target, draft, drafts, rng) -> token`` (numpy)   calibrated chi-square
``torch``    batched, signature of :data:`otm.torch.VERIFIERS`         calibrated chi-square
``decoder``  a torch verifier inside ``speculative_decode``            exact mode / chi-square
``chain``    an engine's chain kernel in its layout (:mod:`.chain`)    exact mode / chi-square
===========  ========================================================  ==========================

>>> from otm.certify import certify
>>> from otm.verifiers import rrs
>>> certify(rrs.law, kind="law", scheme="iid", k=3, examples=10).verdict
'certified'

Modules: :mod:`~otm.certify.rules` (law, sampler, torch), :mod:`~otm.certify.bank` (the laws),
:mod:`~otm.certify.report`, :mod:`~otm.certify.decoder` (end to end), :mod:`~otm.certify.mutants`
(planted bugs), :mod:`~otm.certify.engines` (real engines' rules for the audit).
"""

from .bank import CERTIFY_SCHEMES, Instance, fixed_bank, pairs
from .chain import assert_lossless, certify_chain
from .report import Case, Report
from .rules import DEFAULT_ALPHA, DEFAULT_TV, KINDS, LAW_TOLERANCE, certify, draws_for, load_rule

__all__ = [
    "CERTIFY_SCHEMES",
    "Case",
    "DEFAULT_ALPHA",
    "DEFAULT_TV",
    "Instance",
    "KINDS",
    "LAW_TOLERANCE",
    "Report",
    "assert_lossless",
    "certify",
    "certify_chain",
    "draws_for",
    "fixed_bank",
    "load_rule",
    "pairs",
]
