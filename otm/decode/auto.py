r"""The machine decides the draft tree: k, L and the verifier from the measured costs and acceptance.

For each candidate verifier and k, two short warm-up decodes at the deepest L measure the acceptance at
each depth d given that depth was reached, :math:`a_d` (``accepted_by_depth / verified_by_depth``). A step
of depth L then emits on average

.. math::  B(L) = 1 + \sum_{d=1}^{L} \prod_{j \le d} a_j

tokens (the accepted path and the target's own token), and costs :math:`S = T(1 + kL) + d(1) + (L-1)\,d(k) + W(L)`
ms: the calls (:class:`otm.decode.bench.Costs`, measured on this machine: a target call on n positions, a
draft call on b rows) and what the step does between them (the walk, the rollback, the tree's bookkeeping:
the verifier's own cost, ``optimal``'s set-up included). W is measured in a second warm-up decode of the
same configuration (the first pays the one-off costs) as its wall clock less its target and draft calls,
per step, and scaled to depth L by the levels a step verifies on average,
:math:`V(L) = \sum_{d=0}^{L-1} \prod_{j \le d} a_j`: :math:`W(L) = W(L_{max})\,V(L) / V(L_{max})`. The predicted
tokens/s of (verifier, k, L) are :math:`1000\,B / S` against autoregressive
sampling's :math:`1000 / (T(1) + W_0)`, :math:`W_0` its own time between calls (sampling, bookkeeping),
measured in the same way;
the best configuration is chosen, or none where no configuration is predicted to beat autoregressive
sampling on this machine, which :func:`DecodePlan.line` then says with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..laws import OtmError


@dataclass(frozen=True)
class Candidate:
    verifier: str
    scheme: str
    k: int
    length: int
    block_efficiency: float  # B(L), predicted from the warm-up's acceptance by depth
    step_ms: float  # S, from the measured costs and the warm-up's time between the calls
    speedup: float  # predicted tokens/s over autoregressive sampling's
    between_ms: float = 0.0  # W(L): of S, the time between the calls (walk, rollback, bookkeeping)


@dataclass
class DecodePlan:
    """The candidates (best first), the autoregressive cost T(1) and the warm-up's acceptance by depth."""

    candidates: list[Candidate]
    t1_ms: float
    acceptance: dict = field(default_factory=dict)  # (verifier, k) -> [a_1, ..., a_L]
    warmup_tokens: int = 0
    ar_between_ms: float = 0.0  # autoregressive sampling's time between its calls, per token

    @property
    def best(self) -> Candidate | None:
        """The fastest candidate, or None when none is predicted to beat autoregressive sampling."""
        top = self.candidates[0] if self.candidates else None
        return top if top is not None and top.speedup > 1.0 else None

    def line(self) -> str:
        """One line: the choice and why, or that autoregressive sampling is faster here, with the numbers."""
        top = self.candidates[0]
        why = (f"B {top.block_efficiency:.2f} tokens per step of {top.step_ms:.1f} ms ({top.between_ms:.1f} ms of it between "
               f"the calls) against T(1) {self.t1_ms:.1f} ms + {self.ar_between_ms:.1f} ms; "
               f"acceptance by depth and time between the calls measured on 2 x {self.warmup_tokens} warm-up tokens per configuration")
        if self.best is None:
            return (f"auto: no configuration tried is predicted to beat autoregressive sampling on this machine (best "
                    f"{top.verifier} k={top.k} L={top.length}: {top.speedup:.2f}x; {why}): decoding autoregressively")
        return f"auto: {top.verifier} k={top.k} L={top.length}, predicted {top.speedup:.2f}x autoregressive ({why})"


def block_efficiency(acceptance: list[float], length: int) -> float:
    """:math:`B(L) = 1 + \\sum_{d \\le L} \\prod_{j \\le d} a_j` (a depth never reached counts as 0)."""
    total, reach = 1.0, 1.0
    for a in acceptance[:length]:
        reach *= a if a == a else 0.0  # nan: never verified at that depth
        total += reach
    return total


def levels_verified(acceptance: list[float], length: int) -> float:
    """:math:`V(L) = \\sum_{d=0}^{L-1} \\prod_{j \\le d} a_j`: the levels a step of depth L verifies on average
    (the root's always; a deeper one when every level above accepted): the tokens a step of depth L - 1 emits."""
    return block_efficiency(acceptance, length - 1)


def plan(target, draft, ids, *, ks=(1, 2, 4), lengths=(1, 2, 3, 4), verifiers=("kseq",), scheme="iid",
         sampling=None, warmup_tokens: int = 32, seed: int = 0, costs=None, compile: str = "none") -> DecodePlan:
    """Measure and rank every (verifier, k, L) of the grid (module docstring); ``ids`` the warm-up prompt.
    ``costs``: measured :class:`~otm.decode.bench.Costs` to reuse (else measured here, with the step
    ``compile`` gives: a choice of :data:`otm.decode.cli.COMPILE_CHOICES`)."""
    from .bench import measure_costs
    from .decoder import autoregressive_decode, speculative_decode

    ks, lengths = sorted(set(ks)), sorted(set(lengths))
    if not ks or not lengths or min(ks) < 1 or min(lengths) < 1:
        raise OtmError("auto needs k and L candidates >= 1")
    deepest = max(lengths)
    acceptance, between = {}, {}
    for verifier in verifiers:
        for k in ks:
            runs = [speculative_decode(target, draft, ids, k=k, length=deepest, verifier=verifier, scheme=scheme,
                                       sampling=sampling, max_new_tokens=warmup_tokens, seed=seed + r).stats
                    for r in range(2)]
            accepted = [sum(x) for x in zip(*(r.accepted_by_depth for r in runs))]
            verified = [sum(x) for x in zip(*(r.verified_by_depth for r in runs))]
            acceptance[(verifier, k)] = [a / v if v else float("nan") for a, v in zip(accepted, verified)]
            s = runs[1]  # the second run: the first pays the one-off costs (caches, first calls)
            between[(verifier, k)] = max(0.0, 1000.0 * (s.wall_seconds - s.target_seconds - s.draft_seconds)
                                         / max(s.steps, 1))
    # autoregressive sampling's own time between its calls (sampling, bookkeeping), the baseline's, alike
    ar = [autoregressive_decode(target, ids, sampling=sampling, max_new_tokens=warmup_tokens, seed=seed + r).stats
          for r in range(2)][1]
    ar_between = max(0.0, 1000.0 * (ar.wall_seconds - ar.target_seconds) / max(ar.steps, 1))
    if costs is None:
        context = list(ids)
        costs = measure_costs(target, draft, context, [1] + [1 + k * L for k in ks for L in lengths], [1] + ks,
                              sampling=sampling, repeats=3, compile=compile)
    t1 = costs.target(1)
    candidates = []
    for (verifier, k), acc in acceptance.items():
        deep = levels_verified(acc, deepest)
        for L in lengths:
            B = block_efficiency(acc, L)
            w = between[(verifier, k)] * (levels_verified(acc, L) / deep if deep > 0 else 1.0)
            step = costs.step_ms(k, L) + w
            candidates.append(Candidate(verifier, scheme, k, L, B, step, (B / step) * (t1 + ar_between), w))
    candidates.sort(key=lambda c: -c.speedup)
    return DecodePlan(candidates, t1, acceptance, warmup_tokens, ar_between)


__all__ = ["Candidate", "DecodePlan", "block_efficiency", "levels_verified", "plan"]
