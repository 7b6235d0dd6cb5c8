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

import contextlib
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from ..torch import _rho

PHASES = ("draft", "target", "verify", "laws", "accept", "rollback", "other")
"""The parts of a decoder step (``_Decoder.step``): drafting (with the read of the drafted rows, from which
the tree is built on the host), the target's pass, the tree rule's walk ("verify"), within it the copy of the
step's laws to the host by a whole-tree rule whose arithmetic is numpy ("laws": ``otm.decode.tree_rules.HostLaws``),
the read of the step's outcome ("accept": ``_Decoder.read``, the emitted tokens and the accepted path of the
level-by-level walk, the acceptance decision itself), the caches' rollback; "other" for the rest of the run
(stop checks, streaming)."""

READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero",
                   "argwhere", "masked_select", "unique"})
"""Tensor calls that read values back to the host (or make a shape that depends on them)."""


HOST_BORN = "_otm_host_born"
"""Attribute of a tensor built on the host from host ints (the draft tree's tables, :mod:`otm.decode.tree`): it
lives on the CPU whatever the models' device, so reading it is no device sync and is not counted (nor is
reading the parts of it that indexing, ``unbind`` or iteration give)."""

_KEEPS_HOST_BORN = frozenset({"__getitem__", "unbind", "__iter__", "reshape", "view", "flatten", "clone"})


@contextlib.contextmanager
def device_paths():
    """Inside: the decoder's walk and the torch verifiers take their device paths on the CPU too
    (``otm.torch._rho.FORCE_DEVICE_PATH``), so that a count of host reads on the CPU is what a GPU would
    sync on; outside, the CPU keeps its faster host paths (a read costs nothing there)."""
    old = _rho.FORCE_DEVICE_PATH
    _rho.FORCE_DEVICE_PATH = True
    try:
        yield
    finally:
        _rho.FORCE_DEVICE_PATH = old


def host_born(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` (a CPU tensor made from host values) as host-born; returns it."""
    setattr(t, HOST_BORN, True)
    return t


def _is_host_born(args) -> bool:
    return bool(args) and isinstance(args[0], torch.Tensor) and getattr(args[0], HOST_BORN, False)


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
        self.paused = False  # True while a rule computes on host copies of its laws (no device involved)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        born = _is_host_born(args)
        if not born and not self.paused and _reads_values(func, args):
            self.counts[self.phase] += 1
        out = func(*args, **(kwargs or {}))
        if born and getattr(func, "__name__", "") in _KEEPS_HOST_BORN:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    host_born(t)
        return out


__all__ = ["HOST_BORN", "PHASES", "READS", "HostReads", "host_born"]
