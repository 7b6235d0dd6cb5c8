r"""Next-token laws from logits: temperature, top-k and top-p, applied to both models alike.

Speculative sampling is exact for the *processed* laws only (Leviathan et al. 2023, §2.3:
temperature, top-k and top-p must be applied to both the target's and the draft's law before the
rule). The decoder therefore passes the target's and the draft's logits through
the same :func:`next_token_laws` before any draw or verification; drafts are sampled from the
very law the verifier is given (the bug class of transformers issues #32867 and #47932 is a
draft law that does not describe how the draft was sampled; docs/audit.md).

Order and conventions follow transformers' sampling processors (``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``), so ``generate(do_sample=True, temperature=t,
top_k=k, top_p=p)`` samples the same law as the target here:

1. temperature :math:`t`: logits / t; ``t = 0`` means greedy, a point mass on the first
   maximal logit;
2. top-k (``k > 0``): keep the tokens whose logit is >= the k-th largest (ties kept);
3. top-p (``p < 1``): sort the probabilities decreasingly and keep the shortest prefix whose
   mass reaches ``p`` (the token that crosses ``p`` is kept; at least one token);
4. softmax in float32 (or float64) whatever the model's dtype. Removed tokens get mass 0.0
   exactly, so the verifiers never accept them (their accept test ``u * den < num`` fails
   when ``num = 0``).

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


def next_token_laws(logits: torch.Tensor, sampling: Sampling, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Processed next-token laws ``[n, V]`` in ``dtype`` (float32 or float64) from logits ``[n, V]``."""
    if dtype not in LAW_DTYPES:
        raise OtmError(f"law dtype must be torch.float32 or torch.float64, got {dtype}")
    x = logits.to(dtype)  # [n, V]
    if sampling.temperature == 0:
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)  # first maximum
    if sampling.temperature != 1:
        x = x / sampling.temperature
    V = x.shape[-1]
    if 0 < sampling.top_k < V:
        kth = x.topk(sampling.top_k, -1).values[..., -1:]  # [n, 1]: k-th largest logit
        x = x.masked_fill(x < kth, -math.inf)
    law = torch.softmax(x, -1)  # [n, V]
    if sampling.top_p < 1:
        sorted_law, order = law.sort(dim=-1, descending=True, stable=True)  # [n, V]
        before = sorted_law.cumsum(-1) - sorted_law  # [n, V]: mass ranked strictly above each token
        keep_sorted = before < sampling.top_p  # the crossing token is kept; the first token always
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # [n, V]
        law = law * keep
        law = law / law.sum(-1, keepdim=True)
    return law
