r"""``--compile auto``: the machine decides how the step runs (eager, eager on oneDNN, on 4-bit blocks, compiled), by the cost model.

The decision compares the step the run will take, :math:`S = T(1 + kL) + d(1) + (L - 1)\,d(k)` ms
(:meth:`otm.decode.bench.Costs.step_ms`; :math:`T(1)` for autoregressive sampling), measured on this
machine: with the eager step (transformers' growing caches), with the eager step whose linear layers
run on oneDNN's prepacked GEMM (``onednn``, :mod:`otm.decode.onednn`; CPU models in float32, or bfloat16 where
oneDNN computes it), with the same step whose target computes its block layers on its GGUF's own 4-bit weights
(``int4``, :mod:`otm.decode.int4`; a bfloat16 target converted from a Q4_0 / Q4_1 GGUF otm knows: the embedded one),
with those models in the static step compiled ahead of time (``int4-compiled``, :mod:`otm.decode.precompile`), and
with the static-shape step compiled by ``torch.compile`` (:mod:`otm.decode.static`; mode ``default`` on
a CPU: inductor with freezing, ``reduce-overhead`` on a GPU: CUDA graphs). The fastest is chosen when it is
at least :data:`MARGIN` faster than the eager step; the block efficiency B is the same for all, so the step
time alone decides.

Compilation is paid once: the measured decision is kept in the user cache folder
(``compile_choice.json`` under :func:`otm.decode.embedded.cache_dir`), keyed by the machine line (CPU,
flags, torch kernels and BLAS, threads), torch's version, the device, both models (class, name, size,
dtype) and the step's shape, and inductor keeps its compiled kernels in the same folder; a later run
with the same key reads the choice and compiles only if it chose to. A decode whose whole eager run is
predicted under :data:`MIN_DECODE_SECONDS` (a toy model, a handful of tokens) is not worth compiling
for: ``none``, without measuring the compiled step and without caching.

>>> shapes(k=4, length=2)
([1, 9], [1, 4])
>>> shapes(k=1, length=0)  # autoregressive
([1], [])
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..laws import OtmError

MARGIN = 0.05
"""The compiled step must be this fraction faster than the eager one to be chosen (timing noise of a shared CPU)."""

MIN_DECODE_SECONDS = 2.0
"""Below this predicted eager decode time, compiling (seconds per shape even from inductor's cache) cannot pay."""

FILE = "compile_choice.json"

CANDIDATES = ("eager, eager on oneDNN (siblings fused), eager on the GGUF's 4-bit blocks, the same compiled ahead of "
              "time, compiled")
"""The steps timed against each other (part of the cache key: a decision taken among fewer, or among earlier
versions of them, is taken again)."""


@dataclass(frozen=True)
class Choice:
    choice: str  # "none" or a torch.compile mode
    line: str  # one line saying what was chosen and why, with the numbers
    measured: bool = True  # False: a decode too short to matter (no compiled step timed, nothing kept)


def shapes(*, k: int, length: int, delay: int = 0) -> tuple[list[int], list[int]]:
    """``(target sizes, draft batches)`` of a step: the static step's buckets (:mod:`otm.decode.static`)."""
    if length == 0:
        return [1], []
    sizes = [1, 1 + delay + k * (length - delay)]
    batches = [1] + ([k] if k > 1 and length - delay > 1 else [])
    return sizes, batches


def _model_id(model) -> str:
    if model is None:
        return "-"
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", "") or type(model).__name__
    try:
        params = sum(p.numel() for p in model.parameters())
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    except (AttributeError, StopIteration, TypeError):
        params, dtype = 0, "?"
    return f"{type(model).__name__}:{name}:{params}:{dtype}"


def key(target, draft, *, k: int, length: int, delay: int, device) -> str:
    """The cache key: what the decision depends on (module docstring)."""
    import torch

    from ..machine import machine

    return json.dumps([machine().line(""), torch.__version__, str(device), _model_id(target), _model_id(draft),
                       k, length, delay, CANDIDATES])


def choose(target, draft, context: list[int], *, measure, k: int, length: int, delay: int = 0, sampling=None,
           new_tokens: int = 64, capacity: int | None = None, out=None) -> Choice:
    """Resolve ``--compile auto`` for a run of ``new_tokens`` tokens with trees of k rows of depth ``length``
    (0: autoregressive) after ``context`` (module docstring). ``measure``: the bench's
    :func:`~otm.decode.bench.measure_costs` (the one timing of the decoder's calls); ``out``: where progress
    lines go."""
    import torch

    from .embedded import cache_dir, read_kept, write_kept
    from .int4 import available as int4_available
    from .onednn import available as onednn_available
    from .runner import device_and_dtype

    if not context:
        raise OtmError("--compile auto measures the step after a context: give a prompt of at least one token")
    device = device_and_dtype(target)[0]
    mode = "reduce-overhead" if torch.device(device).type == "cuda" else "default"
    sizes, batches = shapes(k=k, length=length, delay=delay)
    path = cache_dir() / FILE
    entry_key = key(target, draft, k=k, length=length, delay=delay, device=device)
    known = read_kept(path).get(entry_key)
    if known is not None:
        return Choice(known["choice"], f"compile auto: {known['choice']} ({known['why']}; measured {known['date']}, "
                                       f"kept in {path})")
    common = dict(sampling=sampling, repeats=3)
    eager = measure(target, draft, context, sizes, batches, **common)
    eager_ms = eager.step_ms(k, length, delay) if length else eager.target(1)
    if new_tokens * eager_ms / 1000.0 < MIN_DECODE_SECONDS:
        return Choice("none", f"compile auto: none (the whole decode takes about {new_tokens * eager_ms / 1000:.1f} s "
                              f"eager, under {MIN_DECODE_SECONDS:.0f} s: compiling cannot pay)", measured=False)
    def step(costs) -> float:
        return costs.step_ms(k, length, delay) if length else costs.target(1)

    steps = {"none": eager_ms}
    t1 = {"none": eager.target(1)}
    if onednn_available(target):  # the eager step with the linear layers on oneDNN (otm.decode.onednn)
        one = measure(target, draft, context, sizes, batches, compile="onednn", **common)
        steps["onednn"], t1["onednn"] = step(one), one.target(1)
    if int4_available(target):  # the target's block layers on its GGUF's own 4-bit weights (otm.decode.int4)
        four = measure(target, draft, context, sizes, batches, compile="int4", **common)
        steps["int4"], t1["int4"] = step(four), four.target(1)
    if out is not None:
        others = {"onednn": " and the eager one on oneDNN", "int4": " and on the GGUF's 4-bit blocks"}
        ahead = " and the 4-bit blocks' step compiled ahead of time" if "int4" in steps else ""
        out(f"compile auto: timing the compiled step ({mode}{ahead}; {len(sizes) + len(batches)} shapes compiled once, "
            f"kept in the user cache) against the eager one{''.join(others[c] for c in steps if c in others)} ...")
    start = time.perf_counter()
    if "int4" in steps:  # the same 4-bit models in the static step compiled ahead of time (otm.decode.precompile)
        ahead_costs = measure(target, draft, context, sizes, batches, compile="int4-compiled", capacity=capacity,
                              **common)
        steps["int4-compiled"], t1["int4-compiled"] = step(ahead_costs), ahead_costs.target(1)
    compiled = measure(target, draft, context, sizes, batches, compile=mode, capacity=capacity, **common)
    seconds = time.perf_counter() - start
    compiled_ms = step(compiled)
    steps[mode], t1[mode] = compiled_ms, compiled.target(1)
    best = min(steps, key=steps.get)
    choice = best if steps[best] < (1.0 - MARGIN) * eager_ms else "none"
    shape = f"k={k} L={length}" + (f" delay {delay}" if delay else "") if length else "autoregressive"
    name = {"none": "eager", "onednn": "eager with oneDNN linears", "int4": "eager on the GGUF's 4-bit blocks",
            "int4-compiled": "the 4-bit blocks compiled ahead of time", mode: f"compiled ({mode})"}
    why = (f"step {shape}: " + ", ".join(f"{name[c]} {ms:.1f} ms" for c, ms in steps.items()) + "; T(1) "
           + ", ".join(f"{name[c]} {ms:.1f} ms" for c, ms in t1.items())
           + f"; compiling and timing took {seconds:.0f} s")
    entries = read_kept(path)
    entries[entry_key] = {"choice": choice, "why": why, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "eager_ms": eager_ms, "compiled_ms": compiled_ms, "steps_ms": steps, "seconds": seconds}
    failed = write_kept(path, entries)
    if failed is not None:
        why += f"; not kept ({failed})"
    return Choice(choice, f"compile auto: {choice} ({why})")


__all__ = ["CANDIDATES", "Choice", "FILE", "MARGIN", "MIN_DECODE_SECONDS", "choose", "key", "shapes"]
