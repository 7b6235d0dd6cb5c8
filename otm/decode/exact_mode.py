r"""Exact law of the decoder's output, computed by the decoder's own code (small V, k, L, T).

Every random choice of :func:`~otm.decode.decoder.speculative_decode` goes through one door
(:mod:`otm.decode.chance`). With an :class:`~otm.decode.chance.Enumerated` door each choice is
an elementary categorical over a finite list of options with float64 probabilities (a draft
token, a token drawn without replacement, a verifier's output token from its exact conditional
law, a bonus token), so the set of runs of the *real* decoder is a finite tree. :func:`exact_decode`
walks it depth first by replay:

1. run the decoder with a forced prefix of option indices (empty at first); beyond the prefix
   it takes option 0, and the door records every choice's number of options;
2. for every choice beyond the prefix, push the prefix that takes each other option there
   (same choices before it);
3. the run's probability is the product of its choices' probabilities; add it to the law of
   its output tokens.

Each complete run is visited once, so the law is exact up to float64 rounding (the sum over
runs of products of probabilities). Nothing here knows how the decoder drafts, walks or rolls
back: a bug anywhere in that code (a wrong law given to the verifier, a stale target cache, a
wrong position) changes the computed law. The reference is :func:`target_law`, the target's own
law of T tokens by plain enumeration of its processed next-token laws (a cache-free forward per
prefix, :func:`otm.decode.toy.model_law`), not a second decoder.

Verifiers: a built-in torch verifier is replaced in the enumeration by its numpy twin's exact
law (``otm.verifiers.<name>.law``); a user's callable must carry ``.law(target, draft, drafts)``.

Cost: one decoder run per complete run of the tree (the number of runs grows like the product
of the option counts; ~1.5-2 ms per run for ToyLM at V = 3, T = 3, k = 2, L = 2 on one CPU core),
so keep V, k, L and T small; ``max_runs`` refuses larger enumerations in one line.

>>> from otm.decode.toy import ToyLM, model_law
>>> target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
>>> law = exact_decode_law(target, draft, [0, 2], max_new_tokens=2, k=2, length=1)
>>> reference = target_law(model_law(target, [0, 2]), 2)
>>> law_error(law, reference) < 1e-12
True
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..laws import OtmError
from .chance import Enumerated, exact_law_of

Law = Callable[[tuple], np.ndarray]

MAX_RUNS = 100_000
"""Default largest number of decoder runs :func:`exact_decode` performs."""

_NOT_FORWARDED = ("generator", "seed", "chance", "on_tokens")


def target_law(target: Law, T: int, eos: int | None = None) -> dict[tuple, float]:
    """Law of the first T tokens sampled autoregressively from ``target(prefix)`` (stop after ``eos``).

    ``target(prefix) -> [V]`` is the processed next-token law after the prompt and ``prefix``
    (e.g. :func:`otm.decode.toy.model_law`). The law of a sequence is the product of its
    tokens' conditional probabilities; sequences ending in ``eos`` before T tokens are cells.
    """
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


def as_vectors(law0: dict, law1: dict) -> tuple[list[tuple], np.ndarray, np.ndarray]:
    """Common cells (sorted) and the two laws as aligned vectors."""
    cells = sorted(set(law0) | set(law1))
    return cells, np.array([law0.get(c, 0.0) for c in cells]), np.array([law1.get(c, 0.0) for c in cells])


def law_error(law: dict, reference: dict) -> float:
    """``max_c |law(c) - reference(c)|`` over the union of the cells."""
    _, a, b = as_vectors(law, reference)
    return float(np.abs(a - b).max())


def total_variation(law: dict, reference: dict) -> float:
    """``1/2 sum_c |law(c) - reference(c)|``."""
    _, a, b = as_vectors(law, reference)
    return 0.5 * float(np.abs(a - b).sum())


@dataclass
class ExactDecode:
    """The exact law of a decoder's output and expectations of its counters.

    ``law[tokens]`` = P(the run emits ``tokens``); ``verified_by_depth[d]`` and
    ``accepted_by_depth[d]`` = the expected number of verifications (and acceptances) at depth
    d + 1 in one run; ``acceptance_by_depth`` = their ratio, the limit of
    :attr:`~otm.decode.decoder.DecodeStats.acceptance_by_depth` pooled over many runs.
    """

    law: dict[tuple, float]
    runs: int
    seconds: float
    verified_by_depth: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accepted_by_depth: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def mass(self) -> float:
        return float(sum(self.law.values()))

    @property
    def acceptance_by_depth(self) -> list[float]:
        return [a / v if v > 0 else float("nan") for a, v in zip(self.accepted_by_depth, self.verified_by_depth)]

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else float("nan")


def exact_decode(target, draft, input_ids, *, max_new_tokens: int, max_runs: int = MAX_RUNS, **options) -> ExactDecode:
    """Exact law of the first ``max_new_tokens`` tokens of the real decoder, by depth-first replay.

    Parameters
    ----------
    target, draft : the models, as for :func:`~otm.decode.decoder.speculative_decode`; ``draft=None``
        enumerates :func:`~otm.decode.decoder.autoregressive_decode` instead.
    input_ids : the prompt.
    max_new_tokens : T, the number of new tokens (fewer after ``eos_token_id``).
    max_runs : refuse (one-line OtmError) an enumeration of more decoder runs than this.
    options : any other keyword of ``speculative_decode`` (``k``, ``length``, ``verifier``, ``scheme``,
        ``sampling``, ``eos_token_id``, ``target_rollback``, ``validate``) or of
        ``autoregressive_decode``; not ``generator``, ``seed``, ``chance``, ``on_tokens``. Laws are
        float64 (``law_dtype=torch.float64``, the only dtype allowed here).

    Returns
    -------
    ExactDecode : ``law`` (tokens -> probability), ``runs``, ``seconds``, expected counters.
    """
    from .decoder import autoregressive_decode, resolve_verifiers, speculative_decode

    given = sorted(set(options) & set(_NOT_FORWARDED))
    if given:
        raise OtmError(f"exact mode makes every random choice itself: do not pass {', '.join(given)}")
    if options.setdefault("law_dtype", torch.float64) != torch.float64:
        raise OtmError(f"exact mode computes laws in float64, got law_dtype={options['law_dtype']}")
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise OtmError(f"max_runs must be a whole number >= 1, got {max_runs!r}")
    if draft is not None:  # refuse a verifier without an exact law before any run
        for verifier in resolve_verifiers(options.get("verifier", "kseq"), options.get("scheme", "iid"),
                                          options.get("k", 4))[:2]:
            if verifier is not None:  # None: a whole-tree rule, whose decisions carry their own laws
                exact_law_of(verifier)

    def run(door: Enumerated):
        if draft is None:
            return autoregressive_decode(target, input_ids, max_new_tokens=max_new_tokens, chance=door, **options)
        return speculative_decode(target, draft, input_ids, max_new_tokens=max_new_tokens, chance=door, **options)

    start = time.perf_counter()
    law: dict[tuple, float] = defaultdict(float)
    verified: np.ndarray | None = None
    accepted: np.ndarray | None = None
    stack: list[tuple[int, ...]] = [()]
    runs, memo = 0, {}
    while stack:
        forced = stack.pop()
        door = Enumerated(forced, memo)
        out = run(door)
        runs += 1
        for i in range(len(forced), len(door.taken)):  # every choice made freely: its other options
            stack.extend(tuple(door.taken[:i]) + (alt,) for alt in range(door.sizes[i] - 1, 0, -1))
        if runs + len(stack) > max_runs:
            raise OtmError(f"exact mode would run the decoder more than max_runs = {max_runs:,} times: "
                           "lower V, k, length or max_new_tokens, or raise max_runs")
        w = door.probability
        law[tuple(out.tokens)] += w
        v = np.asarray(out.stats.verified_by_depth, dtype=np.float64)
        a = np.asarray(out.stats.accepted_by_depth, dtype=np.float64)
        verified = w * v if verified is None else verified + w * v
        accepted = w * a if accepted is None else accepted + w * a
    return ExactDecode(dict(law), runs, time.perf_counter() - start, verified, accepted)


def exact_decode_law(target, draft, input_ids, *, max_new_tokens: int, **options) -> dict[tuple[int, ...], float]:
    """Exact law ``{tokens: probability}`` of the decoder's first ``max_new_tokens`` tokens
    (:func:`exact_decode`'s ``law``; ``draft=None``: the autoregressive baseline)."""
    return exact_decode(target, draft, input_ids, max_new_tokens=max_new_tokens, **options).law


__all__ = ["ExactDecode", "MAX_RUNS", "as_vectors", "exact_decode", "exact_decode_law", "law_error", "target_law",
           "total_variation"]
