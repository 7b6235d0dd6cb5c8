r"""The models' linear layers on oneDNN's prepacked GEMM: ``--compile onednn``, the eager step with another GEMM.

On a CPU, torch computes a float32 ``nn.Linear`` by MKL's ``sgemm``, whose path for a few rows (the
decoder's calls: 1 to 1 + kL positions) is several times slower than the memory allows, and its bfloat16
linear reorders the weight at every call; oneDNN's inner product on a weight reordered once into its own
layout (``torch.ops.mkldnn._linear_pointwise``, what inductor's freezing emits) is neither. On the embedded
target (the 2-core AMD EPYC with avx512f avx512_bf16, torch 2.13.0+cpu, one thread;
``analysis/onednn_costs.py``): float32 T(1) 41.5 -> 27.3 ms and T(3) 2.15 -> 1.17 T(1); bfloat16 T(1) 28.5 ->
20.5 ms (table and commands: ``docs/decode.md``, "The linear layers on oneDNN"). Whether it pays is measured
per machine by ``--compile auto`` (:mod:`otm.decode.compile_choice`), beside the eager and the compiled step.

:func:`use_onednn` swaps every ``nn.Linear`` of a swapped dtype (:func:`dtypes`) on the CPU for a
:class:`OneDnnLinear` holding a prepacked copy of its weight (the dense weight stays, shared, so tied weights
and ``get_output_embeddings`` still work), gives the heads computed by ``F.linear`` (a feature draft's, a
draft-vocabulary subset's) oneDNN copies, and returns the undo. The numbers differ from torch's own by
rounding (sums in another order); the laws the decoder verifies are the model's whichever GEMM computed them,
so exactness is untouched. Every contender of a bench (autoregressive, speculative, transformers'
``generate`` and assisted generation) runs on the same swapped models: the ratios stay fair.

The same swap fuses a module's sibling projections (:data:`otm.decode.siblings.SIBLINGS`: attention's q/k/v, a gated MLP's
gate/up) into one GEMM (:class:`FusedLinear`) and runs Llama's RMSNorm as one ``F.rms_norm``: 3-6 % off a
target call on the embedded pair (``analysis/onednn_fused_ab.py``; ``docs/decode.md``, "Siblings fused").

Swapped models compile too (``--compile int4-compiled``, the static step): traced, a layer's product is one opaque
custom op, ``otm::packed_linear``, naming its prepacked weight by a digest of the weight's content (dynamo cannot
hold oneDNN's packed tensor), and fused siblings each ask for their group's product, which the frozen graph computes
once.
"""

from __future__ import annotations

import functools
import hashlib
import weakref

import torch

from ..laws import OtmError
from .siblings import SIBLINGS, LastCall

POINTWISE = hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
"""Whether this torch has the prepacked-weight linear of inductor's freezing (the fast path of :class:`OneDnnLinear`)."""


def dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes swapped: float32, and bfloat16 where the prepacked path exists and oneDNN computes
    bfloat16 on this CPU (there torch's own bfloat16 linear reorders the weight at every call)."""
    bf16 = POINTWISE and bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


_PACKED: dict[int, list] = {}
"""The prepacked weights a compiled graph reads (:func:`_packed_linear`), by the handle of their content: the
modules holding them, weakly (an undone swap frees its weights)."""


def _digest(weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The handle of a prepacked product: a digest of its dense weight and bias, so that a graph names the same handle
    in every process (inductor's kernel cache then finds it) and two modules with one handle compute the same product
    (either serves)."""
    digest = hashlib.blake2b(digest_size=8)
    for t in (weight, bias):
        if t is not None:
            digest.update(str((tuple(t.shape), t.dtype)).encode())
            digest.update(t.detach().contiguous().view(torch.uint8).numpy().data)
    return int.from_bytes(digest.digest(), "little") >> 1  # an int64 argument of the custom op


def _hold(handle: int, module) -> None:
    """``module`` (its ``packed`` and ``dense_bias``) serves ``handle`` while it lives."""
    _PACKED[handle] = [r for r in _PACKED.get(handle, []) if r() is not None] + [weakref.ref(module)]


def _holder(handle: int):
    for ref in _PACKED.get(handle, []):
        module = ref()
        if module is not None:
            return module
    raise KeyError(f"no live module holds the prepacked weight {handle}")


if POINTWISE:
    @torch.library.custom_op("otm::packed_linear", mutates_args=())
    def _packed_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
        """oneDNN's inner product on the prepacked weight of module ``handle`` (its ``packed`` and ``dense_bias``):
        one opaque call in a compiled graph (dynamo cannot hold oneDNN's packed tensor), the eager path's call."""
        m = _holder(handle)
        return torch.ops.mkldnn._linear_pointwise(x, m.packed, m.dense_bias, "none", [], "")

    @_packed_linear.register_fake
    def _(x, handle, out_features):
        return x.new_empty((*x.shape[:-1], out_features))


class OneDnnLinear(torch.nn.Module):
    """``nn.Linear`` computed by oneDNN's inner product on a weight prepacked once (CPU; float32, or bfloat16
    with the prepacked path).

    The product is ``torch.ops.mkldnn._linear_pointwise`` on dense activations with the weight reordered
    once by ``torch.ops.mkldnn._reorder_linear_weight`` (what inductor's freezing emits for a linear layer);
    where this torch lacks those ops, ``torch._C._nn.mkldnn_linear`` on oneDNN tensors (slower: a conversion
    of the activations each call)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the dense weight, shared (tied weights, get_output_embeddings, hooks)
        self.bias = linear.bias
        with torch.no_grad():
            w = linear.weight.detach()
            self.dense_bias = None if linear.bias is None else linear.bias.detach()
            if POINTWISE:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
                self.handle = _digest(w, self.dense_bias)
                _hold(self.handle, self)
            else:
                self.packed = w.to_mkldnn()
                self.packed_bias = None if self.dense_bias is None else self.dense_bias.to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype or x.device.type != "cpu" or (not POINTWISE and x.dtype != torch.float32):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if POINTWISE:
            if torch.compiler.is_compiling():
                return _packed_linear(x, self.handle, self.out_features)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.dense_bias, "none", [], "")
        shape = x.shape
        flat = x.reshape(-1, self.in_features).contiguous()
        out = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), self.packed, self.packed_bias).to_dense()
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def available(model) -> bool:
    """Whether ``model`` has weights of a swapped dtype (:func:`dtypes`) on the CPU, is not spread over devices by
    accelerate (``--device-map``), and this torch has oneDNN."""
    try:
        p = next(model.parameters())
    except (AttributeError, StopIteration, TypeError):
        return False
    if getattr(model, "hf_device_map", None):  # spread by accelerate (--device-map): its hooks move the weights
        return False
    return torch.backends.mkldnn.is_available() and p.device.type == "cpu" and p.dtype in dtypes()


def _over(weight: torch.Tensor) -> OneDnnLinear:
    """A :class:`OneDnnLinear` computing ``F.linear(x, weight)`` (no bias)."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    lin.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    return OneDnnLinear(lin)


class FusedLinear(torch.nn.Module):
    """One of sibling projections fused into one oneDNN GEMM: the first sibling (``lo == 0``) computes every
    sibling's output from its input and keeps it; the others return their columns of it when called with the
    very same input tensor (``is``, as attention and a gated MLP call them), else compute their own by torch's
    ``F.linear`` on their dense weight. The dense weight and bias stay, as in :class:`OneDnnLinear`."""

    def __init__(self, linear: torch.nn.Linear, lo: int, packed, bias, last: LastCall, total: int, handle: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.lo, self.hi = lo, lo + linear.out_features
        self.packed, self.dense_bias, self.last = packed, bias, last  # the group's, shared by the siblings
        self.total, self.handle = total, handle  # the group's GEMM in a compiled graph (_packed_linear)
        _hold(handle, self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and x.dtype == self.weight.dtype and x.device.type == "cpu":
            # traced: each sibling asks for the group's GEMM (one opaque call after the graph's CSE)
            return _packed_linear(x, self.handle, self.total)[..., self.lo : self.hi]
        if self.lo == 0 and x.dtype == self.weight.dtype and x.device.type == "cpu":
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.dense_bias, "none", [], "")
            self.last.x, self.last.out = x, out
            return out[..., : self.hi]
        if self.lo and self.last.x is x:
            return self.last.out[..., self.lo : self.hi]
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, columns {self.lo}:{self.hi} of a fused GEMM"


def _swappable(module, swap) -> bool:
    """A plain ``nn.Linear`` of a swapped dtype on the CPU that accelerate does not move in and out (``_hf_hook``)."""
    return (type(module) is torch.nn.Linear and module.weight.dtype in swap and module.weight.device.type == "cpu"
            and not hasattr(module, "_hf_hook"))


def _fuse(parent, names, swap) -> list[tuple[str, torch.nn.Module]]:
    """Fuse ``parent``'s sibling projections ``names`` where all are plain CPU ``nn.Linear`` of one swapped dtype,
    input width and bias presence, none hooked by accelerate; the originals, for the undo."""
    linears = [getattr(parent, n, None) for n in names]
    if not POINTWISE or not all(_swappable(m, swap) for m in linears):
        return []
    first = linears[0]
    if any(m.weight.dtype != first.weight.dtype or m.in_features != first.in_features
           or (m.bias is None) != (first.bias is None) for m in linears):
        return []
    with torch.no_grad():
        stacked = torch.cat([m.weight.detach() for m in linears])
        packed = torch.ops.mkldnn._reorder_linear_weight(stacked, None)
        bias = None if first.bias is None else torch.cat([m.bias.detach() for m in linears])
    last, lo, out = LastCall(), 0, []
    total, handle = sum(m.out_features for m in linears), _digest(stacked, bias)
    for name, m in zip(names, linears):
        setattr(parent, name, FusedLinear(m, lo, packed, bias, last, total, handle))
        out.append((name, m))
        lo += m.out_features
    return out


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm in one fused op (``F.rms_norm``) instead of six: the same arithmetic in float32."""
    x = torch.nn.functional.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), eps=self.variance_epsilon)
    return self.weight * x.to(hidden_states.dtype)


def _llama_rms_norm(module) -> bool:
    """Whether ``module``'s forward is transformers' Llama RMSNorm, word for word (the copies other models carry
    included), so that :func:`_rms_norm_forward` computes the same."""
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return False
    mine, llama = getattr(type(module).forward, "__code__", None), LlamaRMSNorm.forward.__code__
    return (mine is not None and mine.co_code == llama.co_code and mine.co_names == llama.co_names
            and mine.co_consts == llama.co_consts and hasattr(module, "variance_epsilon")
            and "forward" not in module.__dict__)


FAST = "onednn_linear"
"""Where a module computing ``F.linear`` on a weight of its own (not an ``nn.Linear``) finds its oneDNN copy: such a
module names that weight in a class attribute ``onednn_weight`` (the feature draft's head, the draft-vocabulary
subset head) and uses ``self.__dict__.get(FAST)`` when set."""


def use_onednn(*models, fuse: bool = True):
    """Swap every ``nn.Linear`` of a swapped dtype (:func:`dtypes`) of the given models (None skipped) for a :class:`OneDnnLinear`, and give
    the heads computed by ``F.linear`` (a feature draft's head, a draft-vocabulary subset head) a oneDNN
    copy they use instead; returns ``undo()``, which puts everything back. Models that :func:`available`
    refuses are left as they are, and a model already swapped is not swapped twice. ``fuse`` (default): sibling
    projections as one GEMM (:class:`FusedLinear`) and Llama's RMSNorm as one op; ``fuse=False`` every layer alone."""
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    fast: list[torch.nn.Module] = []
    norms: list[torch.nn.Module] = []
    swap = dtypes()
    for model in models:
        if model is None or not available(model):
            continue
        for parent in list(model.modules()):
            for names in SIBLINGS if fuse else ():
                swapped.extend((parent, name, m) for name, m in _fuse(parent, names, swap))
            if fuse and _llama_rms_norm(parent) and parent.weight.device.type == "cpu" and parent.weight.dtype in swap:
                parent.forward = functools.partial(_rms_norm_forward, parent)  # picklable (a saved graph's state)
                norms.append(parent)
            for name, child in list(parent.named_children()):
                if _swappable(child, swap):
                    setattr(parent, name, OneDnnLinear(child))
                    swapped.append((parent, name, child))
            name = getattr(parent, "onednn_weight", None)
            w = getattr(parent, name, None) if name else None
            if (isinstance(w, torch.Tensor) and FAST not in parent.__dict__ and w.dtype in swap
                    and w.device.type == "cpu"):
                parent.__dict__[FAST] = _over(w)
                fast.append(parent)

    def undo() -> None:
        for parent, name, child in reversed(swapped):
            setattr(parent, name, child)
        for parent in fast:
            parent.__dict__.pop(FAST, None)
        for parent in norms:
            parent.__dict__.pop("forward", None)
        swapped.clear()
        fast.clear()
        norms.clear()

    undo.count = len(swapped) + len(fast) + len(norms)  # type: ignore[attr-defined]
    return undo


def for_choice(choice: str, *models, require: bool = True):
    """The models of a run whose ``--compile`` choice is ``choice``: swapped onto oneDNN for ``onednn``
    (:func:`use_onednn`); for ``int4`` and ``int4-compiled`` the first (the target) onto its GGUF's 4-bit blocks
    (:func:`otm.decode.int4.use_int4`) and the rest of every model onto oneDNN; untouched otherwise; returns the
    undo. ``require``: refuse (``OtmError``) models that the choice leaves as they are (``False``: models already
    swapped, as a bench's are when it times its calls)."""
    if choice in ("int4", "int4-compiled"):
        from .int4 import use_int4

        undo4 = use_int4(models[0])  # a target already swapped: nothing more (count 0)
        undo1 = use_onednn(*models)

        def undo() -> None:
            undo1()
            undo4()

        undo.count = undo1.count + undo4.count  # type: ignore[attr-defined]
        return undo
    if choice == "onednn":
        undo = use_onednn(*models)
        if require and not undo.count:
            raise OtmError("--compile onednn swaps the linear layers of float32 (or, where oneDNN computes it, "
                           "bfloat16) models on the CPU, and these have none: use --compile none or auto")
        return undo

    def undo() -> None:
        pass

    undo.count = 0  # type: ignore[attr-defined]
    return undo


def eager_steps(target) -> list[str]:
    """The choices of ``--compile`` with the eager step that can run ``target`` here: ``none``, ``onednn`` where
    :func:`available`, ``int4`` where :func:`otm.decode.int4.available` (the plan compares them:
    :func:`otm.decode.auto.plan`, ``compiles``)."""
    from .int4 import available as int4_available

    return ["none"] + (["onednn"] if available(target) else []) + (["int4"] if int4_available(target) else [])


__all__ = ["FusedLinear", "OneDnnLinear", "available", "eager_steps", "for_choice", "use_onednn"]
