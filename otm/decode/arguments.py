"""The arguments of a decoding run, checked: models, prompt, stop tokens, counts, the delayed tree's shared
path, the verifier (a name, a callable or a tree rule) resolved for the scheme, and the door of the random
choices. Each refusal is one line saying what is wrong and what to do (:class:`otm.laws.OtmError`)."""

from __future__ import annotations

import numbers
from typing import Callable

import torch

from .. import torch as ot
from ..laws import OtmError
from ..verifiers import decodable
from .chance import Chance, Sampled
from .runner import device_and_dtype, is_feature_draft_model, vocab_size
from .tree_registry import TREE_RULES, split_name, tree_rule_names
from .tree_rules import LevelByLevel, TreeRule

SCHEMES = ("iid", "without_replacement")
"""Draft schemes of the decoder."""

VERIFIERS = {scheme: decodable(scheme) + tree_rule_names(scheme) for scheme in ("iid", "without_replacement")}
"""Verifiers valid for each scheme: token-level rules (:func:`otm.verifiers.decodable`: the registry's
rules with that scheme in their ``decode``, run level by level with their twins in
:data:`otm.torch.VERIFIERS`) and whole-tree rules (:data:`otm.decode.tree_registry.TREE_RULES`);
``speculative`` and the chain-only tree rules (``block``) take one draft chain (k = 1)."""

def check_attention(model, role: str) -> None:
    """A model whose attention cannot take the decoder's 4D additive tree mask is refused in one line."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(impl, str) and "flash" in impl:
        raise OtmError(
            f"the {role} model uses {impl}, which cannot take the tree attention mask: load it with "
            "attn_implementation='sdpa' or 'eager'"
        )


def check_models(target, draft) -> None:
    check_attention(target, "target")
    if not is_feature_draft_model(draft):
        check_attention(draft, "draft")
    vt, vd = vocab_size(target), vocab_size(draft)
    if vt is not None and vd is not None and vt != vd:
        raise OtmError(
            f"target has a vocabulary of {vt} tokens and draft {vd}: speculative decoding needs two models "
            "sharing one tokenizer and vocabulary"
        )
    if device_and_dtype(target)[0] != device_and_dtype(draft)[0]:
        raise OtmError("target and draft are on different devices: put both models on one device")
    if is_feature_draft_model(draft):
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        if head is None or tuple(head.weight.shape) != tuple(draft.head.shape):
            raise OtmError("this feature draft reads another target's features (its head has another shape): "
                           "load it next to its target with otm.decode.models.load_draft")


def prompt_ids(input_ids, vocab: int | None) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.ndim == 2:
            if input_ids.shape[0] != 1:
                raise OtmError(f"the decoder runs one prompt at a time (batch size 1), got {input_ids.shape[0]} rows")
            input_ids = input_ids[0]
        if input_ids.ndim != 1 or input_ids.dtype.is_floating_point:
            raise OtmError(f"input_ids must be token ids of shape [n] or [1, n], got {tuple(input_ids.shape)}")
        ids = [int(t) for t in input_ids.tolist()]
    else:
        try:
            ids = [int(t) for t in input_ids]
        except (TypeError, ValueError):
            raise OtmError("input_ids must be a list of token ids or a tensor [1, n]") from None
    if not ids:
        raise OtmError("the prompt is empty: give at least one token")
    if vocab is not None and any(t < 0 or t >= vocab for t in ids):
        raise OtmError(f"prompt token ids must lie in 0..{vocab - 1}")
    return ids


def eos_set(eos_token_id) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(t) for t in eos_token_id)


def check_positive(value, name: str, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise OtmError(f"{name} must be a whole number >= 1 ({meaning}), got {value!r}")
    return int(value)


def check_delay(delay, length: int, verifier=None) -> int:
    """The shared path's length of a delayed tree (``speculative_decode``'s ``delay``), checked:
    ``0 <= delay < length``, and not with a rule whose registry record refuses it (``TreeRuleSpec.no_delay``)."""
    if isinstance(delay, bool) or not isinstance(delay, numbers.Integral) or not 0 <= delay < length:
        raise OtmError(f"delay must be a whole number with 0 <= delay < length = {length} (the shared draft path "
                       f"before the rows branch; 0: rows from the root), got {delay!r}")
    why = TREE_RULES[verifier].no_delay if isinstance(verifier, str) and verifier in TREE_RULES else ""
    if delay and why:
        raise OtmError(f"the {verifier} rule takes no delayed tree ({why}): use delay 0 or another rule")
    return int(delay)


def resolve_verifiers(verifier, scheme: str, k: int) -> tuple[Callable, Callable, str]:
    """``(at the root, below the root, name)`` for a verifier name (or a callable) and a scheme.

    A callable with the signature of :data:`otm.torch.VERIFIERS` is used at every node (tests
    plant broken rules this way). An instance of :class:`~otm.decode.tree_rules.TreeRule` (a user's
    whole-tree rule) gives ``(None, None, its name)``, as a built-in whole-tree rule does.
    """
    if scheme not in SCHEMES:
        raise OtmError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    if isinstance(verifier, type) and issubclass(verifier, TreeRule):
        raise OtmError(f"give an instance of the tree rule {verifier.__name__}, not the class: {verifier.__name__}()")
    if isinstance(verifier, TreeRule):
        return None, None, getattr(verifier, "name", type(verifier).__name__)  # a user's whole-tree rule
    if callable(verifier):
        return verifier, verifier, getattr(verifier, "__name__", "custom")
    base, option = split_name(verifier) if isinstance(verifier, str) else (verifier, {})
    if option:  # a tree rule with its option by name, "layer:kseq": made here, checked as a user's rule
        if base not in VERIFIERS[scheme]:
            raise OtmError(f"verifier {base!r} does not fit the {scheme} scheme in the decoder: choose one of "
                           f"{', '.join(VERIFIERS[scheme])}")
        return None, None, verifier
    if verifier not in VERIFIERS[scheme]:
        known = ", ".join(VERIFIERS[scheme])
        raise OtmError(f"verifier {verifier!r} does not fit the {scheme} scheme in the decoder: choose one of {known}")
    if (verifier == "speculative" or (verifier in TREE_RULES and TREE_RULES[verifier].chain_only)) and k != 1:
        raise OtmError(f"the {verifier} verifier takes one draft chain (k = 1), got k = {k}: use kseq, rrs or optimal")
    if verifier in TREE_RULES:
        return None, None, verifier  # a whole-tree rule (resolve_rule)
    root = ot.VERIFIERS[verifier]
    if scheme == "without_replacement":
        return root, ot.speculative, verifier  # single continuations below the root
    return root, root, verifier


def resolve_rule(verifier, scheme: str, k: int, *, target=None, draft=None, sampling=None) -> TreeRule:
    """The tree rule of a run: a whole-tree rule by name (``"block"``), else SpecTr's level-by-level
    walk with the token-level verifiers of :func:`resolve_verifiers`. A registered rule that needs the
    run's models (``tree_lp``) is made with ``target``, ``draft`` and ``sampling``."""
    root, deep, name = resolve_verifiers(verifier, scheme, k)
    if isinstance(verifier, TreeRule):
        return verifier
    if root is None:
        base, option = split_name(name)
        if option:
            return TREE_RULES[base].make(**option)
        spec = TREE_RULES[name]
        if spec.needs_models:
            return spec.make(target_lm=target, draft_lm=draft, sampling=sampling)
        return spec.make()
    return LevelByLevel(root, deep, name)



def chance_door(chance, generator, seed, device, validate: bool) -> Chance:
    """The door of the run's random choices: the one given, else draws from a generator or a seed."""
    if chance is None:
        return Sampled(generator_for(generator, seed, device), validate)
    if not isinstance(chance, Chance):
        raise OtmError(f"chance must be an otm.decode.chance.Chance, got {type(chance).__name__}")
    if generator is not None or seed is not None:
        raise OtmError("give a chance door or a generator / seed, not both")
    return chance


def generator_for(generator, seed, device) -> torch.Generator:
    if generator is not None:
        if seed is not None:
            raise OtmError("give a generator or a seed, not both")
        return generator
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen
