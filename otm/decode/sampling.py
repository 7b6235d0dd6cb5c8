r"""Next-token laws from logits: temperature, top-k and top-p, applied to both models alike.

Speculative sampling is exact for the *processed* laws only (Leviathan et al. 2023, §2.3:
temperature, top-k and top-p must be applied to both the target's and the draft's law before the
rule). The decoder therefore passes the target's and the draft's logits through
the same :func:`next_token_laws` before any draw or verification; drafts are sampled from the
very law the verifier is given (the bug class of transformers issues #32867 and #47932 is a
draft law that does not describe how the draft was sampled; docs/audit.md).

The processing *is* transformers' own: :func:`warpers` builds the ``LogitsProcessorList`` that
``generate(do_sample=True, temperature=t, top_k=k, top_p=p)`` builds (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, in that order, each only where it changes something,
``min_tokens_to_keep = 1``), so the target's law here is the law ``generate`` samples by
construction (bit for bit in float32, where ``generate`` works; tests/test_sampling.py):

1. temperature :math:`t`: logits / t; ``t = 0`` means greedy, a point mass on the first
   maximal logit (no warper);
2. top-k (``k > 0``): keep the tokens whose logit is >= the k-th largest (ties kept);
3. top-p (``p < 1``): drop the tokens whose cumulative mass from the bottom, in ascending order, is
   ``<= 1 - p`` (the token that crosses ``p`` is kept; at least one token). Tokens tied at that
   boundary are split in the order of ``torch.sort`` (not a stable sort), as in ``generate``;
4. softmax in ``dtype``, float64 (the decoder's default) or float32, whatever the model's dtype:
   the logits are cast first and the warpers run in that dtype. Removed tokens get ``-inf``, so
   mass 0.0 exactly, and the verifiers never accept them (their accept test ``u * den < num``
   fails when ``num = 0``).

>>> import torch
>>> laws = next_token_laws(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), Sampling(top_k=2))
>>> [round(x, 4) for x in laws[0].tolist()]
[0.7311, 0.2689, 0.0, 0.0]
>>> next_token_laws(torch.tensor([[0.0, 3.0, 3.0]]), Sampling(temperature=0)).tolist()
[[0.0, 1.0, 0.0]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..laws import OtmError

LAW_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class Sampling:
    """How logits become a next-token law (the same for target and draft).

    temperature : float >= 0 (0 = greedy);  top_k : int >= 0 (0 = off);  top_p : float in (0, 1] (1 = off).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise OtmError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise OtmError(f"top_k must be a whole number >= 0 (0 = off), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise OtmError(f"top_p must lie in (0, 1] (1 = off), got {p!r}")


@lru_cache(maxsize=64)
def warpers(sampling: Sampling):
    """transformers' ``LogitsProcessorList`` for ``sampling`` (``temperature > 0``), as ``generate`` builds it
    for ``do_sample=True`` with one beam: temperature if not 1, top-k if not 0, top-p if below 1. One list
    per setting, cached and shared: call it, do not change it."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out = LogitsProcessorList()
    if sampling.temperature != 1:
        out.append(TemperatureLogitsWarper(float(sampling.temperature)))
    if sampling.top_k != 0:
        out.append(TopKLogitsWarper(sampling.top_k, min_tokens_to_keep=1))
    if sampling.top_p < 1:
        out.append(TopPLogitsWarper(sampling.top_p, min_tokens_to_keep=1))
    return out


def next_token_laws(logits: torch.Tensor, sampling: Sampling, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Processed next-token laws ``[..., V]`` in ``dtype`` (float32 or float64) from logits ``[..., V]``:
    a point mass on the first maximum when ``temperature = 0``, else ``softmax(warpers(sampling)(logits))``."""
    if dtype not in LAW_DTYPES:
        raise OtmError(f"law dtype must be torch.float32 or torch.float64, got {dtype}")
    x = logits.to(dtype)  # [..., V]
    if sampling.temperature == 0:
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)  # first maximum
    processors = warpers(sampling)
    if processors:
        shape = x.shape
        x = processors(None, x.reshape(-1, shape[-1])).reshape(shape)  # the warpers take [batch, V]
    return torch.softmax(x, -1)  # [..., V]
