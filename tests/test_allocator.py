"""Freed memory kept in the process (otm.decode.allocator): a decoder-like loop of large temporaries stops
faulting its pages in again every step; the switch off, the C library's defaults, and the line a run prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# A step of the decoder's kind: the float64 laws of a tree pass (17 or 5 positions x 49152 tokens) computed
# from bfloat16 logits, a few rows kept past the step; minor page faults per step counted by getrusage.
LOOP = r"""
import json, resource, sys, torch
from otm.decode.allocator import keep_freed_memory
kept = keep_freed_memory()
torch.set_num_threads(1)
def step(n):
    laws = torch.softmax(torch.randn(n, 49152, dtype=torch.bfloat16).to(torch.float64), -1)
    return laws[:4].clone()
held = [step(17) for _ in range(5)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(40):
    held = (held + [step(17 if i % 2 else 5)])[-3:]
print(json.dumps({"kept": kept, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40}))
"""


def _run(keep: bool) -> dict:
    env = {**os.environ, "OTM_KEEP_FREED_MEMORY": "1" if keep else "0", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", LOOP], capture_output=True, text=True, env=env, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_kept_freed_memory_stops_the_refaulting():
    off, on = _run(False), _run(True)
    assert off["kept"] is False
    if not on["kept"]:
        pytest.skip("the C library here is not glibc (mallopt refused): nothing to keep")
    if off["faults"] < 200:  # one step's 13 MB of temporaries is 3,300 pages: the defaults here do not refault
        pytest.skip(f"this C library's defaults keep the memory already ({off['faults']:.0f} faults a step)")
    # negative control above: the defaults fault the pages in again (hundreds a step); kept, a small fraction
    assert on["faults"] < 0.25 * off["faults"], (on, off)


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
