"""Counting the decoder's reads of tensor values back to the host, by the phase of its step.

On a GPU each such read (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``.numpy()``,
``.cpu()``, ``nonzero``, indexing with a boolean mask) waits for the device: a synchronisation, which stalls
the stream and prevents capturing the step in a CUDA graph. On the CPU they cost nothing, but they are the
same calls, so counting them here tells what the step would synchronise on a GPU. The counter is a
``TorchFunctionMode`` (it sees the calls inside the models too); it slows every torch call, so counted
runs are never the timed ones.

>>> import torch
>>> with HostReads() as reads:
...     reads.phase = "verify"
...     _ = torch.tensor([1.0, 2.0]).sum().item()
>>> dict(reads.counts)
{'verify': 1}
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

PHASES = ("draft", "target", "verify", "rollback", "other")
"""The parts of a decoder step (``_Decoder.step``): drafting, the target's pass, the tree rule's walk,
the caches' rollback; "other" for the rest of the run (stop checks, streaming)."""

READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero",
                   "argwhere", "masked_select", "unique"})
"""Tensor calls that read values back to the host (or make a shape that depends on them)."""


def _reads_values(func, args) -> bool:
    name = getattr(func, "__name__", "")
    if name in READS:
        return True
    if name == "__getitem__" and len(args) > 1:  # t[mask]: its shape depends on the mask's values
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return False


class HostReads(TorchFunctionMode):
    """Counts host reads by ``phase`` (set by the decoder as its step goes)."""

    def __init__(self):
        super().__init__()
        self.phase = "other"
        self.counts: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _reads_values(func, args):
            self.counts[self.phase] += 1
        return func(*args, **(kwargs or {}))


__all__ = ["PHASES", "READS", "HostReads"]
