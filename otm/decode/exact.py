r"""Exact law of the decoder's first T new tokens, by enumeration (small V, k, T).

The decoder's law depends only on the processed next-token laws of both models along each
prefix and on the per-node rule. :func:`decoder_law` follows the decoder's steps exactly
(:mod:`otm.decode.decoder`): depth ``L' = min(L, remaining - 1)`` per step; at a node with m
rows, the drafts are every ordered m-tuple of the scheme (i.i.d. from the node's draft law, or,
at the root of ``without_replacement``, successive sampling without replacement of
``min(k, support)`` tokens; below that root, single continuations); the rule's exact output law
given the tuple (``otm.verifiers.<name>.law``) decides the token y; y continues at the child
with the multiplicity of y among the drafts, or ends the step; at a leaf y is the target's
bonus draw. States are memoised on (prefix, depth, m, L').

It turns Theorem 2 into a computation: with a valid rule the result equals the target's law of
T-token continuations to rounding (tests check 1e-12), and with a broken rule it gives that
rule's exact law, from which the power of the Monte Carlo test against it follows.

>>> import numpy as np
>>> from otm.verifiers import kseq
>>> laws = {0: np.array([0.6, 0.4]), 1: np.array([0.3, 0.7])}
>>> target = lambda prefix: laws[prefix[-1] if prefix else 0]
>>> draft = lambda prefix: np.array([0.5, 0.5])
>>> law = decoder_law(target, draft, T=2, k=2, length=2, rule=kseq.law)
>>> round(law[(0, 1)], 12), round(target_law(target, 2)[(0, 1)], 12)
(0.24, 0.24)
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from functools import lru_cache
from typing import Callable

import numpy as np

Law = Callable[[tuple], np.ndarray]


def target_law(target: Law, T: int, eos: int | None = None) -> dict[tuple, float]:
    """Law of the first T tokens sampled autoregressively from ``target(prefix)`` (stop after ``eos``)."""
    out: dict[tuple, float] = {}

    def rec(prefix: tuple, prob: float) -> None:
        if len(prefix) == T or (prefix and prefix[-1] == eos):
            out[prefix] = out.get(prefix, 0.0) + prob
            return
        p = target(prefix)
        for y in np.flatnonzero(p > 0):
            rec(prefix + (int(y),), prob * float(p[y]))

    rec((), 1.0)
    return out


def _tuples(q: np.ndarray, m: int, without_replacement: bool):
    """``(tuple, probability)`` of every ordered m-tuple of drafts from ``q``."""
    support = [int(x) for x in np.flatnonzero(q > 0)]
    if not without_replacement:
        for tup in itertools.product(support, repeat=m):
            yield tup, float(np.prod(q[list(tup)]))
        return
    for tup in itertools.permutations(support, m):
        prob, left = 1.0, 1.0
        for x in tup:  # successive sampling: q(x) / (1 - mass already drawn)
            prob *= q[x] / left
            left -= q[x]
        yield tup, float(prob)


def decoder_law(
    target: Law,
    draft: Law,
    *,
    T: int,
    k: int,
    length: int,
    rule: Callable,
    scheme: str = "iid",
    deep_rule: Callable | None = None,
    eos: int | None = None,
    feature_draft: bool = False,
) -> dict[tuple, float]:
    """Exact law of the decoder's first T tokens.

    Parameters
    ----------
    target, draft : prefix (tuple of new tokens) -> processed next-token law (numpy, sums to 1).
    T, k, length : tokens, drafts per position, draft depth L.
    rule : ``law(target, draft, drafts) -> output law`` at the root (and below it for ``iid``).
    scheme : ``"iid"`` or ``"without_replacement"``.
    deep_rule : rule below the root (default: ``rule`` for iid, ``speculative.law`` for
        without_replacement, as :func:`otm.decode.decoder.resolve_verifiers`).
    eos : a token that ends the sequence.
    feature_draft : the decoder with a draft that reads the target's features
        (:class:`otm.feature_draft.FeatureDraft`): its first step drafts nothing (the prompt's
        features come from that step's target pass), and ``draft`` is called as
        ``draft(prefix, depth)``: within a step the draft reads its own guesses of the features
        of the tokens it drafted, so its law at a node depends on how many of the prefix's last
        tokens were drafted in this step (``depth``), not on the prefix alone.
    """
    from ..verifiers import speculative

    if deep_rule is None:
        deep_rule = rule if scheme == "iid" else speculative.law
    wo = scheme == "without_replacement"

    def add(out, y, tails, weight):
        for tail, v in tails.items():
            out[(y,) + tail] += weight * v

    @lru_cache(maxsize=None)
    def from_step(prefix: tuple):
        if len(prefix) == T or (prefix and prefix[-1] == eos):
            return {(): 1.0}
        first = feature_draft and not prefix  # a feature draft waits for the prompt's features
        return at_node(prefix, 0, k, 0 if first else min(length, T - len(prefix) - 1))

    def after(prefix: tuple, y: int, depth: int, m: int, L: int):
        if y == eos or m == 0:
            return from_step(prefix + (y,))
        return at_node(prefix + (y,), depth + 1, m, L)

    @lru_cache(maxsize=None)
    def at_node(prefix: tuple, depth: int, m: int, L: int):
        p = np.asarray(target(prefix), dtype=np.float64)
        out: dict[tuple, float] = defaultdict(float)
        if depth == L:  # leaf or no drafts: the target's own draw
            for y in np.flatnonzero(p > 0):
                add(out, int(y), from_step(prefix + (int(y),)), float(p[y]))
            return dict(out)
        q = np.asarray(draft(prefix, depth) if feature_draft else draft(prefix), dtype=np.float64)
        root_wo = wo and depth == 0
        n = min(m, int((q > 0).sum())) if root_wo else m
        law_of = rule if depth == 0 else deep_rule
        mix: dict[tuple[int, int], float] = defaultdict(float)  # (y, multiplicity of y in drafts) -> probability
        for tup, w in _tuples(q, n, root_wo):
            if w == 0:
                continue
            y_law = np.asarray(law_of(p, q, np.array(tup)), dtype=np.float64)
            for y in np.flatnonzero(y_law > 0):
                mix[(int(y), tup.count(int(y)))] += w * float(y_law[y])
        for (y, c), w in mix.items():
            add(out, y, after(prefix, y, depth, c, L), w)
        return dict(out)

    return from_step(())


def as_vectors(law0: dict, law1: dict) -> tuple[list[tuple], np.ndarray, np.ndarray]:
    """Common cells (sorted) and the two laws as aligned vectors."""
    cells = sorted(set(law0) | set(law1))
    return cells, np.array([law0.get(c, 0.0) for c in cells]), np.array([law1.get(c, 0.0) for c in cells])
