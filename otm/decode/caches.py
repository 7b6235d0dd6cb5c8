"""How a model's ``forward`` takes and returns its KV cache, across transformers versions: shared by the
decoder's runners (:mod:`otm.decode.decoder`) and the feature draft (:mod:`otm.decode.feature_draft`)."""

from __future__ import annotations

import functools
import inspect


def cache_keyword(forward) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` (transformers >= 5.24, which
    deprecates ``past_key_values`` with a warning on every call) or ``past_key_values`` (earlier).
    Memoised per function (a feature draft asks on every call; ``inspect.signature`` took 0.27 ms)."""
    return _cache_keyword(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=256)
def _cache_keyword(function) -> str:
    params = inspect.signature(function).parameters
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(out):
    """The cache a forward returned, under either name (``cache`` or ``past_key_values``)."""
    cache = out.get("cache") if hasattr(out, "get") else getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


__all__ = ["cache_keyword", "returned_cache"]
