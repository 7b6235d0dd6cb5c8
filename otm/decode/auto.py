r"""The machine decides the draft tree: k, L and the verifier from the measured costs and acceptance.

For each candidate verifier and k, one short warm-up decode at the deepest L measures the acceptance at
each depth d given that depth was reached, :math:`a_d` (``accepted_by_depth / verified_by_depth``). A step
of depth L then emits on average

.. math::  B(L) = 1 + \sum_{d=1}^{L} \prod_{j \le d} a_j

tokens (the accepted path and the target's own token), and costs :math:`S = T(1 + kL) + d(1) + (L-1)\,d(k)`
ms (:class:`otm.decode.bench.Costs`, measured on this machine: a target call on n positions, a draft call
on b rows). The predicted tokens/s of (verifier, k, L) are :math:`1000\,B / S` against autoregressive
sampling's :math:`1000 / T(1)`; the best configuration is chosen, or none where no configuration is
predicted to beat autoregressive sampling on this machine, which :func:`DecodePlan.line` then says with the
numbers.
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
    step_ms: float  # S, from the measured costs
    speedup: float  # predicted tokens/s over autoregressive sampling's


@dataclass
class DecodePlan:
    """The candidates (best first), the autoregressive cost T(1) and the warm-up's acceptance by depth."""

    candidates: list[Candidate]
    t1_ms: float
    acceptance: dict = field(default_factory=dict)  # (verifier, k) -> [a_1, ..., a_L]
    warmup_tokens: int = 0

    @property
    def best(self) -> Candidate | None:
        """The fastest candidate, or None when none is predicted to beat autoregressive sampling."""
        top = self.candidates[0] if self.candidates else None
        return top if top is not None and top.speedup > 1.0 else None

    def line(self) -> str:
        """One line: the choice and why, or that autoregressive sampling is faster here, with the numbers."""
        top = self.candidates[0]
        why = (f"B {top.block_efficiency:.2f} tokens per step of {top.step_ms:.1f} ms against T(1) {self.t1_ms:.1f} ms; "
               f"acceptance by depth measured on {self.warmup_tokens} warm-up tokens per configuration")
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


def plan(target, draft, ids, *, ks=(1, 2, 4), lengths=(1, 2, 3, 4), verifiers=("kseq",), scheme="iid",
         sampling=None, warmup_tokens: int = 32, seed: int = 0, costs=None, compile: str = "none") -> DecodePlan:
    """Measure and rank every (verifier, k, L) of the grid (module docstring); ``ids`` the warm-up prompt.
    ``costs``: measured :class:`~otm.decode.bench.Costs` to reuse (else measured here, with the step
    ``compile`` gives: a choice of :data:`otm.decode.cli.COMPILE_CHOICES`)."""
    from .bench import measure_costs
    from .decoder import speculative_decode

    ks, lengths = sorted(set(ks)), sorted(set(lengths))
    if not ks or not lengths or min(ks) < 1 or min(lengths) < 1:
        raise OtmError("auto needs k and L candidates >= 1")
    deepest = max(lengths)
    acceptance = {}
    for verifier in verifiers:
        for k in ks:
            s = speculative_decode(target, draft, ids, k=k, length=deepest, verifier=verifier, scheme=scheme,
                                   sampling=sampling, max_new_tokens=warmup_tokens, seed=seed).stats
            acceptance[(verifier, k)] = s.acceptance_by_depth
    if costs is None:
        context = list(ids)
        costs = measure_costs(target, draft, context, [1] + [1 + k * L for k in ks for L in lengths], [1] + ks,
                              sampling=sampling, repeats=3, compile=compile)
    t1 = costs.target(1)
    candidates = []
    for (verifier, k), acc in acceptance.items():
        for L in lengths:
            B = block_efficiency(acc, L)
            step = costs.step_ms(k, L)
            candidates.append(Candidate(verifier, scheme, k, L, B, step, (B / step) / (1.0 / t1)))
    candidates.sort(key=lambda c: -c.speedup)
    return DecodePlan(candidates, t1, acceptance, warmup_tokens)


__all__ = ["Candidate", "DecodePlan", "block_efficiency", "plan"]
