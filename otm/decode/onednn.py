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
"""

from __future__ import annotations

import torch

from ..laws import OtmError

POINTWISE = hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
"""Whether this torch has the prepacked-weight linear of inductor's freezing (the fast path of :class:`OneDnnLinear`)."""


def dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes swapped: float32, and bfloat16 where the prepacked path exists and oneDNN computes
    bfloat16 on this CPU (there torch's own bfloat16 linear reorders the weight at every call)."""
    bf16 = POINTWISE and bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


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
            else:
                self.packed = w.to_mkldnn()
                self.packed_bias = None if self.dense_bias is None else self.dense_bias.to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype or x.device.type != "cpu" or (not POINTWISE and x.dtype != torch.float32):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if POINTWISE:
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


FAST = "onednn_linear"
"""Where a module computing ``F.linear`` on a weight of its own (not an ``nn.Linear``) finds its oneDNN copy: such a
module names that weight in a class attribute ``onednn_weight`` (the feature draft's head, the draft-vocabulary
subset head) and uses ``self.__dict__.get(FAST)`` when set."""


def use_onednn(*models):
    """Swap every ``nn.Linear`` of a swapped dtype (:func:`dtypes`) of the given models (None skipped) for a :class:`OneDnnLinear`, and give
    the heads computed by ``F.linear`` (a feature draft's head, a draft-vocabulary subset head) a oneDNN
    copy they use instead; returns ``undo()``, which puts everything back. Models that :func:`available`
    refuses are left as they are, and a model already swapped is not swapped twice."""
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    fast: list[torch.nn.Module] = []
    swap = dtypes()
    for model in models:
        if model is None or not available(model):
            continue
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if (type(child) is torch.nn.Linear and child.weight.dtype in swap and child.weight.device.type == "cpu"
                        and not hasattr(child, "_hf_hook")):  # (a layer accelerate moves in and out is left alone)
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
        swapped.clear()
        fast.clear()

    undo.count = len(swapped) + len(fast)  # type: ignore[attr-defined]
    return undo


def for_choice(choice: str, *models):
    """The models of a run whose ``--compile`` choice is ``choice``: swapped onto oneDNN for ``onednn``
    (:func:`use_onednn`), untouched otherwise; returns the undo."""
    if choice == "onednn":
        undo = use_onednn(*models)
        if not undo.count:
            raise OtmError("--compile onednn swaps the linear layers of float32 (or, where oneDNN computes it, "
                           "bfloat16) models on the CPU, and these have none: use --compile none or auto")
        return undo

    def undo() -> None:
        pass

    undo.count = 0  # type: ignore[attr-defined]
    return undo


__all__ = ["OneDnnLinear", "available", "for_choice", "use_onednn"]
