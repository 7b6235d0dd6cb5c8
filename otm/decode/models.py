"""Load a ``target`` and a ``draft`` causal LM for the decoder, from local directories only.

:func:`load_pair` loads any pair of Hugging Face causal LMs (``None`` picks the embedded default
for either side, :mod:`otm.decode.embedded`) and refuses, with a one-line
:class:`~otm.laws.OtmError`, a path that is not a model or two models whose vocabularies differ:
speculative decoding compares the two next-token laws token by token, so both must index the same
vocabulary. :func:`load_draft` loads the two draft formats otm runs: a plain causal LM, and a draft
that reads the target's features (:mod:`otm.decode.feature_draft`). Every ``from_pretrained``
passes ``local_files_only=True``: otm never reaches the Hugging Face Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..laws import OtmError
from .embedded import is_complete_model_dir, default_draft_path, default_target_path

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Weight dtypes the CLI accepts; ``auto`` = :func:`auto_dtype`."""

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 /proc/cpuinfo flags of native bfloat16 arithmetic (AVX512-BF16 dot products, AMX tiles)."""


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The CPU's native-bfloat16 flags: ``avx512_bf16`` / ``amx_bf16`` (x86) or ``bf16`` (Arm), read from
    ``/proc/cpuinfo`` (``cpuinfo`` overrides the file, for tests). Empty where the file is missing (not
    Linux): otm then does not assume bfloat16 is fast.

    Why flags and not ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: oneDNN also says yes on plain
    AVX512 cores, where it emulates bfloat16 by converting to float32, which is no faster.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return [f for f in (*_BF16_FLAGS, "bf16") if f in flags]


def _device_type(device) -> str:
    import torch

    try:
        return torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        raise OtmError(f"unknown torch device {device!r}: use cpu, cuda or cuda:N") from None


def auto_dtype(device="cpu"):
    """bfloat16 where the device computes it natively (CPU: :func:`cpu_bf16_flags`; CUDA:
    ``torch.cuda.is_bf16_supported()``), else float32."""
    import torch

    kind = _device_type(device)
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    if kind == "cpu":
        return torch.bfloat16 if cpu_bf16_flags() else torch.float32
    return torch.float32


def resolve_dtype(name, device="cpu"):
    """A torch dtype from a name of :data:`DTYPES` (or a torch dtype, returned as is).

    ``auto``: :func:`auto_dtype`. ``bfloat16`` asked on a CPU without native bfloat16 is refused in one
    line (it would run, emulated, slower than float32, and every speed figure would mislead).
    """
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise OtmError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    if name == "auto":
        return auto_dtype(device)
    if name == "bfloat16" and _device_type(device) == "cpu" and not cpu_bf16_flags():
        raise OtmError("this CPU has no native bfloat16 (no avx512_bf16, amx_bf16 or bf16 flag in /proc/cpuinfo): "
                       "use --dtype float32, or --dtype auto")
    return getattr(torch, name)


def model_dir(path, role: str) -> Path:
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
    if not is_complete_model_dir(p):
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


def parse_max_memory(text: str | None) -> dict | None:
    """``"0=20GiB,cpu=60GiB"`` -> ``{0: "20GiB", "cpu": "60GiB"}`` (accelerate's ``max_memory``), or a one-line
    OtmError saying what is wrong."""
    if not text:
        return None
    out: dict = {}
    for part in text.split(","):
        key, sep, size = part.partition("=")
        key, size = key.strip(), size.strip()
        if not sep or not key or not size:
            raise OtmError(f"--max-memory {text!r}: give DEVICE=SIZE pairs, e.g. 0=20GiB,cpu=60GiB")
        out[int(key) if key.isdigit() else key] = size
    return out


def load_pair(target=None, draft=None, *, dtype=None, device="cpu", draft_vocab=None, token_ranking=None,
              device_map=None, max_memory=None, offload_folder=None):
    """Load a ``target`` and a ``draft`` causal LM that share one vocabulary.

    Parameters
    ----------
    target, draft : str or path-like or None
        Hugging Face model directories; ``None`` picks the embedded default
        (:func:`default_target_path`, converted once; :func:`default_draft_path`).
    dtype : torch.dtype or a name of :data:`DTYPES`, default ``torch.float32``
        Weights dtype for both models; ``"auto"``: bfloat16 where the device computes it natively
        (:func:`auto_dtype`), else float32.
    device : str or torch.device, default ``"cpu"``
    device_map, max_memory, offload_folder : optional, for a target larger than one device:
        transformers' ``from_pretrained`` (accelerate) places its layers by ``device_map`` (``"auto"``)
        within ``max_memory`` (``{0: "20GiB", "cpu": "60GiB"}``), the rest in ``offload_folder`` on disk;
        ``device`` is then ignored for the target, and the draft goes where the target's embedding is.
    draft_vocab : int or None
        S: the draft proposes only among the S most frequent tokens of ``token_ranking``
        (:mod:`otm.decode.draft_vocab`, FR-Spec); None or V: the whole vocabulary.
    token_ranking : path of an int ``[V]`` .npy of ranked token ids (default: the embedded target's).

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

    dtype = torch.float32 if dtype is None else resolve_dtype(dtype, device)
    target_dir = default_target_path() if target is None else model_dir(target, "target")
    draft_dir = default_draft_path() if draft is None else model_dir(draft, "draft")

    target_vocab = _config_vocab_size(target_dir, "target")
    draft_vocab_size = _config_vocab_size(draft_dir, "draft")
    if target_vocab != draft_vocab_size:
        raise OtmError(
            f"target vocabulary has {target_vocab} tokens but draft has {draft_vocab_size} "
            f"({target_dir} vs {draft_dir}): pick a draft trained on the target's tokenizer"
        )
    if draft_vocab is not None:  # refuse a bad S before loading anything
        from .draft_vocab import check_draft_vocab

        check_draft_vocab(draft_vocab, target_vocab)
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
        if device_map is None:
            target_model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, local_files_only=True).to(device)
        else:
            target_model = AutoModelForCausalLM.from_pretrained(
                target_dir, dtype=dtype, local_files_only=True, device_map=device_map, max_memory=max_memory,
                offload_folder=None if offload_folder is None else str(offload_folder))
        target_model.eval()
    except Exception as exc:
        raise OtmError(f"target model in {str(target_dir)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return target_model, load_draft(draft_dir, target_model, draft_vocab=draft_vocab, token_ranking=token_ranking), tokenizer


def load_draft(path, target_model, *, draft_vocab=None, token_ranking=None):
    """Load the draft in ``path`` to run next to ``target_model``, in its dtype and on its device.

    Two formats: a plain Hugging Face causal LM, loaded with ``from_pretrained`` (its vocabulary
    must be the target's); and a directory whose config has ``otm_feature_draft``, a draft that
    reads the target's features (:class:`otm.decode.feature_draft.FeatureDraft`), built on the
    target's embedding and head by :func:`otm.decode.feature_draft.load_feature_draft`. Raises
    :class:`~otm.laws.OtmError` (one line) if the path is not a local model directory, the model
    does not load, or the vocabularies differ. :func:`load_pair` loads its draft with this function.
    ``draft_vocab`` / ``token_ranking``: as in :func:`load_pair` (:func:`otm.decode.draft_vocab.restrict_draft`).
    """
    from transformers import AutoModelForCausalLM

    from .feature_draft import is_feature_draft, load_feature_draft

    path = model_dir(path, "draft")  # a local directory: otm never reaches the Hugging Face Hub
    embedding = target_model.get_input_embeddings().weight
    if is_feature_draft(path):  # reads the target's features (EAGLE): otm.decode.feature_draft
        head = target_model.get_output_embeddings().weight
        if embedding.device.type == "meta" or head.device.type == "meta":
            raise OtmError("this feature draft shares the target's embedding and head, which the device map offloaded "
                           "to disk: give those two layers room on a device (--max-memory), or a plain draft")
        return _restricted(load_feature_draft(path, target_model), draft_vocab, token_ranking)
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
    return _restricted(model.to(embedding.device).eval(), draft_vocab, token_ranking)


def _restricted(draft, draft_vocab, token_ranking):
    if draft_vocab is None:
        return draft
    from .draft_vocab import restrict_draft

    return restrict_draft(draft, draft_vocab, token_ranking)
