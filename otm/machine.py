"""What machine a figure was measured on: the CPU model and the instruction sets that decide how fast a
model runs on it (AVX2, AVX-512, AVX-512 BF16, AMX), the BLAS behind torch and numpy, torch's CPU
kernels, and the threads. Printed beside every decode benchmark and the demo, so a speed-up is never
read without its machine."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
"""The /proc/cpuinfo flags that change how fast a model runs (fp32 width, native bfloat16, matrix units)."""


@dataclass(frozen=True)
class Machine:
    cpu: str  # model name
    cores: int  # CPUs this process may use
    flags: tuple[str, ...]  # those of FLAGS the CPU has
    torch_kernels: str | None  # torch's CPU capability (its vectorised kernels: AVX2, AVX512, ...)
    torch_blas: str | None  # BLAS torch was built with (mkl, openblas, ...)
    numpy_blas: str | None
    threads: int | None  # torch's intra-op threads
    emulated: str | None = None  # OTM_EMULATED: the machine is emulated (analysis/emulate_avx2.sh), said in the line

    @property
    def native_bf16(self) -> bool:
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    def line(self, compile_mode: str = "eager") -> str:
        """One line: ``machine: CPU (n CPUs; flags); torch kernels X, BLAS torch Y / numpy Z; t threads; mode``."""
        flags = " ".join(self.flags) if self.flags else "none of " + "/".join(FLAGS)
        return (f"machine: {self.cpu} ({self.cores} CPUs; {flags}; native bfloat16 "
                f"{'yes' if self.native_bf16 else 'no'}); torch kernels {self.torch_kernels or '?'}, BLAS torch "
                f"{self.torch_blas or '?'} / numpy {self.numpy_blas or '?'}; {self.threads or '?'} torch threads; "
                + (f"emulated: {self.emulated}; " if self.emulated else "") + compile_mode)


def _cpuinfo(text: str | None = None) -> tuple[str, tuple[str, ...]]:
    if text is None:
        path = Path("/proc/cpuinfo")
        text = path.read_text() if path.exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return (model.group(1).strip() if model else platform.processor() or platform.machine(),
            tuple(f for f in FLAGS if f in have))


def machine(cpuinfo: str | None = None) -> Machine:
    """The machine this process runs on (torch's fields are None when torch is not installed)."""
    cpu, flags = _cpuinfo(cpuinfo)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    kernels = torch_blas = threads = None
    try:
        import torch

        kernels = torch.backends.cpu.get_cpu_capability()
        found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
        torch_blas = found.group(1) if found else None
        threads = torch.get_num_threads()
    except ImportError:
        pass
    numpy_blas = None
    try:
        import numpy as np

        numpy_blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name")
    except (KeyError, TypeError, AttributeError):  # numpy's config layout is not an API: the line says "?"
        numpy_blas = None
    return Machine(cpu, cores, flags, kernels, torch_blas, numpy_blas, threads, os.environ.get("OTM_EMULATED") or None)


__all__ = ["FLAGS", "Machine", "machine"]
