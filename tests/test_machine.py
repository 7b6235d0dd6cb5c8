"""otm.machine: the line that names the machine beside every decode figure."""

from __future__ import annotations

from otm.machine import FLAGS, machine

AVX2_ONLY = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx fma avx2 bmi2
"""
SAPPHIRE = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu avx avx2 fma avx512f avx512_bf16 avx512_vnni amx_tile amx_bf16 amx_int8
"""


def test_flags_and_native_bf16_from_cpuinfo():
    a = machine(AVX2_ONLY)
    assert a.cpu == "AMD EPYC 7B13" and a.flags == ("avx2", "fma") and not a.native_bf16
    line = a.line()
    assert line.startswith("machine: AMD EPYC 7B13 (") and "native bfloat16 no" in line and line.endswith("eager")
    b = machine(SAPPHIRE)
    assert b.native_bf16 and set(b.flags) == set(FLAGS) - {"avx_vnni"}
    assert "amx_bf16" in b.line("compiled") and b.line("compiled").endswith("compiled")


def test_this_machine_names_torch_kernels_and_both_blas():
    m = machine()
    assert m.cores >= 1 and m.torch_kernels and m.torch_blas and m.numpy_blas and m.threads >= 1
    assert f"torch kernels {m.torch_kernels}" in m.line()


def test_an_emulated_machine_says_so(monkeypatch):
    monkeypatch.setenv("OTM_EMULATED", "AVX2 only (test)")
    line = machine(AVX2_ONLY).line("eager")
    assert "; emulated: AVX2 only (test); eager" in line
    monkeypatch.delenv("OTM_EMULATED")
    assert "emulated" not in machine(AVX2_ONLY).line()


def test_emulate_avx2_limits_cpuinfo_torch_and_names_itself():
    """analysis/emulate_avx2.sh: the figures of an AVX2-only machine on an AVX-512 one (docs/decode.md)."""
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    script = Path(__file__).resolve().parents[1] / "analysis" / "emulate_avx2.sh"
    if "avx2" not in machine().flags:
        pytest.skip("this CPU has no AVX2 to limit torch to")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0 and \
            subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare refused): the script says so in one line")
    code = ("import torch; from otm.machine import machine; from otm.decode.models import cpu_bf16_flags; "
            "m = machine(); print(torch.backends.cpu.get_cpu_capability()); print(m.line()); print(cpu_bf16_flags())")
    out = subprocess.run([str(script), sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kernels, line, bf16 = out.stdout.strip().splitlines()
    assert kernels == "AVX2" and "torch kernels AVX2" in line
    assert "avx512" not in line and "amx" not in line and "native bfloat16 no" in line and bf16 == "[]"
    assert "emulated: AVX2 only" in line
    empty = subprocess.run([str(script)], capture_output=True, text=True)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1
