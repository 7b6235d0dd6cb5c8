"""Hypothesis strategies for (target, draft) pairs, edge cases included: the certify bank's own.

Masses mix exact zeros, tiny values (1e-12 .. 1e-7) and ordinary ones; the pair kinds add
identical laws, disjoint supports and point masses (:mod:`otm.certify.bank`).
"""

import itertools

import numpy as np
from hypothesis import strategies as st

from otm.certify.bank import MASS, PAIR_KINDS as KINDS, law, pairs as pair


@st.composite
def law_tables(draw, *extras):
    """``(V, k, L, *extras, P, Q)``: a small step (V 2-3, k 1-3 rows, depth L 1-2), values drawn from the
    strategies ``extras`` (a scheme, a verifier, ...), and explicit target and draft law tables
    ``prefix -> [V]`` for every prefix up to depth L + 1, masses mixing exact zeros, 1e-12 and ordinary ones
    (the whole-tree rules' lossless properties run every draft tree of these tables)."""
    V = draw(st.integers(2, 3))
    k = draw(st.integers(1, 3))
    L = draw(st.integers(1, 2))
    more = [draw(s) for s in extras]
    mass = st.one_of(st.just(0.0), st.just(1e-12), st.floats(0.01, 1.0))

    def one_law():
        w = np.array(draw(st.lists(mass, min_size=V, max_size=V)))
        if w.sum() <= 0:
            w[draw(st.integers(0, V - 1))] = 1.0
        return w / w.sum()

    prefixes = [p for n in range(L + 2) for p in itertools.product(range(V), repeat=n)]
    return (V, k, L, *more, {p: one_law() for p in prefixes}, {p: one_law() for p in prefixes})


def float64_feature_pair(seed: int = 0, V: int = 3):
    """A one-layer float64 Llama target and a feature draft (EAGLE-style) whose random weights keep its laws
    well away from the target's: the feature-draft path of the exact-mode tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from otm.decode.feature_draft import build_feature_draft

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.6,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    target = LlamaForCausalLM(cfg).eval().to(torch.float64)
    draft = build_feature_draft(target, layers=1, seed=seed + 1).to(torch.float64)
    for layer in draft.modules():  # a draft that is not the target: random, well away from zero
        if isinstance(layer, torch.nn.Linear) and layer.weight is not target.lm_head.weight:
            torch.nn.init.normal_(layer.weight, std=0.5)
    return target, draft


__all__ = ["MASS", "KINDS", "float64_feature_pair", "law", "law_tables", "pair"]
