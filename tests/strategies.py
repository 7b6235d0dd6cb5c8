"""Hypothesis strategies for (target, draft) pairs, edge cases included: the certify bank's own.

Masses mix exact zeros, tiny values (1e-12 .. 1e-7) and ordinary ones; the pair kinds add
identical laws, disjoint supports and point masses (:mod:`otm.certify.bank`).
"""

from otm.certify.bank import MASS, PAIR_KINDS as KINDS, law, pairs as pair

__all__ = ["MASS", "KINDS", "law", "pair"]
