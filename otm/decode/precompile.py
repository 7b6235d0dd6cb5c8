r"""The static step compiled ahead of time: one graph per shape, saved in the user cache and loaded by later runs.

``--compile int4-compiled`` (the embedded target on its GGUF's 4-bit blocks, every other linear layer an opaque
oneDNN call) runs its static step through here. ``torch.compile`` keeps what it builds on disk (inductor's kernels)
but traces the model again in every process: 10-17 s a shape for the embedded target on 2 cores, so every decode
paid half a minute before its first token, and dynamo checked its guards before every call (0.8-1.4 ms of a 12 ms
call). torch's ahead-of-time compile (``torch.compile(...).aot_compile``, saved by ``save_compiled_function``,
loaded by ``torch.compiler.load_compiled_function``) keeps the traced graph, its compiled code and its bytecode in
one file: a later process loads a shape in about 2 s and calls it without dynamo.

Four things make the graph one that can be kept and called fast:

* **No freezing.** inductor's freezing folds the weights into the graph as constants, which the saved artefact
  cannot hold (torch 2.13: ``expected OutputCode``). A swapped model does not need it: its linear layers are
  already 4-bit GEMMs on packed weights and oneDNN calls on prepacked ones, the graph's inputs.
* **Siblings' GEMMs merged by a pass of ours** (:class:`SameCalls`): traced, each of q/k/v (and gate/up) asks for
  its group's GEMM (:class:`otm.decode.int4.Int4Linear`); the frozen graph merged the three identical calls, the
  unfrozen one does not (210 4-bit GEMMs a call instead of 120, 6.1 against 3.8 ms). :class:`SameCalls` merges
  identical calls of pure operators after AOTAutograd.
* **One graph for every window.** The mask's last dimension, the slots the attention reads
  (:func:`otm.decode.static.window`), is a dynamic size of the graph (``mark_dynamic``, 2 to the capacity), every
  other size static (``dynamic=False``: with dynamo's default, a second shape of the same function had its positions
  made dynamic too, 40-54 s to compile and slower calls): a call after 66 tokens reads 128 slots of a 2560-slot
  cache, not all of them. Compiling takes a little longer, 26-28 s a target shape instead of 20-24 on 2 cores.
* **No guards.** A loaded graph's guards would be checked at every call. The runner gives each shape's graph the
  tensors it was built for (shapes, dtypes and standard strides: :mod:`otm.decode.static` builds them), so the
  graph runs with its guard check off, and :class:`Precompiled` checks the input's shape itself; inductor's own
  size and stride asserts on every input stay on (switched off, a call was no faster within the noise, 10.9 against
  10.8-11.0 ms).

What is saved is keyed by everything the graph depends on: otm's decoder sources (a folder per version of them,
:func:`folder`; another version's folder is removed once unused for a day, :func:`prune`), and in the file's name
(:func:`key`) torch's and transformers' versions, inductor's settings (:func:`options`), the machine line (CPU,
flags, threads: inductor's code is generated for them), the model's class, configuration, dtype and parameter
shapes, the digests that name its prepacked oneDNN weights in the graph, and the runner's role, cache capacity, rows
and forward size. The weights themselves are inputs, not part of the graph. A file that fails to load (another
torch, a damaged file) is said in one line and compiled again.

Measured on the embedded target (the 2-core AMD EPYC, avx512_bf16, torch 2.13.0+cpu, one thread; decoder calls on
one position after 66 tokens, interleaved, ``analysis/int4_compiled_ab.py``): 10.6 ms a call, against 11.9 ms for
the frozen graph under dynamo and 12.4 ms eager on the same 4-bit blocks; the first compile of a shape 20-24 s (26-28 s with the window),
loading it in a later process 0.5-2.8 s (``docs/decode.md``, "Compiled ahead of time").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
import weakref
from pathlib import Path

import torch

from ..laws import OtmError

FOLDER = "precompiled"
"""Where the saved graphs go, under :func:`otm.decode.embedded.cache_dir`."""


def _pass_base():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


_SAME_CALLS = None


def same_calls():
    """The :class:`SameCalls` pass (built on first use: its base class comes with inductor)."""
    global _SAME_CALLS
    if _SAME_CALLS is None:

        class SameCalls(_pass_base()):
            """Merge identical calls of pure operators (same operator, same arguments) into the first one:
            common-subexpression elimination over the graph inductor lowers (its post-grad graph, functional but
            for the cache writes, which are mutating and left alone)."""

            def __call__(self, graph: torch.fx.Graph) -> None:
                merge_same_calls(graph)

            def uuid(self):
                return source_digest([Path(__file__)])

        _SAME_CALLS = SameCalls()
    return _SAME_CALLS


def merge_same_calls(graph: torch.fx.Graph) -> int:
    """Replace every call of a pure operator that repeats an earlier one (same operator, same argument nodes and
    values) by that earlier one; returns how many were removed. Mutating operators (their schema says so) and
    random ones are never merged."""
    seen: dict = {}
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None or schema.is_mutable or getattr(node.target, "overloadpacket", None) in _RANDOM:
            continue
        key = (node.target, _frozen(node.args), _frozen(tuple(sorted(node.kwargs.items()))))  # lists by their items
        try:
            hash(key)
        except TypeError:  # an argument that cannot be compared
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            removed += 1
        else:
            seen[key] = node
    return removed


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


_RANDOM = {getattr(torch.ops.aten, name) for name in ("rand", "rand_like", "randn", "randn_like", "randint",
                                                      "randint_like", "bernoulli", "multinomial", "normal",
                                                      "uniform", "exponential", "randperm", "native_dropout")
           if hasattr(torch.ops.aten, name)}


def positions_text(n: int) -> str:
    """``1 position``, ``n positions``."""
    return f"{n} position{'s' if n > 1 else ''}"


def source_digest(paths) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(Path(p) for p in paths):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def key(runner, size: int) -> str:
    """The file name of ``runner``'s graph for forwards of ``size`` positions (module docstring: what it covers)."""
    import transformers

    from ..machine import machine

    model = runner.model
    config = getattr(model, "config", None)
    config_text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
    handles = sorted({int(h) for m in model.modules() for h in [getattr(m, "handle", None)] if h is not None})
    parts = {
        "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": machine().line("precompiled"),
        "model": type(model).__qualname__, "config": config_text, "dtype": str(runner.dtype),
        "parameters": [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()],
        "handles": handles,
        "options": sorted((k, repr(v)) for k, v in options().items() if not callable(v)),  # inductor's settings
        "runner": [type(runner).__qualname__, runner.role, runner.capacity, runner.batch, int(size),
                   bool(getattr(runner, "with_features", False))],
    }
    digest = hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()
    return f"{runner.role}-{size}-{digest}.bin"


def inductor_options() -> dict:
    """Inductor's settings of otm's compiled graphs: its defaults and the siblings' GEMMs merged (:class:`SameCalls`).
    Transformers' compiled ``generate`` row in the bench is given them too, so it computes what otm's step computes
    (``otm.decode.bench.hf_step_options``)."""
    from torch._inductor import list_mode_options

    return {**list_mode_options("default"), "post_grad_custom_pre_pass": same_calls()}


def options() -> dict:
    """``torch.compile``'s options for a graph that can be saved: inductor's defaults, no freezing, siblings'
    GEMMs merged (:class:`SameCalls`), and only the guards that can be written down kept (they are not checked)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)

    def savable(entries):
        return [not (g.is_global or g.guard_type in unsaved or unsaved & set(g.derived_guard_types or ()))
                for g in entries]

    return {**inductor_options(), "guard_filter_fn": savable}


class Precompiled:
    """One shape's graph for one runner, loaded from the user cache or compiled and saved there."""

    def __init__(self, fn, runner, size: int, args: tuple, kwargs: dict, say):
        where = folder()
        path = where / key(runner, size)
        self.runner, self.size, self.loaded = runner, int(size), False
        self.shape = tuple(args[0].shape)
        start = time.perf_counter()
        compiled = None
        if path.exists():
            try:
                with open(path, "rb") as f:
                    compiled = torch.compiler.load_compiled_function(f, external_data={"runner": runner})
                self.loaded = True
            except Exception as e:  # another torch wrote it, or it is damaged: compiled again below, and said
                say(f"the saved {runner.role}'s step for {positions_text(size)} did not load "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else 'no message'}): compiling it "
                    "again")
            if self.loaded:
                with contextlib.suppress(OSError):
                    os.utime(where)  # in use: not pruned as stale
        if compiled is None:
            say(f"compiling the {runner.role}'s step for {positions_text(size)} ahead of time "
                f"(once per shape, saved in the user cache folder) ...")
            torch._dynamo.mark_dynamic(args[2], 3, min=2, max=runner.capacity)  # the mask's width: the attention's window
            compiled = torch.compile(fn, fullgraph=True, dynamic=False, options=options()).aot_compile((args, kwargs))
            try:
                where.mkdir(parents=True, exist_ok=True)
                compiled.save_compiled_function(str(path), external_data={"runner": runner})
                os.utime(where)
                prune()
            except OSError as e:
                say(f"could not save the compiled {runner.role}'s step in {where} ({e}): the next run compiles again")
        compiled.disable_guard_check()  # the runner fixes what the guards would check (module docstring)
        self.compiled = compiled
        self.seconds = time.perf_counter() - start
        say(f"{'loaded' if self.loaded else 'compiled'} the {runner.role}'s step for {positions_text(size)} in "
            f"{self.seconds:.1f} s"
            + (f" ({path.name} from the user cache)" if self.loaded else ""))

    def __call__(self, *args, **kwargs):
        if tuple(args[0].shape) != self.shape:
            raise OtmError(f"the {self.runner.role}'s precompiled step for {self.size} positions was given inputs of "
                           f"shape {tuple(args[0].shape)}, not {self.shape}")
        return self.compiled(self.runner, *args, **kwargs)


_GRAPHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def graphs_of(runner) -> dict:
    """``{size: Precompiled}`` of ``runner`` (held here, not by the runner: the state saved with a graph includes
    the runner's attributes, and a loaded graph cannot be written down)."""
    return _GRAPHS.setdefault(runner, {})


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of otm's decoder sources (``otm/decode/*.py``): the graphs of another version of them are others."""
    return source_digest(Path(__file__).parent.glob("*.py"))


def folder() -> Path:
    """Where this version of otm's decoder keeps its graphs: ``precompiled/<code digest>`` in the user cache folder."""
    from .embedded import cache_dir

    return cache_dir() / FOLDER / code_digest()[:16]


STALE_DAYS = 1.0
"""The graphs of another version of otm's decoder (another folder under ``precompiled/``) not used for this long are
removed when a graph is saved: every edit of the decoder's sources starts a new folder (8 MB a target shape)."""


def prune(now: float | None = None) -> list[Path]:
    """Remove the folders of other code versions unused for :data:`STALE_DAYS` (a folder's time is set when one of
    its graphs is loaded or saved); returns them."""
    here = folder()
    now = time.time() if now is None else now
    gone = []
    for other in here.parent.iterdir() if here.parent.is_dir() else ():
        if other.is_dir() and other != here and now - other.stat().st_mtime > STALE_DAYS * 86400:
            shutil.rmtree(other, ignore_errors=True)
            gone.append(other)
    return gone


__all__ = ["FOLDER", "STALE_DAYS", "Precompiled", "code_digest", "folder", "graphs_of", "key", "merge_same_calls",
           "options", "positions_text", "prune", "same_calls", "source_digest"]
