r"""The machine decides the draft tree: k, L and the verifier from the measured costs and acceptance.

For each candidate verifier and k (at k = 1 speculative sampling, the law every rule of :data:`ONE_DRAFT` has
with one draft, without their k-draft machinery), two short warm-up decodes at the deepest L measure the acceptance at
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

How the step runs can be decided with the tree (``compiles``: several choices of ``--compile`` that keep the
eager step, e.g. ``none``, ``onednn``, ``int4``): the costs are measured with each, the acceptance and the time
between the calls once (they do not depend on the GEMM), and every (step, verifier, k, L) is ranked by its
predicted tokens/s, autoregressive sampling on each step among them. A faster target call raises every row, the
baseline's too, so the fastest decode need not show the largest ratio: on the embedded target the GGUF's 4-bit
blocks cut T(1) by a third and leave the draft's calls as they were (``docs/decode.md``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from ..laws import OtmError


@dataclass(frozen=True)
class Candidate:
    verifier: str
    scheme: str
    k: int
    length: int
    block_efficiency: float  # B(L), predicted from the warm-up's acceptance by depth
    step_ms: float  # S, from the measured costs and the warm-up's time between the calls
    speedup: float  # predicted tokens/s over autoregressive sampling's on the same step
    between_ms: float = 0.0  # W(L): of S, the time between the calls (walk, rollback, bookkeeping)
    compile: str = "none"  # the step it runs on (a choice of --compile)
    tokens_per_second: float = 0.0  # predicted: 1000 B / S


@dataclass
class DecodePlan:
    """The candidates (best first), the autoregressive cost T(1) and the warm-up's acceptance by depth."""

    candidates: list[Candidate]
    t1_ms: float
    acceptance: dict = field(default_factory=dict)  # (verifier, k) -> [a_1, ..., a_L]
    warmup_tokens: int = 0
    ar_between_ms: float = 0.0  # autoregressive sampling's time between its calls, per token
    ar_tokens_per_second: dict = field(default_factory=dict)  # step -> autoregressive sampling's predicted tokens/s
    t1_by_step: dict = field(default_factory=dict)  # step -> T(1) ms
    kept: str = ""  # where a plan read back from the user cache was measured and kept (said in the line)

    @property
    def best(self) -> Candidate | None:
        """The fastest candidate, or None when none is predicted to beat autoregressive sampling on any step
        (with one step: none predicted faster than 1x)."""
        top = self.candidates[0] if self.candidates else None
        fastest_ar = max(self.ar_tokens_per_second.values(), default=float("inf"))
        return top if top is not None and top.tokens_per_second > fastest_ar else None

    @property
    def compile(self) -> str:
        """The step to run: the best candidate's, else the one autoregressive sampling is fastest on."""
        if self.best is not None:
            return self.best.compile
        return max(self.ar_tokens_per_second, key=self.ar_tokens_per_second.get, default="none")

    def line(self) -> str:
        """One line: the choice and why, or that autoregressive sampling is faster here, with the numbers."""
        top = self.candidates[0]
        t1 = self.t1_by_step.get(top.compile, self.t1_ms)
        why = (f"B {top.block_efficiency:.2f} tokens per step of {top.step_ms:.1f} ms ({top.between_ms:.1f} ms of it between "
               f"the calls) against T(1) {t1:.1f} ms + {self.ar_between_ms:.1f} ms; "
               f"acceptance by depth and time between the calls measured on 2 x {self.warmup_tokens} warm-up tokens per configuration")
        steps = ""
        if len(self.ar_tokens_per_second) > 1:  # several steps compared: say which, and each one's baseline
            steps = (f", on {STEP_NAMES.get(top.compile, top.compile)}, {top.tokens_per_second:.0f} tokens/s; "
                     "autoregressive " + ", ".join(f"{v:.0f} tokens/s on {STEP_NAMES.get(m, m)}"
                                                    for m, v in self.ar_tokens_per_second.items()))
        if self.kept:
            why += f"; {self.kept}"
        if self.best is None:
            where = (f" (on {STEP_NAMES.get(self.compile, self.compile)})" if len(self.ar_tokens_per_second) > 1 else "")
            return (f"auto: no configuration tried is predicted to beat autoregressive sampling on this machine (best "
                    f"{top.verifier} k={top.k} L={top.length}: {top.speedup:.2f}x{steps}; {why}): decoding "
                    f"autoregressively{where}")
        return (f"auto: {top.verifier} k={top.k} L={top.length}, predicted {top.speedup:.2f}x autoregressive"
                f"{' on the same step' if steps else ''}{steps} ({why})")


STEP_NAMES = {"none": "the eager step", "onednn": "oneDNN's linears", "int4": "the GGUF's 4-bit blocks",
              "int4-compiled": "the GGUF's 4-bit blocks compiled"}
"""How :meth:`DecodePlan.line` names a step it compared."""


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


ONE_DRAFT = ("kseq", "rrs", "rrs_without_replacement", "kseq_without_replacement")
"""Verifiers whose rule with one draft is speculative sampling (Leviathan et al. 2023): at k = 1 the plan runs
``speculative``, the same law without their k-draft machinery (K-SEQ's rho search and its checks: about 0.25 ms a
step on the embedded pair), as the bench's k = 1 rows do."""


def one_draft(verifier, k: int):
    """The verifier the plan runs at ``k``: ``speculative`` for one draft of a rule in :data:`ONE_DRAFT`, else
    ``verifier`` itself (a callable included)."""
    return "speculative" if k == 1 and isinstance(verifier, str) and verifier in ONE_DRAFT else verifier


COMPILED = {"int4": "int4-compiled"}
"""An eager step and its compiled counterpart (the same models in the compiled static step), which the plan can
weigh for the winning tree only (``refine``)."""


def weighs_eager(choice: str) -> bool:
    """Whether a step the machine decided on (``--compile auto``) leaves the plan to weigh every eager step with the
    tree: an eager step, or the compiled twin of one (:data:`COMPILED`, whose eager twin stands for it on the grid:
    compiling every size of the grid would cost minutes)."""
    from .steps import EAGER

    return choice in EAGER or choice in COMPILED.values()


def steps_to_weigh(target, choice: str, decided: bool) -> tuple[list[str], list[str]]:
    """``(compiles, refine)`` for :func:`plan` on a run whose step is ``choice``: where the machine decided it
    (``decided``) and :func:`weighs_eager`, every eager step this machine has and the compiled twins of those (the
    winner is timed on its twin too: a graph per size of that tree only); otherwise the choice alone, as given."""
    if decided and weighs_eager(choice):
        from .onednn import eager_steps

        steps = eager_steps(target)
        return steps, [COMPILED[s] for s in steps if s in COMPILED]
    return [choice], []


def plan(target, draft, ids, *, ks=(1, 2, 4), lengths=(1, 2, 3, 4), verifiers=("kseq",), scheme="iid",
         sampling=None, warmup_tokens: int = 32, seed: int = 0, costs=None, compile: str = "none",
         compiles=None, refine=()) -> DecodePlan:
    """Measure and rank every (verifier, k, L) of the grid (module docstring); ``ids`` the warm-up prompt.
    ``costs``: measured :class:`~otm.decode.bench.Costs` to reuse, or a dict step -> Costs (else measured here,
    with the step ``compile`` gives: a choice of :data:`otm.decode.cli.COMPILE_CHOICES`). ``compiles``: several
    steps to compare (module docstring); the models must not be swapped yet (each is timed swapped, then
    put back), and :attr:`DecodePlan.compile` names the one to run. ``refine``: compiled steps (values of
    :data:`COMPILED`) weighed for the winning tree alone, where the winner runs on their eager counterpart: their
    costs are measured on that tree's sizes and autoregressive sampling's only (a compiled graph per size; every
    size of the grid would cost minutes of compilation), with the same acceptance and time between the calls."""
    from .bench import measure_costs
    from .decoder import autoregressive_decode, speculative_decode

    ks, lengths = sorted(set(ks)), sorted(set(lengths))
    if not ks or not lengths or min(ks) < 1 or min(lengths) < 1:
        raise OtmError("auto needs k and L candidates >= 1")
    deepest = max(lengths)
    acceptance, between = {}, {}
    for verifier, k in dict.fromkeys((one_draft(v, k), k) for v in verifiers for k in ks):
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
    modes = list(dict.fromkeys(compiles)) if compiles else [compile]
    given = costs if isinstance(costs, dict) else {} if costs is None else {modes[0]: costs}
    candidates, ar_rates, t1s = [], {}, {}
    for mode in modes:
        measured = given.get(mode)
        if measured is None:
            measured = measure_costs(target, draft, list(ids), [1] + [1 + k * L for k in ks for L in lengths],
                                     [1] + ks, sampling=sampling, repeats=5, compile=mode)
        t1 = t1s[mode] = measured.target(1)
        ar_rates[mode] = 1000.0 / (t1 + ar_between)
        for (verifier, k), acc in acceptance.items():
            deep = levels_verified(acc, deepest)
            for L in lengths:
                B = block_efficiency(acc, L)
                w = between[(verifier, k)] * (levels_verified(acc, L) / deep if deep > 0 else 1.0)
                step = measured.step_ms(k, L) + w
                candidates.append(Candidate(verifier, scheme, k, L, B, step, (B / step) * (t1 + ar_between), w,
                                            mode, 1000.0 * B / step))
    candidates.sort(key=lambda c: -c.tokens_per_second)
    winner = candidates[0] if candidates else None
    for mode in refine:
        if winner is None or COMPILED.get(winner.compile) != mode:
            continue
        k, L = winner.k, winner.length
        measured = given.get(mode)
        if measured is None:
            measured = measure_costs(target, draft, list(ids), [1, 1 + k * L], sorted({1, k}), sampling=sampling,
                                     repeats=5, compile=mode)
        t1 = t1s[mode] = measured.target(1)
        ar_rates[mode] = 1000.0 / (t1 + ar_between)
        step = measured.step_ms(k, L) + winner.between_ms
        candidates.append(Candidate(winner.verifier, scheme, k, L, winner.block_efficiency, step,
                                    (winner.block_efficiency / step) * (t1 + ar_between), winner.between_ms, mode,
                                    1000.0 * winner.block_efficiency / step))
    candidates.sort(key=lambda c: -c.tokens_per_second)
    top = candidates[0].compile if candidates else modes[0]
    return DecodePlan(candidates, t1s[top], acceptance, warmup_tokens, ar_between, ar_rates, t1s)


PLAN_FILE = "decode_plan.json"
"""Where :func:`kept_plan` keeps measured plans, in the user cache folder (:func:`otm.decode.embedded.cache_dir`)."""

KEPT_PLANS = 32
"""The most recent plans kept in :data:`PLAN_FILE` (one per key); older ones are dropped when a plan is added."""


def _model_digest(model, h) -> None:
    """Feed ``h`` what a plan depends on in a model: its class and configuration, and each tensor's name, shape,
    dtype, device and values (up to 4096 of them, evenly spaced: a retrained model with the same shapes is another)."""
    if model is None:
        h.update(b"-")
        return
    import torch

    config = getattr(model, "config", None)
    config_text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    h.update(json.dumps([type(model).__name__, config_text]).encode())
    for name, t in model.state_dict().items():
        h.update(json.dumps([name, list(t.shape), str(t.dtype), str(t.device)]).encode())
        flat = t.detach().reshape(-1)
        if flat.numel() and not t.is_complex() and t.device.type != "meta":  # meta: offloaded, values elsewhere
            sample = flat[:: max(1, flat.numel() // 4096)].to("cpu", torch.float64)
            h.update(sample.numpy().tobytes())


def plan_key(target, draft, ids, settings: dict) -> str:
    """The key of a kept plan: this machine's line (CPU, flags, torch's kernels and BLAS, threads), torch's and
    transformers' versions, a digest of otm's decoder sources (a changed step has other costs), both models, the
    warm-up prompt and every setting of :func:`plan` (the grid, the steps weighed, sampling, seed, warm-up)."""
    import hashlib

    import torch
    import transformers

    from ..machine import machine
    from .precompile import code_digest

    models = hashlib.blake2b(digest_size=16)
    _model_digest(target, models)
    _model_digest(draft, models)
    return json.dumps([machine().line(""), torch.__version__, transformers.__version__, code_digest()[:16],
                       models.hexdigest(), [int(i) for i in ids], {n: repr(v) for n, v in sorted(settings.items())}])


def _plan_from(entry: dict) -> DecodePlan:
    acceptance = {(v, int(k)): list(a) for v, k, a in entry["acceptance"]}
    return DecodePlan([Candidate(**c) for c in entry["candidates"]], float(entry["t1_ms"]), acceptance,
                      int(entry["warmup_tokens"]), float(entry["ar_between_ms"]), dict(entry["ar_tokens_per_second"]),
                      dict(entry["t1_by_step"]))


def _plan_entry(p: DecodePlan) -> dict:
    return {"candidates": [asdict(c) for c in p.candidates], "t1_ms": p.t1_ms,
            "acceptance": [[v, k, a] for (v, k), a in p.acceptance.items()], "warmup_tokens": p.warmup_tokens,
            "ar_between_ms": p.ar_between_ms, "ar_tokens_per_second": p.ar_tokens_per_second,
            "t1_by_step": p.t1_by_step}


def kept_plan(target, draft, ids, *, say=None, **settings) -> DecodePlan:
    """:func:`plan`, measured once per key (:func:`plan_key`) and kept in the user cache folder
    (:data:`PLAN_FILE`): a later run on the same machine, models, prompt and settings reads the plan back, its
    line saying when it was measured and where it is kept (delete the file to measure again). A plan that cannot
    be read back is measured again; one that cannot be kept is said in its line, not raised. ``say``: where to
    say that the plan is being measured (a progress line; nothing when it is read back)."""
    from .embedded import cache_dir, read_kept, write_kept

    if settings.get("costs") is not None:  # given costs: nothing of this machine's to keep
        return plan(target, draft, ids, **settings)
    measuring = "measuring the costs and the acceptance by depth (once; kept in the user cache) ..."
    path = cache_dir() / PLAN_FILE
    entry_key = plan_key(target, draft, ids, settings)
    entries = read_kept(path)
    known = entries.get(entry_key)
    if known is not None:
        try:
            out = _plan_from(known["plan"])
            out.kept = f"measured {known['date']}, kept in {path}"
            return out
        except (KeyError, TypeError, ValueError):
            pass  # another layout (or a damaged entry): measured again below
    if say is not None:
        say(measuring)
    out = plan(target, draft, ids, **settings)
    entries.pop(entry_key, None)
    entries[entry_key] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "plan": _plan_entry(out)}
    entries = dict(list(entries.items())[-KEPT_PLANS:])
    failed = write_kept(path, entries)
    if failed is not None:
        out.kept = f"not kept ({failed})"
    return out


__all__ = ["COMPILED", "Candidate", "DecodePlan", "KEPT_PLANS", "ONE_DRAFT", "PLAN_FILE", "STEP_NAMES", "block_efficiency",
           "kept_plan", "levels_verified", "one_draft", "plan", "plan_key", "steps_to_weigh", "weighs_eager"]
