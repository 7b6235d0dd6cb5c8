"""Multi-draft speculative decoding with Hugging Face causal LMs (torch; uses :mod:`otm.torch`).

Usage (``target``, ``draft``: transformers causal LMs sharing a vocabulary)::

    from otm.decode import Sampling, speculative_decode
    gen = speculative_decode(target, draft, prompt_ids, k=4, length=4, verifier="kseq",
                             sampling=Sampling(temperature=1.0), max_new_tokens=64, seed=0)
    gen.tokens, gen.stats.block_efficiency

Modules: :mod:`~otm.decode.sampling` (processed laws), :mod:`~otm.decode.tree` (prefix tree,
4D mask), :mod:`~otm.decode.decoder` (drafting, target pass, walk, rollback, baselines),
:mod:`~otm.decode.chance` (the one door every random choice goes through),
:mod:`~otm.decode.exact_mode` (exact law of the decoder by enumeration), :mod:`~otm.decode.toy`
(tiny exact language models), :mod:`~otm.decode.models` (loading any Hugging Face pair, local
files only), :mod:`~otm.decode.embedded` (the embedded SmolLM2 pair), :mod:`~otm.decode.feature_draft`
(drafts that read the target's features), :mod:`~otm.decode.bench`, :mod:`~otm.decode.stream` and
:mod:`~otm.decode.cli` (``otm decode``, ``otm bench-decode``). See ``docs/decode.md``.

Names are imported lazily, so ``otm.cli`` can register the subcommands without importing torch.
"""

from importlib import import_module

_NAMES = {
    "SCHEMES": "decoder",
    "VERIFIERS": "decoder",
    "ROLLBACKS": "decoder",
    "DecodeStats": "decoder",
    "Generation": "decoder",
    "autoregressive_decode": "decoder",
    "resolve_verifiers": "decoder",
    "speculative_decode": "decoder",
    "Sampling": "sampling",
    "next_token_laws": "sampling",
    "DraftTree": "tree",
    "tree_inputs": "tree",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        return getattr(import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
