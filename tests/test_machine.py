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
