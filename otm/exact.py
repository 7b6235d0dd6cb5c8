r"""Exact evaluation: enumerate a scheme's draft tuples and integrate a verifier.

For a scheme with tuple law :math:`P(\bar x)` and a verifier with conditional
law :math:`\pi(y \mid \bar x)`:

.. math::

    \mathrm{out}(y) = \sum_{\bar x} P(\bar x)\, \pi(y \mid \bar x), \qquad
    \alpha = \sum_{\bar x} P(\bar x) \sum_{y \in \mathrm{set}(\bar x)} \pi(y \mid \bar x).

A verifier is valid iff ``out == target``; ``law_error`` is
:math:`\max_y |\mathrm{out}(y) - p(y)|`.

>>> from otm.schemes import IID
>>> ev = evaluate("kseq", IID([0.2, 0.2, 0.6], 2), [0.5, 0.3, 0.2])
>>> round(ev.acceptance, 6), ev.law_error < 1e-12
(0.78533, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .laws import OtmError
from .schemes import MAX_ENUMERATION, Scheme, check_target
from .verifiers import VERIFIERS, Verifier


@dataclass(frozen=True)
class Evaluation:
    verifier: str
    scheme: str
    k: int
    law: np.ndarray  # [V] exact output law
    law_error: float  # max |law - target|
    acceptance: float  # P(output in set(drafts))


def evaluate(verifier: str | Verifier, scheme: Scheme, target, *, limit: int = MAX_ENUMERATION) -> Evaluation:
    """Exact output law, its largest deviation from ``target``, and the acceptance."""
    target = check_target(scheme, target)
    v = VERIFIERS.get(verifier) if isinstance(verifier, str) else verifier
    if v is None:
        raise OtmError(f"unknown verifier {verifier!r}: choose one of {', '.join(VERIFIERS)}")
    if not v.applies(scheme):
        raise OtmError(f"verifier {v.name} is not exact for the {scheme.name} scheme with k={scheme.k}")
    tuples, probs = scheme.enumerate(limit)
    bound = v.bind(target, scheme)
    out = np.zeros(scheme.V)
    acc = 0.0
    for t, pr in zip(tuples, probs):
        cond = bound.law(t)
        out += pr * cond
        acc += pr * cond[np.unique(t)].sum()
    return Evaluation(v.name, scheme.name, scheme.k, out, float(np.abs(out - target).max()), float(acc))
