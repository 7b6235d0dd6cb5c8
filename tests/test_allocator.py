"""Freed memory kept in the process (otm.decode.allocator): a 64 MiB block freed stays in the heap instead of going
back to the kernel (glibc's own accounting, mallinfo2: deterministic), a decoder-like loop of large temporaries
stops faulting its pages in again where the defaults do; the switch off, and the line a run prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# A step's temporaries, made larger than glibc's largest adaptive mmap threshold (32 MiB), so that the defaults
# refault them on every round whatever came before (the decoder's 1.5-7 MB laws refault by the same mechanism
# once the adaptive thresholds lag behind its mix of sizes: docs/decode.md, "Freed memory kept").
LOOP = r"""
import json, resource, torch
from otm.decode.allocator import keep_freed_memory
kept = keep_freed_memory()
torch.set_num_threads(1)
def step():
    laws = torch.softmax(torch.randn(4, 1 << 20, dtype=torch.bfloat16).to(torch.float64), -1)  # 32 MiB
    return float(laws[0, 0])
for _ in range(3):
    step()
rounds = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    rounds.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": sorted(rounds)[len(rounds) // 2], "rounds": rounds}))
"""


# One 64 MiB block through libc's malloc and free: glibc's accounting of where it came from and where it went.
BLOCK = r"""
import ctypes, json
from otm.decode.allocator import keep_freed_memory
kept = keep_freed_memory()
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
n = 64 << 20
block = libc.malloc(n)
ctypes.memset(block, 1, n)
during = libc.mallinfo2().hblkhd
libc.free(block)
print(json.dumps({"kept": kept, "mmapped": during, "free_in_heap": libc.mallinfo2().fordblks}))
"""


def _run(keep: bool, code: str = LOOP) -> dict:
    env = {**os.environ, "OTM_KEEP_FREED_MEMORY": "1" if keep else "0", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


def _glibc() -> bool:
    import ctypes

    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt and mallinfo2 (Linux, glibc >= 2.33)")
def test_a_freed_block_stays_in_the_heap():
    off, on = _run(False, BLOCK), _run(True, BLOCK)
    assert off["kept"] is False and on["kept"] is True
    # the defaults: the block is mmapped and, freed, goes back to the kernel (the negative control)
    assert off["mmapped"] >= 64 << 20 and off["free_in_heap"] < 64 << 20
    # kept: the block comes from the heap and, freed, stays there for the next step
    assert on["mmapped"] < 64 << 20 and on["free_in_heap"] >= 64 << 20


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt (Linux)")
def test_kept_freed_memory_stops_the_refaulting():
    off, on = _run(False), _run(True)
    # the defaults fault the temporaries' pages in again every round (8,192 pages a 32 MiB tensor): the negative
    # control; kept, they come back from the heap already mapped. The median of 16 rounds: kept, the heap may still
    # grow in the first rounds (after three warm-up steps 0-2 of them here, after one 1-4, 2,048-16,384 faults each:
    # a mean over 10 rounds failed once in CI, 4,915 against 17,405), then no round faults at all
    assert off["faults"] > 4000 and on["faults"] < 0.25 * off["faults"], (on, off)


def test_switched_off_and_the_conditions_line(monkeypatch):
    from otm.decode import allocator

    monkeypatch.setitem(allocator._state, "kept", None)
    assert allocator.line() == "malloc: the C library's defaults"
    monkeypatch.setenv("OTM_KEEP_FREED_MEMORY", "0")
    assert allocator.keep_freed_memory() is False
    assert "OTM_KEEP_FREED_MEMORY=0" in allocator.line()
    monkeypatch.setitem(allocator._state, "kept", True)
    assert allocator.keep_freed_memory() is True  # once per process: the first answer stays
    assert allocator.line() == "malloc: freed memory kept (glibc mmap and trim thresholds 256 MiB)"
