"""Keep freed memory in the process (glibc's ``mallopt``), so that a step's large temporaries are not faulted in
page by page every step.

A decoder step allocates a few tensors of megabytes and frees them again: the float64 laws of a tree pass
(17 positions x 49152 tokens x 8 bytes = 6.7 MB, and the copy they are computed from), the draft's laws at
batch k, the target's logits. glibc's malloc serves a block above its mmap threshold by a fresh ``mmap`` and
trims the heap's free top above its trim threshold back to the kernel; both thresholds adapt to the blocks
freed, but with the decoder's mix of sizes they keep returning that memory, so every step the kernel hands
the pages back one fault at a time, zeroed. Measured on the embedded pair (kseq k = 4, bfloat16, one thread;
`docs/decode.md`, "Freed memory kept"): a step of depth 4 took 2,454-4,657 minor faults and 3-7 ms of system
time, 46-50 ms in all; with both thresholds at 256 MiB, 47 faults, 40-43 ms. Depths 1 and 2 fault little
either way.

:func:`keep_freed_memory` sets both thresholds once for the process. ``otm decode``, ``bench-decode``,
``profile`` and ``demo`` call it (every contender of a run alike); the library does not, since it is the
process's allocator, not ours: call it, or run under ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=268435456:
glibc.malloc.trim_threshold=268435456``. ``OTM_KEEP_FREED_MEMORY=0`` turns it off. The price: memory freed
by a step stays with the process (its peak, not more), instead of going back to the kernel.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (``malloc.h``)."""

THRESHOLD = 256 << 20
"""Both thresholds, bytes: a block below it comes from the heap, and a free heap top below it stays there."""

_state = {"kept": None}


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds to :data:`THRESHOLD` for this process (once); True when set.

    False, and nothing changed, where the C library is not glibc (no ``mallopt``, or it refuses: musl's is a
    no-op that returns 0), off Linux, or with ``OTM_KEEP_FREED_MEMORY=0``."""
    if _state["kept"] is not None:
        return _state["kept"]
    kept = False
    if os.environ.get("OTM_KEEP_FREED_MEMORY", "1") != "0" and sys.platform.startswith("linux"):
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            kept = mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, THRESHOLD) == 1
    _state["kept"] = kept
    return kept


def line() -> str:
    """For the conditions of a run: whether freed memory is kept."""
    kept = _state["kept"]
    if kept is None:
        return "malloc: the C library's defaults"
    if kept:
        return f"malloc: freed memory kept (glibc mmap and trim thresholds {THRESHOLD >> 20} MiB)"
    return "malloc: the C library's defaults (OTM_KEEP_FREED_MEMORY=0, or not glibc)"


__all__ = ["THRESHOLD", "keep_freed_memory", "line"]
