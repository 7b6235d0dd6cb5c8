r"""The target's linear layers on its GGUF's own 4-bit weights: ``--compile int4``.

The embedded target *is* a 4-bit model: ``SmolLM2-135M-Instruct.Q4_1.gguf`` stores every linear layer of its 30
blocks as Q4_1 (blocks of 32 weights, each block ``w = d q + m`` with ``q`` in 0..15 and ``d``, ``m`` float16);
:func:`otm.decode.embedded.default_target_path` dequantises it once into a float32 Hugging Face copy, and the
decoder has so far run that copy, reading 2 (bfloat16) or 4 (float32) bytes a weight where the file holds 0.625.
On a CPU a decoder call on a few positions is bound by reading the weights, so this module runs the layers on
the file's own blocks instead: torch's 4-bit CPU GEMM (``torch.ops.aten._weight_int4pack_mm_for_cpu``, the
weight-only int4 kernel of torchao and gpt-fast), each group of 32 weights computed as ``(q - 8) s + z`` with
``s = d``, ``z = m + 8 d`` (for Q4_0, ``w = d (q - 8)``: ``z = 0``). Activations, scales and zeros are bfloat16
(the kernel's fast path; float32 and float16 take a slow generic path, 40x slower here), the sums float32; a
float32 target's layers round their inputs to bfloat16 for the kernel and return float32, the rest of the model
staying float32 (the CPUs without native bfloat16 decode in float32).

What the model then is. The weights the kernel computes with are the GGUF's, except that each group's scale
and zero are rounded to bfloat16; the bfloat16 model of ``--dtype bfloat16`` rounds each *weight* to bfloat16
instead. Both are the same Q4_1 model up to bfloat16 rounding: on the embedded target the laws of either lie
0.018-0.020 in total variation from the float32 copy's (mean over 360 sampled positions), and 0.009 for a float32
target on the blocks (``docs/decode.md``, "The GGUF's own weights"). The decoder's laws are the model's as run, whichever of them runs, so exactness is
untouched; a row's result does not depend on how many positions a call computes (the kernel computes each row
alike, checked bit for bit in ``tests/test_int4.py``), so one run is one model.

Every weight is checked before it is used: the blocks, dequantised as the GGUF's own reader does, must equal the
target's weight (after the row permutation llama.cpp applies to the query and key projections, undone as
transformers undoes it on load) exactly in the target's dtype; a target that is not that GGUF's conversion is
refused in one line. Attention's q/k/v and a gated MLP's gate/up are one GEMM each (:class:`Int4Linear`: the
first call computes every sibling's columns, the siblings called with that very tensor take theirs). The head
(Q8_0 in the file, no 8-bit kernel with per-block scales in torch) and everything else stay as they were, on
oneDNN where ``--compile int4`` swaps them too (:func:`otm.decode.onednn.for_choice`).

Costs on the embedded target (the 2-core AMD EPYC with avx512_bf16, torch 2.13.0+cpu, one thread, a call after a
200-token context): T(1) 12.5 ms against 17.0 ms with oneDNN's bfloat16 GEMM, T(3) 15.6 / 19.9, T(5) 19.8 /
21.5, T(9) 25.4 / 24.5: the kernel computes 4 rows per pass over the weights, so beyond 4 positions a call costs
a pass more every 4 rows.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from ..laws import OtmError
from .siblings import SIBLINGS, LastCall

OP = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")
"""Whether this torch has the 4-bit CPU GEMM and its packing."""

GROUP = 32
"""Weights per block of the GGUF's Q4_0 / Q4_1 (one scale, and for Q4_1 one minimum, each)."""

Q4_0, Q4_1 = 2, 3
"""GGML's type numbers of the two 4-bit block formats run here (``gguf.GGMLQuantizationType``)."""

BLOCK_BYTES = {Q4_0: 18, Q4_1: 20}
"""Bytes of one block of 32 weights: float16 d (and, Q4_1, float16 m), then 16 bytes of 4-bit values."""

LLAMA = (("attn_q", "self_attn", "q_proj"), ("attn_k", "self_attn", "k_proj"), ("attn_v", "self_attn", "v_proj"),
         ("attn_output", "self_attn", "o_proj"), ("ffn_gate", "mlp", "gate_proj"), ("ffn_up", "mlp", "up_proj"),
         ("ffn_down", "mlp", "down_proj"))
"""A llama-architecture GGUF's tensor ``blk.{i}.<name>.weight`` and the Hugging Face module holding it in
``model.layers[i]``."""

DTYPES = (torch.bfloat16, torch.float32)
"""Target dtypes swapped. The kernel's fast path takes bfloat16 activations: a float32 target's layers round their
inputs to bfloat16 for it and return float32 (the rest of the model stays float32)."""


def unpack(raw: np.ndarray, kind: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of one 4-bit GGUF tensor: ``raw`` uint8 ``[N, K / 32 * block bytes]`` (a row of N output rows,
    K inputs) -> ``(q, d, m)``: ``q`` uint8 ``[N, K]`` in 0..15, ``d`` and ``m`` float16 ``[N, K / 32]``
    (``m`` zero for Q4_0). In a block, byte j holds weight j (low nibble) and weight j + 16 (high nibble).

    >>> raw = np.array([[0x00, 0x3c, 0x00, 0xbc] + [0x21] * 16], dtype=np.uint8)  # d = 1, m = -1
    >>> q, d, m = unpack(raw, Q4_1)
    >>> q[0, :2].tolist(), q[0, 16:18].tolist(), float(d[0, 0]), float(m[0, 0])
    ([1, 1], [2, 2], 1.0, -1.0)
    """
    if kind not in BLOCK_BYTES:
        raise OtmError(f"GGUF type {kind} is not a 4-bit block format run here (Q4_0 = {Q4_0}, Q4_1 = {Q4_1})")
    size = BLOCK_BYTES[kind]
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % size:
        raise OtmError(f"a {('Q4_0', 'Q4_1')[kind - Q4_0]} tensor's rows hold whole blocks of {size} bytes; got rows of "
                       f"{raw.shape[-1]} bytes")
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0] if kind == Q4_1 else np.zeros_like(d)
    qs = blocks[..., size - 16:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, -1)
    return q, d, m


def dequantize(q: np.ndarray, d: np.ndarray, m: np.ndarray, kind: int) -> np.ndarray:
    """The float32 weights of the blocks as GGML's reference (and the GGUF reader transformers loads with)
    computes them: Q4_1 ``d q + m``, Q4_0 ``d (q - 8)``, in float32."""
    d32 = np.repeat(d.astype(np.float32), GROUP, axis=1)
    if kind == Q4_0:
        return d32 * (q.astype(np.float32) - np.float32(8))
    return d32 * q.astype(np.float32) + np.repeat(m.astype(np.float32), GROUP, axis=1)


def scales_and_zeros(d: np.ndarray, m: np.ndarray, kind: int) -> torch.Tensor:
    """The kernel's ``[K / 32, N, 2]`` bfloat16 groups: ``w = (q - 8) s + z`` with ``s = d``, ``z = m + 8 d``
    (Q4_1) or 0 (Q4_0). d and m are float16, so d, 8 d and their sum are exact in float32 (unless m and 8 d lie
    more than 13 binary orders apart: then rounded once there); each is then rounded to bfloat16."""
    d32 = d.astype(np.float32)
    z = np.zeros_like(d32) if kind == Q4_0 else m.astype(np.float32) + np.float32(8) * d32
    return torch.from_numpy(np.stack([d32.T, z.T], axis=-1)).to(torch.bfloat16).contiguous()


def rope_rows(n: int, heads: int) -> np.ndarray:
    """The row order transformers gives a llama GGUF's query (``heads`` = attention heads) or key (kv heads)
    projection: llama.cpp stores each head's rows interleaved for its RoPE; row r of the Hugging Face weight
    is row ``rope_rows(n, heads)[r]`` of the file's.

    >>> rope_rows(8, 1).tolist()
    [0, 2, 4, 6, 1, 3, 5, 7]
    """
    half = n // heads // 2
    return np.arange(n).reshape(heads, half, 2).swapaxes(2, 1).reshape(n)


class Int4Linear(torch.nn.Module):
    """``nn.Linear`` computed by torch's 4-bit CPU GEMM on GGUF blocks, alone or as one of sibling projections
    fused into one GEMM: called with the input its group last computed (the very tensor, ``is``: as attention
    and a gated MLP call their siblings) it returns its columns of that output, else computes every sibling's
    columns and keeps them (:class:`otm.decode.siblings.LastCall`, as :class:`otm.decode.onednn.FusedLinear` does).
    Activations go in as bfloat16 and the output comes back in the input's dtype. The dense weight stays (shared),
    as the undo and tied weights need it; there is no bias (:func:`use_int4` refuses layers with one)."""

    def __init__(self, linear: torch.nn.Linear, packed: torch.Tensor, scale_zero: torch.Tensor, lo: int, last: LastCall):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.lo, self.hi = lo, lo + linear.out_features
        self.packed, self.scale_zero, self.last = packed, scale_zero, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced: each sibling asks for the group's GEMM, computed once by the graph
            return self._group(x)[..., self.lo : self.hi]
        last = self.last
        if last.x is not x:
            last.x, last.out = x, self._group(x)
        return last.out[..., self.lo : self.hi]

    def _group(self, x: torch.Tensor) -> torch.Tensor:
        """Every sibling's columns for ``x``: the group's GEMM, bfloat16 in, ``x``'s dtype out."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if flat.dtype != torch.bfloat16:
            flat = flat.to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scale_zero)
        return out.reshape(*shape[:-1], out.shape[-1]).to(x.dtype)

    def extra_repr(self) -> str:
        total = self.packed.shape[0]
        where = "" if total == self.out_features else f", columns {self.lo}:{self.hi} of a fused GEMM"
        return f"in_features={self.in_features}, out_features={self.out_features}, 4-bit GGUF blocks{where}"


def gguf_source(model) -> Path | None:
    """The GGUF file ``model``'s weights were converted from, where otm knows it: the embedded target (its fp32
    copy in the user cache, :func:`otm.decode.embedded.default_target_path`); else ``model.otm_gguf`` if set."""
    path = getattr(model, "otm_gguf", None)
    if path is not None:
        return Path(path)
    from .embedded import TARGET_CACHE_NAME, target_gguf, cache_dir

    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    try:
        if name and Path(name).resolve() == (cache_dir() / TARGET_CACHE_NAME).resolve():
            return target_gguf()
    except (OSError, OtmError):
        return None
    return None


def available(model) -> bool:
    """Whether ``--compile int4`` can run ``model``: this torch has the kernel, the model is a bfloat16 or
    float32 llama on the CPU, not spread by accelerate, and its GGUF is known (:func:`gguf_source`). Whether the weights
    match the file is checked when they are swapped (:func:`use_int4`)."""
    try:
        p = next(model.parameters())
    except (AttributeError, StopIteration, TypeError):
        return False
    return (OP and p.device.type == "cpu" and p.dtype in DTYPES and not getattr(model, "hf_device_map", None)
            and getattr(getattr(model, "config", None), "model_type", None) == "llama" and gguf_source(model) is not None)


@functools.lru_cache(maxsize=2)
def _tensors(path: str, mtime_ns: int, size: int) -> dict:
    """The GGUF's tensors by name (memory-mapped), read once per process and file version: parsing the file's
    metadata (the tokenizer's 49152 strings) takes about 3 s, the swap itself 0.5 s."""
    import gguf as gguf_lib

    return {t.name: t for t in gguf_lib.GGUFReader(path).tensors}


def _refuse(why: str) -> OtmError:
    return OtmError(f"--compile int4: {why}")


def use_int4(target, gguf: str | Path | None = None):
    """Swap the linear layers of ``target``'s blocks for :class:`Int4Linear` on the blocks of ``gguf`` (default:
    :func:`gguf_source`), after checking that every one of them is the target's weight (module docstring);
    returns ``undo()``, with ``undo.count`` the modules swapped (0 when ``target`` was already swapped). Refuses
    in one line (``OtmError``) a target that is not a bfloat16 or float32 llama on the CPU, a torch without the kernel, a
    GGUF that is not 4-bit or not the target's."""
    def nothing() -> None:
        pass

    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is not None and any(isinstance(m, Int4Linear) for m in target.modules()):
        nothing.count = 0  # type: ignore[attr-defined]
        return nothing
    if not OP:
        raise _refuse(f"torch {torch.__version__} has no 4-bit CPU GEMM (torch.ops.aten._weight_int4pack_mm_for_cpu): "
                      "use --compile onednn or auto")
    config = getattr(target, "config", None)
    if layers is None or getattr(config, "model_type", None) != "llama":
        raise _refuse("runs llama-architecture targets (the embedded SmolLM2): use --compile onednn or auto")
    p = next(target.parameters())
    if p.device.type != "cpu" or p.dtype not in DTYPES:
        raise _refuse(f"runs a bfloat16 or float32 target on the CPU, this one is {str(p.dtype)[6:]} on "
                      f"{p.device.type}: use --dtype bfloat16 or float32, or --compile onednn")
    path = Path(gguf) if gguf is not None else gguf_source(target)
    if path is None:
        raise _refuse("runs the weights of the GGUF the target was converted from, and this target has none that otm "
                      "knows (the embedded target's is known): use --compile onednn or auto")
    try:
        stat = path.stat()
        tensors = _tensors(str(path), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError) as exc:
        raise _refuse(f"cannot read {path}: {exc}") from None
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    planned: list[tuple[torch.nn.Module, str, torch.nn.Module, Int4Linear]] = []
    with torch.no_grad():
        for i, layer in enumerate(layers):
            blocks: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}
            for file_name, parent_name, name in LLAMA:
                key = f"blk.{i}.{file_name}.weight"
                tensor = tensors.get(key)
                linear = getattr(getattr(layer, parent_name, None), name, None)
                if tensor is None or type(linear) is not torch.nn.Linear:
                    raise _refuse(f"{path.name} has no {key} for the target's layer {i} {name}, or the target's is not a "
                                  "plain nn.Linear: the target is not this GGUF's conversion")
                kind = int(tensor.tensor_type)
                if kind not in BLOCK_BYTES:
                    raise _refuse(f"{key} is {tensor.tensor_type.name}; the 4-bit kernel runs Q4_0 and Q4_1 blocks only")
                rows = int(np.prod([int(x) for x in tensor.shape[1:]]))  # GGUF shapes list the inner dimension first
                q, d, m = unpack(np.asarray(tensor.data).reshape(rows, -1), kind)
                if name in ("q_proj", "k_proj"):
                    order = rope_rows(q.shape[0], heads if name == "q_proj" else kv_heads)
                    q, d, m = q[order], d[order], m[order]
                weight = linear.weight
                if tuple(q.shape) != tuple(weight.shape) or linear.bias is not None:
                    raise _refuse(f"{key} is {q.shape[0]} x {q.shape[1]}, the target's layer {i} {name} "
                                  f"{tuple(weight.shape)}{' with a bias' if linear.bias is not None else ''}: "
                                  "the target is not this GGUF's conversion")
                ref = torch.from_numpy(dequantize(q, d, m, kind)).to(weight.dtype)
                if not torch.equal(ref, weight.detach()):
                    gap = (ref.float() - weight.detach().float()).abs().max().item()
                    raise _refuse(f"the target's layer {i} {name} is not {path.name}'s {key} (they differ by up to "
                                  f"{gap:.3g}): the target must be that GGUF's conversion")
                blocks[name] = (q, d, m, kind)
            for group in SIBLINGS + (("o_proj",), ("down_proj",)):
                parent = layer.self_attn if group[0] in ("q_proj", "o_proj") else layer.mlp
                q = np.concatenate([blocks[n][0] for n in group])
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 1)
                sz = torch.cat([scales_and_zeros(*[blocks[n][j] for j in (1, 2, 3)]) for n in group], dim=1).contiguous()
                last, lo = LastCall(), 0
                for n in group:
                    linear = getattr(parent, n)
                    planned.append((parent, n, linear, Int4Linear(linear, packed, sz, lo, last)))
                    lo += linear.out_features
    for parent, n, _, layer4 in planned:  # every weight checked: now swap (nothing half-swapped on a refusal)
        setattr(parent, n, layer4)
    swaps = [(parent, n, linear) for parent, n, linear, _ in planned]

    def undo() -> None:
        for parent, n, linear in reversed(swaps):
            setattr(parent, n, linear)
        swaps.clear()

    undo.count = len(swaps)  # type: ignore[attr-defined]
    return undo


__all__ = ["GROUP", "Int4Linear", "OP", "Q4_0", "Q4_1", "available", "dequantize", "gguf_source", "rope_rows",
           "scales_and_zeros", "unpack", "use_int4"]
