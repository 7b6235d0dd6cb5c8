r"""A draft that reads the target's own features (EAGLE, Li et al. ICML 2024).

A plain draft sees tokens only. This one also sees, at every position, the *feature* the target
computed there: the final normed hidden state that the target's head turns into its next-token
law (``softmax(f @ W_head.T)``). The target computes those features anyway when it checks the
drafts, so they cost the draft nothing, and they already hold everything the target knows about
the context: the draft only has to carry them one token forward.

Element j of the draft's input is the pair (token :math:`x_j`, feature :math:`f_{j-1}`), the
target's feature at the previous position (zeros for the first token)::

    z_j = fc([embed(x_j), f_{j-1}])          # the target's embedding, frozen; fc: 2H -> H
    h_j = norm(layers(z_{<=j}))              # Llama decoder layers with their KV cache
    q(x_{j+1} | x_{<=j}) = softmax(h_j @ W_head.T)   # the target's head, frozen

``h_j`` is the draft's guess of the target's feature :math:`f_j`. While drafting a chain the true
features of the tokens it just drafted do not exist yet (the target has not seen them), so
element j + 1 takes the draft's own ``h_j`` instead of :math:`f_j`; once the target has checked
the chain, the decoder feeds the accepted tokens again with their true features
(:mod:`otm.decode.decoder`). The drafts are drawn from exactly the laws ``q`` the verifier is
given, so the decoder's output law is the target's whatever the features are; good features
only raise acceptance.

Stored as a Hugging Face-style directory: ``config.json`` (a ``LlamaConfig`` for the layers, the
target's vocabulary size, and the key :data:`FEATURE_DRAFT_KEY`) and ``model.safetensors`` (fp16:
``fc.*`` and ``model.*``; the embedding and head are the target's and are not stored).
:func:`load_feature_draft` builds it next to a loaded target, sharing that target's embedding and
head Parameters. Trained by ``analysis/lab/train_draft.py --arch features`` (``docs/models.md``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..laws import OtmError

FEATURE_DRAFT_KEY = "otm_feature_draft"
"""config.json key (value 1) of a draft that reads the target's features (:class:`FeatureDraft`)."""


class DraftOutput(NamedTuple):
    """What :meth:`FeatureDraft.forward` returns (a named tuple: a whole-graph trace can build it)."""

    hidden: torch.Tensor  # [b, q, H]
    past_key_values: Any


class FeatureDraft(torch.nn.Module):
    """Feature-conditioned draft: ``fc`` + Llama layers, on the target's embedding and head.

    Parameters
    ----------
    config : transformers ``LlamaConfig`` of the draft's layers (hidden size = the target's;
        ``vocab_size`` = the target's, used for checks only).
    embedding, head : the target's input-embedding weight ``[V, H]`` and head weight ``[V, H]``
        (Parameters, shared, never trained or saved here).
    """

    @property
    def onednn_weight(self) -> str | None:
        """F.linear's weight in :meth:`logits` (otm.decode.onednn.use_onednn gives it a oneDNN copy); None with a
        subset head, which then computes the logits (and gets its own copy)."""
        return "head" if self.subset_head is None else None

    def __init__(self, config, embedding: torch.Tensor, head: torch.Tensor):
        super().__init__()
        from transformers import LlamaModel

        if tuple(embedding.shape) != (config.vocab_size, config.hidden_size) or head.shape != embedding.shape:
            raise OtmError(
                f"a feature draft of hidden size {config.hidden_size} and vocabulary {config.vocab_size} cannot use a "
                f"target embedding of {tuple(embedding.shape)} and head of {tuple(head.shape)}: pair it with the "
                "target it was trained from"
            )
        self.config = config
        H = config.hidden_size
        self.fc = torch.nn.Linear(2 * H, H, bias=True)
        inner = config.__class__(**{**config.to_dict(), "vocab_size": 1, "pad_token_id": None,
                                    "bos_token_id": None, "eos_token_id": None})
        self.model = LlamaModel(inner)  # its 1 x H token embedding is a placeholder: inputs_embeds always given
        self.model.embed_tokens.weight.requires_grad_(False)
        with torch.no_grad():  # zeros, not a random draw: the same draft is the same tensors in every process
            self.model.embed_tokens.weight.zero_()
        # plain attributes, not submodules: the target's tensors are neither saved nor trained here
        self.__dict__["embedding"] = embedding
        self.__dict__["head"] = head
        self.subset_head = None  # a SubsetHead when the draft proposes among S tokens only (otm.decode.draft_vocab)
        from .caches import cache_keyword

        # how the inner model takes its cache, asked once: not in forward, which torch.compile traces (dynamo
        # warns about tracing through the memoised lookup)
        self.__dict__["cache_kw"] = cache_keyword(self.model.forward)

    def forward(self, input_ids, features, position_ids=None, past_key_values=None, use_cache=False,
                attention_mask=None):
        """Hidden states ``[b, q, H]`` (guesses of the target's features) for ``input_ids [b, q]``.

        ``features [b, q, H]``: at element j the target's feature at the previous position (or
        the draft's own guess of it). ``attention_mask``: none (causal), or a prepared 4D boolean
        mask ``[b, 1, q, cache + q]`` (True = attends), as training-time test uses
        (``analysis/lab/train_draft.py``). Returns :class:`DraftOutput` ``(hidden, past_key_values)``.
        """
        emb = torch.nn.functional.embedding(input_ids, self.embedding)
        z = self.fc(torch.cat([emb, features.to(emb.dtype)], dim=-1))
        from .caches import returned_cache

        extra = {} if attention_mask is None else {"attention_mask": attention_mask}
        out = self.model(inputs_embeds=z, position_ids=position_ids, use_cache=use_cache,
                         **{self.cache_kw: past_key_values}, **extra)
        return DraftOutput(out.last_hidden_state, returned_cache(out))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[..., V]`` from hidden states (the target's head; restricted to the draft
        vocabulary, ``-inf`` elsewhere, when :func:`otm.decode.draft_vocab.restrict_draft` set one)."""
        if self.subset_head is not None:
            return self.subset_head(hidden)
        fast = self.__dict__.get("onednn_linear")  # the head on oneDNN (otm.decode.onednn.use_onednn)
        return fast(hidden) if fast is not None else torch.nn.functional.linear(hidden, self.head)


def shifted_features(features: torch.Tensor) -> torch.Tensor:
    """``[b, S, H]`` target features at positions 0..S-1 -> the draft's inputs (zeros, f_0 .. f_{S-2})."""
    return torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)


def target_features(target, input_ids: torch.Tensor):
    """``(logits [b, S, V], features [b, S, H])`` of a plain forward: features are what the head reads.

    Read by a forward hook on ``target.get_output_embeddings()``, so they are exactly the head's
    input for any causal LM with a linear head.
    """
    seen = []
    hook = target.get_output_embeddings().register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0]))
    try:
        logits = target(input_ids=input_ids).logits
    finally:
        hook.remove()
    return logits, seen[-1]


def draft_logits(draft, target, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits ``[b, S, V]`` at every position of ``input_ids`` for any draft: a plain causal
    LM reads the tokens; a :class:`FeatureDraft` also reads ``target``'s features of the same
    prefix (as at depth 1 of the decoder): ``features`` if given (from :func:`target_features`),
    else one target forward."""
    if isinstance(draft, FeatureDraft):
        feats = target_features(target, input_ids)[1] if features is None else features
        return draft.logits(draft(input_ids, shifted_features(feats)).hidden)
    return draft(input_ids=input_ids).logits


def draft_config(target_config, layers: int = 1, intermediate: int | None = None):
    """``LlamaConfig`` of a feature draft for ``target_config`` (a Llama-like config)."""
    from transformers import LlamaConfig

    tc = target_config
    rope = getattr(tc, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(tc, "rope_theta", 1e4)}
    return LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
        intermediate_size=intermediate or tc.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", tc.hidden_size // tc.num_attention_heads),
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
        rope_parameters=dict(rope), hidden_act=getattr(tc, "hidden_act", "silu"),
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id,
        tie_word_embeddings=False,
    )


def build_feature_draft(target, layers: int = 1, intermediate: int | None = None, seed: int = 0) -> FeatureDraft:
    """A fresh feature draft for ``target`` (random layers; the final norm starts as the target's)."""
    torch.manual_seed(seed)
    draft = FeatureDraft(draft_config(target.config, layers, intermediate),
                         target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    norm = getattr(getattr(target, "model", None), "norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == draft.model.norm.weight.shape:
        with torch.no_grad():
            draft.model.norm.weight.copy_(norm.weight)
    return draft.to(target.get_input_embeddings().weight.dtype)


def is_feature_draft(path) -> bool:
    """True if the directory ``path`` holds a :class:`FeatureDraft` (its config has :data:`FEATURE_DRAFT_KEY`)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get(FEATURE_DRAFT_KEY))


def save_feature_draft(draft: FeatureDraft, out) -> None:
    """Write ``config.json`` + fp16 ``model.safetensors`` (``fc.*``, ``model.*``; not the target's tensors)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = draft.config.to_dict()
    for noise in ("transformers_version", "_name_or_path", "id2label", "label2id", "problem_type",
                  "chunk_size_feed_forward", "torch_dtype"):
        cfg.pop(noise, None)
    cfg.update({FEATURE_DRAFT_KEY: 1, "dtype": "float16", "architectures": ["FeatureDraft"]})
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in draft.state_dict().items()
             if k != "model.embed_tokens.weight"}
    save_file(state, str(out / "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_feature_draft(path, target) -> FeatureDraft:
    """Load the feature draft in ``path`` next to ``target`` (its dtype and device; shared embedding and head).

    Raises :class:`~otm.laws.OtmError` (one line) if the config or weights do not load, a tensor
    is missing or extra, or the target's embedding/head do not have the draft's shape.
    """
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text())
        raw = {k: v for k, v in raw.items() if k not in (FEATURE_DRAFT_KEY, "architectures", "dtype")}
        config = LlamaConfig(**raw)
    except Exception as exc:
        raise OtmError(f"feature draft config in {str(path)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    embedding = target.get_input_embeddings().weight
    head_module = target.get_output_embeddings()
    if head_module is None or getattr(head_module, "bias", None) is not None:
        raise OtmError("a feature draft needs a target whose head is a plain linear map (no bias)")
    draft = FeatureDraft(config, embedding, head_module.weight)
    try:
        state = load_file(str(path / "model.safetensors"))
    except Exception as exc:
        raise OtmError(f"feature draft weights in {str(path)!r} do not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    expected = set(draft.state_dict()) - {"model.embed_tokens.weight"}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise OtmError(f"feature draft weights in {str(path)!r} do not match its config (missing {missing[:3]}, "
                       f"unexpected {extra[:3]}): retrain or re-save the draft")
    draft.load_state_dict(state, strict=False)
    return draft.to(device=embedding.device, dtype=embedding.dtype).eval()
