"""The decoder's runners: a causal LM with its KV cache (transformers' growing ``Cache``), batch 1 or k rows.

:class:`Runner` feeds token chains and tree passes and rolls its cache back (``keep_path``: gather the
accepted path; ``truncate``: crop); :class:`FeatureRunner` does the same for a feature draft
(:mod:`otm.decode.feature_draft`). The static-shape runner of the compiled step is
:class:`otm.decode.static.StaticRunner`.
"""

from __future__ import annotations

import inspect
import itertools

import torch

from ..laws import OtmError
from .caches import cache_keyword, returned_cache


def device_and_dtype(model) -> tuple[torch.device, torch.dtype]:
    for t in itertools.chain(model.parameters(), model.buffers()):  # the first floating one (not a list of all)
        if t.is_floating_point() and t.device.type != "meta":  # meta: a layer a device map offloaded to disk
            return t.device, t.dtype
    raise OtmError(f"{type(model).__name__} has no floating parameters: give a causal language model")


def vocab_size(model) -> int | None:
    """``config.vocab_size``, else the rows of the input embedding, else None (unknown until its first logits)."""
    config = getattr(model, "config", None)
    v = getattr(config, "vocab_size", None)
    if v is None and hasattr(model, "get_input_embeddings"):
        try:
            v = getattr(model.get_input_embeddings(), "num_embeddings", None)
        except (NotImplementedError, AttributeError):
            v = None
    return int(v) if v is not None else None


class Runner:
    """A causal LM with its KV cache (a transformers ``Cache``; batch 1, or k rows while drafting)."""

    def __init__(self, model, role: str):
        self.model, self.role = model, role
        self.device, self.dtype = device_and_dtype(model)
        self.cache = None
        self.calls = 0
        # transformers' causal LMs can skip the vocabulary projection of positions whose logits are not needed
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache_kw = cache_keyword(model.forward)

    def length(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None, keep: int = 0):
        """Logits ``[b, q', V]`` of ``ids [b, q]`` at ``positions [b, q]``; the cache grows by q.

        ``keep > 0``: only the last ``keep`` positions' logits are needed (``q' = keep`` when the
        model supports ``logits_to_keep``, else q); read them as ``logits[:, -keep:]``.
        """
        extra = {"logits_to_keep": keep} if keep and self.keeps_logits else {}
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, **{self.cache_kw: self.cache},
            **extra,
        )
        self.cache = returned_cache(out)
        self.calls += 1
        return out.logits

    def chain(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [1, n], positions [1, n])`` of a chain of tokens placed after the cache."""
        ids = torch.tensor([tokens], dtype=torch.int64, device=self.device)
        return ids, self.length() + torch.arange(len(tokens), device=self.device)[None]

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Feed a chain of tokens (batch 1) after the cache; logits of the last one ``[1, V]``."""
        return self.forward(*self.chain(tokens), keep=1)[:, -1]

    def keep_path(self, length: int, path: list[int]) -> None:
        """Keep the first ``length`` positions followed by the positions ``path`` (increasing, all >= length).

        The keys and values at ``path`` are copied down to ``length .. length + len(path) - 1``
        (each source lies at or after its destination, and the gathered copy is made before the
        write), then the rest is cropped. Needs a transformers ``DynamicCache`` whose layers are
        full-attention ``DynamicLayer`` s (keys/values ``[b, heads, S, head_dim]``).
        """
        from transformers.cache_utils import DynamicLayer

        layers = getattr(self.cache, "layers", None)
        if layers is None or not all(isinstance(x, DynamicLayer) and not x.is_sliding for x in layers):
            raise OtmError(
                f"the {self.role} cache ({type(self.cache).__name__}) cannot keep arbitrary positions: "
                "use target_rollback='refeed'"
            )
        if path and path != list(range(length, length + len(path))):  # in place already (a chain's prefix): no copy
            src = torch.tensor(path, dtype=torch.int64, device=self.device)  # [m]
            dst = slice(length, length + len(path))
            for layer in layers:
                if layer.is_initialized and layer.keys.numel():
                    layer.keys[..., dst, :] = layer.keys.index_select(-2, src)  # [b, heads, m, head_dim]
                    layer.values[..., dst, :] = layer.values.index_select(-2, src)
        self.truncate(length + len(path))

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions (transformers 5: ``crop`` takes minus the count to drop)."""
        drop = self.length() - length
        if drop < 0:
            raise RuntimeError(f"{self.role} cache has {self.length()} positions, cannot keep {length}")
        if drop:
            self.cache.crop(-drop)


class FeatureRunner(Runner):
    """A feature draft (:class:`otm.decode.feature_draft.FeatureDraft`) with its KV cache.

    Each element it reads is a token with the target's feature at the position before it (or,
    inside a drafted chain, the draft's own guess of that feature); it returns hidden states,
    turned into logits by the target's head (:meth:`logits`).
    """

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[b, q, H]`` of ``ids [b, q]`` with ``features [b, q, H]``; the cache grows by q."""
        out = self.model(ids, features, position_ids=positions, past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values  # FeatureDraft's own forward (otm.decode.feature_draft) names both ways
        self.calls += 1
        return out.hidden

    def feed(self, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        """Feed a chain (batch 1) with its features ``[n, H]``; hidden state of the last one ``[1, H]``."""
        return self.forward(*self.chain(tokens), features[None].to(self.dtype))[:, -1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)


def is_feature_draft_model(model) -> bool:
    from .feature_draft import FeatureDraft

    return isinstance(model, FeatureDraft)



__all__ = ["FeatureRunner", "Runner", "device_and_dtype", "is_feature_draft_model", "vocab_size"]
