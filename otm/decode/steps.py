"""How the decoder's step runs, as the CLI and the bench name it (no torch import: read by ``otm --help``).

``none``: the eager step (:class:`otm.decode.runner.Runner`, transformers' growing caches); ``static``:
the static-shape step with eager kernels; ``onednn``: the eager step with the models' linear layers on
oneDNN's prepacked GEMM (:mod:`otm.decode.onednn`; CPU, float32 or bfloat16); ``int4``: as ``onednn``, the target's
block layers on its GGUF's own 4-bit weights (:mod:`otm.decode.int4`; the embedded target, bfloat16 or float32);
``int4-compiled``: the same models in the static-shape step compiled by inductor; a ``torch.compile`` mode: the
static-shape step compiled (:mod:`otm.decode.static`); ``auto``: whichever of these
the cost model measures fastest on this machine (:mod:`otm.decode.compile_choice`), resolved before the run.
"""

from __future__ import annotations

COMPILE_CHOICES = ("auto", "none", "onednn", "int4", "int4-compiled", "static", "default", "max-autotune",
                   "reduce-overhead")
"""``--compile``: auto (measured: :mod:`otm.decode.compile_choice`), none (the eager step), onednn (the eager
step, linear layers on oneDNN), int4 (as onednn, the target's block layers on its GGUF's 4-bit weights),
int4-compiled (int4's models, the static-shape step compiled), static (the static-shape step, eager kernels), or
a torch.compile mode."""

PRECOMPILED = "precompiled"
"""The static step compiled ahead of time on the CPU, each shape's graph saved in the user cache and loaded by later
runs, called without dynamo (:mod:`otm.decode.precompile`): the step of ``int4-compiled``."""

STEP = {"onednn": "none", "int4": "none", "int4-compiled": PRECOMPILED}
"""The choices that swap the models' modules before the run (:func:`otm.decode.onednn.for_choice`), and the step
each runs its swapped models in: the eager one, or the static step compiled ahead of time (``precompiled``:
:mod:`otm.decode.precompile`, its graphs saved in the user cache)."""

SWAPS = tuple(STEP)
"""The choices that swap the models' modules before the run."""

EAGER = ("none",) + tuple(c for c, step in STEP.items() if step == "none")
"""The choices whose step is the eager one (transformers' growing caches): nothing compiled."""


def step_of(choice: str) -> str:
    """The choice of the step itself: ``none`` for onednn and int4, ``precompiled`` for int4-compiled, else ``choice``."""
    return STEP.get(choice, choice)


def compile_options(choice: str) -> dict:
    """The decoder's keywords for a ``--compile`` choice (``auto`` is resolved before: :mod:`otm.decode.compile_choice`)."""
    if choice == "auto":
        raise ValueError("--compile auto is resolved by otm.decode.compile_choice.choose before the run")
    choice = step_of(choice)  # onednn, int4(-compiled): the models are swapped before the run (onednn.for_choice)
    if choice == "none":
        return {}
    return {"static": True} if choice == "static" else {"compile": choice}


__all__ = ["COMPILE_CHOICES", "EAGER", "PRECOMPILED", "STEP", "SWAPS", "compile_options", "step_of"]
