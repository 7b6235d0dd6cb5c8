"""How the decoder's step runs, as the CLI and the bench name it (no torch import: read by ``otm --help``).

``none``: the eager step (:class:`otm.decode.runner.Runner`, transformers' growing caches); ``static``:
the static-shape step with eager kernels; a ``torch.compile`` mode: the static-shape step compiled
(:mod:`otm.decode.static`).
"""

from __future__ import annotations

COMPILE_CHOICES = ("none", "static", "default", "max-autotune", "reduce-overhead")
"""``--compile``: none (the eager step), static (the static-shape step, eager kernels), or a torch.compile mode."""


def compile_options(choice: str) -> dict:
    """The decoder's keywords for a ``--compile`` choice."""
    if choice == "none":
        return {}
    return {"static": True} if choice == "static" else {"compile": choice}


__all__ = ["COMPILE_CHOICES", "compile_options"]
