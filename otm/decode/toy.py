r"""Toy causal language models for exact tests of the decoder (tiny V, table lookups, no training).

:class:`ToyLM` has the interface the decoder uses (``input_ids``, ``position_ids``, a 4D
``attention_mask``, a transformers ``DynamicCache``), and its logits are read from a random
table, so every law the decoder computes in a tree pass is bit-identical to the law of a plain,
cache-free forward of the same prefix (:func:`model_law`): the exact mode of
:mod:`otm.decode.exact_mode` can then compare the decoder's output law with the target's to 1e-12.

The logits of a query are ``table[token, previous, position % 2]``, with ``previous`` the token
the query attends to at the largest position before its own (``V`` for none). The model depends
on the prefix through the attention mask and the positions exactly as a transformer does: a mask
that lets a node see a cousin, a wrong position, or a stale cache entry changes its law.

>>> import torch
>>> from otm.decode import Sampling
>>> model = ToyLM(3, seed=0)
>>> law = model_law(model, [0, 2], Sampling(top_k=2))
>>> p = law((1,))
>>> p.dtype, int((p == 0).sum()), round(float(p.sum()), 12)
(dtype('float64'), 1, 1.0)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from ..laws import OtmError
from .sampling import Sampling, next_token_laws


class ToyLM(torch.nn.Module):
    """A toy causal LM: logits ``table[token, previous, position % 2]`` (module docstring).

    Parameters
    ----------
    V : vocabulary size (>= 2).
    seed : seed of the random table ``[V, V + 1, 2, V]`` (standard normal times ``scale``).
    scale : spread of the logits (larger: laws further from uniform).

    The cache stores (token, position) pairs in a ``DynamicCache`` (``crop``,
    ``batch_repeat_interleave`` and ``batch_select_indices`` work as for a real model).
    """

    def __init__(self, V: int, seed: int, scale: float = 1.5):
        super().__init__()
        if isinstance(V, bool) or not isinstance(V, int) or V < 2:
            raise OtmError(f"a toy model needs a vocabulary of at least 2 tokens, got V = {V!r}")
        g = torch.Generator().manual_seed(int(seed))
        self.table = torch.nn.Parameter(torch.randn(V, V + 1, 2, V, generator=g) * scale, requires_grad=False)
        self.config = SimpleNamespace(vocab_size=V)
        self.V = V

    def forward(self, input_ids, position_ids=None, attention_mask=None, past_key_values=None, use_cache=True):
        from transformers import DynamicCache

        b, q = input_ids.shape
        cache = DynamicCache() if past_key_values is None else past_key_values
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = (past + torch.arange(q))[None].expand(b, q)  # [b, q]
        new = torch.stack([input_ids, position_ids], -1).to(torch.float32)[:, None]  # [b, 1, q, 2]
        keys, _ = cache.update(new, new, 0)  # [b, 1, S, 2]
        tok, pos = keys[:, 0, :, 0].long(), keys[:, 0, :, 1].long()  # [b, S]
        S = tok.shape[1]
        if attention_mask is None:
            allowed = torch.arange(S)[None, None, :] <= (past + torch.arange(q))[None, :, None]  # [1, q, S]
        else:
            allowed = attention_mask[:, 0] == 0  # [b or 1, q, S]
        before = allowed & (pos[:, None, :] < position_ids[:, :, None])  # [b, q, S]
        score = torch.where(before, pos[:, None, :], torch.full_like(before, -1, dtype=torch.long))  # [b, q, S]
        best = score.argmax(-1)  # [b, q]
        prev = torch.where(score.amax(-1) >= 0, tok.gather(1, best), torch.full_like(best, self.V))  # [b, q]
        logits = self.table[input_ids, prev, position_ids % 2]  # [b, q, V]
        return SimpleNamespace(logits=logits, past_key_values=cache)


def model_law(model, prompt, sampling: Sampling | None = None) -> Callable[[tuple], np.ndarray]:
    """``prefix -> [V]`` float64: the model's processed next-token law after ``prompt + prefix``.

    One plain forward of the whole sequence without a cache (``model(input_ids=[1, n])``),
    processed by ``sampling`` (temperature, top-k, top-p: :func:`~otm.decode.sampling.next_token_laws`)
    in float64; memoised per prefix. Works for any causal LM with ``.logits`` (ToyLM, a Hugging
    Face model). This is the reference law of :func:`otm.decode.exact_mode.target_law`.
    """
    sampling = Sampling() if sampling is None else sampling
    prompt = [int(t) for t in prompt]
    memo: dict[tuple, np.ndarray] = {}

    def law(prefix: tuple) -> np.ndarray:
        prefix = tuple(int(t) for t in prefix)
        if prefix not in memo:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt + list(prefix)])).logits[:, -1]  # [1, V]
            memo[prefix] = next_token_laws(logits, sampling, dtype=torch.float64)[0].cpu().numpy()  # [V]
        return memo[prefix]

    return law


__all__ = ["ToyLM", "model_law"]
