"""Multi-draft speculative decoding with Hugging Face causal LMs (torch; uses :mod:`otm.torch`).

>>> from otm.decode import speculative_decode, autoregressive_decode, Sampling   # doctest: +SKIP
>>> gen = speculative_decode(target, draft, prompt_ids, k=4, length=4, verifier="kseq",
...                          sampling=Sampling(temperature=1.0), max_new_tokens=64, seed=0)  # doctest: +SKIP
>>> gen.tokens, gen.stats.block_efficiency   # doctest: +SKIP

See ``docs/decode.md`` and :mod:`otm.decode.decoder` for the algorithm and its exactness.
"""

from .decoder import (
    SCHEMES,
    VERIFIERS,
    DecodeStats,
    Generation,
    autoregressive_decode,
    resolve_verifiers,
    speculative_decode,
)
from .sampling import Sampling, next_token_laws
from .tree import DraftTree, tree_inputs

__all__ = [
    "SCHEMES",
    "VERIFIERS",
    "DecodeStats",
    "Generation",
    "Sampling",
    "DraftTree",
    "autoregressive_decode",
    "next_token_laws",
    "resolve_verifiers",
    "speculative_decode",
    "tree_inputs",
]
