r"""The decoder's static-shape step: a KV cache of fixed shape, inputs padded to a few sizes, compiled once.

gpt-fast's way (Meta's pytorch-labs/gpt-fast): every forward of a decoding step has the same
shapes, so ``torch.compile`` builds its graph once per shape (inductor on the CPU, CUDA graphs with
``mode="reduce-overhead"`` on a GPU) and the machine runs the model at the speed of its memory
instead of the speed of Python and of the eager kernels' dispatch.

**The cache** (:class:`SlotCache`): per layer, keys and values ``[batch, heads, capacity, head_dim]``
allocated once. A forward writes its keys and values at the *slots* the runner names (a tensor set
before the call), not after a growing length, so a tree's nodes, padding rows and the accepted path
can sit anywhere. What a query sees is decided by the 4D additive mask alone: the committed context,
its own tree ancestors, itself. Slots past the committed length hold stale keys of rejected branches
and of padding: the mask hides them (a mask that did not is the planted bug of
``tests/test_static_step.py``). A precompiled call (``int4-compiled``) reads a *window* of the cache, its first
:func:`window` slots (what is committed and the call's own, rounded up to 64), through a mask that wide: one graph
takes every window (the mask's width is a dynamic size in it), so a call costs what it reads, not what a long run's
cache holds; that runner keeps its keys and values in float32 for a bfloat16 model (torch's bfloat16 batched matmul
copies a window of the cache before reading it; the float32 one reads it in place) and one spare slot (every window
a strict part of the cache, so the graph is not specialised on a window that is all of it).

**The shapes** (:class:`StaticRunner`): a forward of q tokens is padded to the smallest *bucket*
Q >= q (by default 1 and the largest tree of the run, so two graphs per model). Padding rows come
first, so the real rows are the last q (``logits_to_keep`` keeps working); they write to scratch
slots after the real ones and attend to their own slot only. Larger inputs (the prompt) run eagerly
through the same cache, unpadded.

**Rollback** by slot: the accepted path's keys and values are copied down to the slots right after
the committed context (gpt-fast and the eager decoder's ``gather``), and the committed length moves;
nothing is cropped. A draft cache of batch k (one row per draft row) returns to one row by copying
that row into every row.

Exactness does not depend on any of this: the laws the verifier sees are the laws the tokens were
drawn from (the decoder's design), and the exact mode checks the static path like the eager one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import weakref

import torch

from ..laws import OtmError
from .precompile import Precompiled, graphs_of, positions_text
from .runner import Runner
from .steps import PRECOMPILED

MIN_ROWS = 1
"""Fewest rows (batch x positions) a compiled forward takes on the CPU. It was 3 while the compiled graph ran
SDPA: its CPU kernel with the static cache's mask was slow for one query (0.45 ms a layer over 512 slots), and
the single-row graph the slower one (bfloat16, frozen: T(1) 28.7 ms, T(3) 20.5 ms). With transformers' eager
attention in the graph (:meth:`StaticRunner._attention`) one row costs no more than three (the embedded target
on the 2-core AVX512-BF16 VM, one thread: bfloat16 frozen T(1) 26.7, T(3) 26.3 ms; on the GGUF's 4-bit blocks
13.0 against 14.8 ms), so a one-token step is no longer padded."""

COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")
"""``torch.compile`` modes the static step takes (``None``: the static shapes, eager kernels)."""


def _cache_base():
    from transformers.cache_utils import Cache

    return Cache


class SlotCache:
    """Keys and values of fixed shape ``[batch, heads, capacity, head_dim]`` per layer, written at ``slots``.

    Built lazily by :func:`slot_cache` as a subclass of transformers' ``Cache`` (so a model that checks
    ``isinstance(past_key_values, Cache)`` accepts it). ``slots`` (int64 ``[q]``) must be set before
    each forward: the cache positions the forward's q keys go to.
    """


def slot_cache(capacity: int, batch: int, dtype: torch.dtype | None = None):
    """A fresh :class:`SlotCache` of ``capacity`` positions for ``batch`` rows, holding keys and values in ``dtype``
    (default: the model's keys')."""
    return _slot_cache_class()(capacity, batch, dtype)


_CLASS = None


def _slot_cache_class():
    global _CLASS
    if _CLASS is not None:
        return _CLASS

    class _SlotCache(_cache_base(), SlotCache):  # named at module level below: a saved graph's state refers to it
        def __init__(self, capacity: int, batch: int, dtype: torch.dtype | None = None):
            super().__init__(layers=[])
            self.capacity, self.batch, self.dtype = int(capacity), int(batch), dtype
            self.keys: list[torch.Tensor] = []
            self.values: list[torch.Tensor] = []
            self.slots: torch.Tensor | None = None
            self.used = 0  # committed positions (host-side; never read by the model)

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx == len(self.keys):  # first forward: allocate this layer
                b, h, _, d = key_states.shape
                shape = (self.batch, h, self.capacity, d)
                self.keys.append(torch.zeros(shape, dtype=self.dtype or key_states.dtype, device=key_states.device))
                self.values.append(torch.zeros((self.batch, h, self.capacity, value_states.shape[-1]),
                                               dtype=self.dtype or value_states.dtype, device=value_states.device))
                if not torch.compiler.is_compiling():  # fixed addresses: CUDA graphs may then keep them
                    torch._dynamo.mark_static_address(self.keys[-1])
                    torch._dynamo.mark_static_address(self.values[-1])
            keys, values = self.keys[layer_idx], self.values[layer_idx]
            keys.index_copy_(2, self.slots, key_states.to(keys.dtype))
            values.index_copy_(2, self.slots, value_states.to(values.dtype))
            return keys, values

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.used

        @property
        def is_compileable(self) -> bool:
            return True

        def batch_repeat_interleave(self, repeats: int) -> None:
            """Every row already holds the context (it was fed to all rows): nothing to do."""
            if repeats > self.batch:
                raise OtmError(f"this static cache has {self.batch} rows, not {repeats}: build it for k = {repeats}")

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            """Keep one row: copied into every row (the batch stays fixed), committed slots only."""
            if indices.numel() != 1:
                raise OtmError("a static draft cache returns to one row at a time")
            row = indices.reshape(-1).to(self.keys[0].device)  # [1]: kept on the device (no read of its value)
            n = self.used
            for t in self.keys + self.values:
                t[:, :, :n] = t[:, :, :n].index_select(0, row)  # gathered before the write

        def keep_path(self, length: int, path: list[int]) -> None:
            """Copy the slots ``path`` (increasing, all >= length) down to ``length ..``; commit them."""
            if path:
                src = torch.tensor(path, dtype=torch.int64, device=self.keys[0].device)
                dst = slice(length, length + len(path))
                for t in self.keys + self.values:
                    t[:, :, dst] = t.index_select(2, src)  # gathered before the write
            self.used = length + len(path)

    _SlotCache.__module__, _SlotCache.__qualname__ = __name__, "_SlotCache"
    globals()["_SlotCache"] = _CLASS = _SlotCache
    return _CLASS


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """A copy with the standard strides (``contiguous()`` keeps odd strides of size-1 dimensions, which
    a compiled graph is guarded on too)."""
    return x.new_empty(x.shape).copy_(x)


def buckets_for(k: int, length: int, refeed: bool = False) -> tuple[int, int]:
    """The target's two forward sizes of a run: 1 (autoregressive steps) and its largest tree pass.

    A tree has at most ``1 + k * length`` nodes; with ``refeed`` rollback the pending chain before it
    holds up to ``length`` more tokens.
    """
    return (1, 1 + k * length + (length if refeed else 0))


def _inductor_cache() -> None:
    """Keep inductor's compiled kernels and autotuning results in the user cache folder (reused by later runs)."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from .embedded import cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")


def attention_configs(model) -> tuple:
    """The distinct configurations of ``model``'s modules that choose an attention implementation."""
    seen: dict[int, object] = {}
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation"):
            seen.setdefault(id(c), c)
    return tuple(seen.values())


GROUPED = "otm_grouped"
"""The attention implementation a compiled CPU call runs (:func:`grouped_attention`), registered with transformers."""


def grouped_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager attention (``eager_attention_forward``: matmul, additive mask, float32 softmax, matmul)
    with the query heads of each key/value head taken together, instead of the key and value heads copied once per
    query head (``repeat_kv``): the same arithmetic (equal in float64: ``tests/test_static_step.py``), each cached key
    and value read once. On the embedded target (9 query heads, 3 key/value heads; the 4-bit blocks compiled ahead
    of time, one position after 100 tokens, calls interleaved in one process, 2026-11-28 13:45 UTC) T(1) 11.07 ->
    10.09 ms with 512 cache slots (the static step's capacity for runs up to 448 positions), 9.37 -> 9.60 ms with 256
    (where the copies cost less than the grouped layout's extra work).

    ``query [b, h, q, d]``, ``key`` and ``value [b, h_kv, S, d]``, ``attention_mask`` additive ``[b or 1, 1, q, W]``: a
    mask longer than the keys is cut to them, a shorter one is a window (the keys and values past W are not read:
    :func:`window`); returns ``([b, q, h, d], [b, h, q, min(S, W)])`` as transformers' function does. Keys and values
    wider than the query (the float32 cache of a precompiled bfloat16 model) are computed with in their dtype, the
    output returned in the query's."""
    b, h, q, d = query.shape
    if attention_mask is not None:  # a mask narrower than the cache: a window, its first slots (:func:`window`)
        key, value = key[:, :, : attention_mask.shape[-1]], value[:, :, : attention_mask.shape[-1]]
    kv, S = key.shape[1], key.shape[2]
    g = h // kv  # query head j reads key/value head j // g (repeat_kv's order)
    wide = key.dtype  # the cache's: the query's, or float32 keys and values for a narrower query (computed in float32)
    scores = torch.matmul(query.reshape(b, kv, g * q, d).to(wide), key.transpose(2, 3)) * scaling  # [b, kv, g q, S]
    if attention_mask is not None:
        scores = (scores.view(b, kv, g, q, S) + attention_mask[:, :, None, :, :S].to(wide)).view(b, kv, g * q, S)
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(wide)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs, value).to(query.dtype)  # [b, kv, g q, d]
    return out.view(b, h, q, d).transpose(1, 2).contiguous(), probs.to(query.dtype).view(b, h, q, S)


_REGISTERED = False


def _register() -> None:
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register(GROUPED, grouped_attention)
        AttentionMaskInterface.register(GROUPED, eager_mask)  # transformers' own masks (its generate row) as eager's
        _REGISTERED = True


@contextlib.contextmanager
def eager_attention(configs):
    """Within: transformers' eager attention with grouped queries (:func:`grouped_attention`: matmuls, softmax, which
    inductor fuses) for ``configs`` (:func:`attention_configs`), instead of SDPA, whose CPU kernel with a static
    cache's additive mask took 0.45 ms a layer for one query over 512 slots (the embedded target, 13 ms of a 30-layer
    call). A compiled call on the CPU runs in it (otm's static step, and transformers' compiled ``generate`` in the
    bench); the settings are put back after, so the eager contenders of a run keep theirs."""
    if configs:
        _register()
    before = [c._attn_implementation for c in configs]
    try:
        for c in configs:
            c._attn_implementation = GROUPED
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b


class StaticRunner(Runner):
    """A causal LM over a :class:`SlotCache`: forwards padded to fixed sizes, optionally compiled.

    Parameters
    ----------
    model : a causal LM with the transformers interface (the decoder's), or a feature draft.
    role : "target" or "draft" (for messages).
    capacity : cache positions (prompt + new tokens + the largest forward).
    batch : cache rows (the draft's k; the target's 1).
    buckets : forward sizes (increasing); a forward of q tokens is padded to the smallest bucket >= q,
        larger ones (the prompt) run eagerly and unpadded.
    compile : None (static shapes, eager kernels) or a mode of :data:`COMPILE_MODES`.
    progress : where to say that a shape is being compiled: ``"stderr"`` (the default: ``sys.stderr`` at the
        time), a file, or None (silent).
    """

    def __init__(self, model, role: str, *, capacity: int, batch: int = 1, buckets=(1,), compile=None,
                 progress="stderr", with_features: bool = False):
        super().__init__(model, role)
        self.with_features = with_features
        self.last_features = None
        modes = COMPILE_MODES + (PRECOMPILED,)
        if compile is not None and compile not in modes:
            raise OtmError(f"compile must be None or one of {', '.join(modes)}, got {compile!r}")
        if compile == PRECOMPILED and self.device.type != "cpu":
            raise OtmError(f"the precompiled static step runs on the CPU, not on {self.device}: use a torch.compile "
                           "mode (reduce-overhead on a GPU)")
        # precompiled: one slot more than the calls use, so that every window is a strict part of the cache (a graph
        # traced on a window that is the whole cache would be specialised on its being contiguous)
        # float32 keys and values, where the model's are narrower: see grouped_attention
        wide = torch.float32 if compile == PRECOMPILED and self.dtype in (torch.bfloat16, torch.float16) else None
        self.cache = slot_cache(capacity + (1 if compile == PRECOMPILED else 0), batch, wide)
        self.batch, self.capacity = int(batch), int(capacity)
        compiled_cpu = compile is not None and self.device.type == "cpu"
        self.min_q = -(-MIN_ROWS // self.batch) if compiled_cpu else 1
        self.buckets = tuple(sorted(set(int(b) for b in buckets) | {self.min_q}))
        self.mode, self.progress = compile, progress
        self.compiled = None
        self.shapes: set[int] = set()  # bucket sizes already compiled (first call of each compiles)
        self.compile_seconds = 0.0

    def length(self) -> int:
        return self.cache.used

    def _call(self, ids, positions, mask, extra):
        if self.with_features:  # a feature draft's target: the head's inputs are returned beside the logits
            hidden = self.model.get_decoder()(input_ids=ids, position_ids=positions, attention_mask=mask,
                                              use_cache=True, **{self.cache_kw: self.cache}).last_hidden_state
            keep = extra.get("logits_to_keep", 0)  # an eager forward's head on the positions asked for only
            return self.model.get_output_embeddings()(hidden[:, -keep:] if keep else hidden), hidden
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                          **{self.cache_kw: self.cache}, **extra).logits

    def _bucket(self, q: int) -> int | None:
        if q > self.buckets[-1]:
            return None
        need = max(q, self.min_q)  # compiled on the CPU: at least MIN_ROWS rows per GEMM
        return next(b for b in self.buckets if b >= need)  # min_q is a bucket: there is one

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None, keep: int = 0):
        """Logits ``[b, q', V]`` of ``ids [b, q]`` at ``positions [b, q]`` (as :meth:`Runner.forward`).

        ``mask``: None (causal after the committed context) or the decoder's ``[1, 1, q, used + q]``
        additive tree mask over the committed context and the q new tokens. With ``with_features``
        the head's inputs of the q tokens are left in :attr:`last_features` ``[b, q, H]``.
        """
        out = self._run(ids, positions, mask, keep, {})
        if self.with_features:
            out, self.last_features = out
        return out

    def _run(self, ids, positions, mask, keep, inputs: dict):
        """One forward, padded to its bucket: ``inputs`` are further ``[b, q, ...]`` tensors padded the same way."""
        b, q = ids.shape
        rows = b
        if b != self.batch:
            if b == 1:  # the context, to every row
                ids, positions = ids.expand(self.batch, q), positions.expand(self.batch, q)
                inputs = {n: x.expand(self.batch, *x.shape[1:]) for n, x in inputs.items()}
            elif b < self.batch:  # fewer draft rows than the cache has (a small support): repeat row 0
                more = self.batch - b
                ids = torch.cat([ids, ids[:1].expand(more, q)])
                positions = torch.cat([positions, positions[:1].expand(more, q)])
                inputs = {n: torch.cat([x, x[:1].expand(more, *x.shape[1:])]) for n, x in inputs.items()}
            else:
                raise OtmError(f"the static {self.role} cache has {self.batch} rows, got {b}")
        used = self.cache.used
        Q = self._bucket(q)
        padded = Q if Q is not None else q
        if used + padded > self.capacity:
            raise OtmError(f"the static {self.role} cache holds {self.capacity} positions and this step needs "
                           f"{used + padded}: give a larger max_cache or fewer new tokens")
        pad = padded - q
        compiled = Q is not None and self.mode is not None
        # the slots the attention reads: a window of them (precompiled), else the cache's length (a precompiled
        # runner's eager calls: its spare slot too, never visible)
        width = window(used + padded, self.capacity) if compiled and self.mode == PRECOMPILED else self.cache.capacity
        allowed = torch.zeros((padded, width), dtype=torch.bool)
        allowed[pad:] = self.visible(used, q, mask, width)
        real = torch.arange(used, used + q)
        scratch = torch.arange(used + q, used + padded)
        allowed[torch.arange(pad), scratch] = True  # a padding row sees its own slot only
        full = torch.zeros((1, 1, padded, width), dtype=self.dtype)
        full[0, 0].masked_fill_(~allowed, torch.finfo(self.dtype).min)
        if pad:
            ids = torch.cat([ids.new_zeros((self.batch, pad)), ids], 1)
            positions = torch.cat([positions.new_zeros((self.batch, pad)), positions], 1)
            inputs = {n: torch.cat([x.new_zeros((self.batch, pad, *x.shape[2:])), x], 1) for n, x in inputs.items()}
        # contiguous inputs: a compiled graph is guarded on strides too (a slice of the draft rows or an
        # expanded context would compile a graph of its own)
        ids, positions = _fresh(ids), _fresh(positions)
        inputs = {n: _fresh(x) for n, x in inputs.items()}
        self.cache.slots = torch.cat([scratch, real]).to(self.device)
        # a compiled graph is specialised on every Python value: all logits are kept, so one graph per bucket
        extra = {"logits_to_keep": keep} if keep and self.keeps_logits and not compiled and not inputs else {}
        fn = self._call_inputs if inputs else self._call
        first = compiled and Q not in self.shapes
        if compiled and self.mode == PRECOMPILED:
            fn = self._precompiled(fn, Q, (ids, positions, full.to(self.device), extra), inputs)
            first = False
        elif compiled:
            fn = self._compiled(fn)
            if first:
                self._say(f"compiling the {self.role}'s step for {positions_text(Q)} "
                          f"(torch.compile, mode {self.mode}; once per shape, cached in the user cache folder) ...")
        start = time.perf_counter()
        # a precompiled graph was traced with the grouped attention: nothing to set at each call (hot path); the eager
        # calls of a precompiled runner run it too (the cache's float32 keys are read by it only)
        with self._attention(compiled != (self.mode == PRECOMPILED)):
            out = fn(ids, positions, full.to(self.device), extra, **inputs) if inputs else fn(ids, positions,
                                                                                               full.to(self.device), extra)
        if first:
            self.shapes.add(Q)
            self.compile_seconds += time.perf_counter() - start
            self._say(f"compiled in {time.perf_counter() - start:.1f} s")
        self.cache.used = used + q
        self.calls += 1

        def real_rows(x):
            return x[:rows, pad:] if not extra else x[:rows]  # logits_to_keep already dropped the padding rows

        return tuple(real_rows(x) for x in out) if isinstance(out, tuple) else real_rows(out)

    def _call_inputs(self, ids, positions, mask, extra, **inputs):
        raise NotImplementedError

    def _precompiled(self, fn, Q: int, args: tuple, kwargs: dict):
        """Bucket ``Q``'s ahead-of-time graph (:mod:`otm.decode.precompile`), loaded or compiled on first use."""
        graphs = graphs_of(self)  # kept outside the runner: a graph's saved state holds the runner, not its graphs
        graph = graphs.get(Q)
        if graph is None:
            _inductor_cache()
            with self._attention(True):
                graph = graphs[Q] = Precompiled(fn, self, Q, args, kwargs, self._say)
            self.shapes.add(Q)
            self.compile_seconds += graph.seconds
        return graph

    def _attention(self, compiled: bool):
        """A compiled call on the CPU runs transformers' eager attention (:func:`eager_attention`)."""
        return eager_attention(self._attention_configs if compiled and self.device.type == "cpu" else ())

    @functools.cached_property
    def _attention_configs(self) -> tuple:
        return attention_configs(self.model)

    def visible(self, used: int, q: int, mask: torch.Tensor | None, width: int | None = None) -> torch.Tensor:
        """``[q, width]`` bool (default width: the capacity): the slots each of the q new tokens may attend to -- the
        committed context and, among the q, itself and what ``mask`` allows (causal when None); never a slot at or
        past ``used + q``, which holds stale keys of rejected branches and of padding. A width under ``used + q`` (a
        window too narrow: never the decoder's) cuts the slots past it, as a mask that wide would."""
        width = self.capacity if width is None else width
        out = torch.zeros((q, width), dtype=torch.bool)
        n = min(used + q, width)
        if mask is None:  # token i sees slot j <= used + i: the same rule at any width, so built n wide
            out[:, :n] = torch.ones(q, n, dtype=torch.bool).tril(used)
        else:
            out[:, :n] = (mask[0, 0].to("cpu") == 0)[:, :n]
        return out

    def _say(self, text: str) -> None:
        if self.progress is not None:
            print(text, file=sys.stderr if self.progress == "stderr" else self.progress, flush=True)

    def _compiled(self, fn):
        if self.compiled is None:
            _inductor_cache()
            # on the CPU, inductor's freezing folds the weights into the graph and prepacks them for oneDNN's
            # GEMMs: measured on the 2-core AVX512-BF16 VM (bfloat16), a 9-position tree then costs T(1)
            # (1.00 T(1), eager 1.26) where the unfrozen graph gave no gain (docs/decode.md)
            if self.device.type == "cpu":  # a mode's own options, plus freezing (torch takes a mode or options)
                from torch._inductor import list_mode_options

                options = {**list_mode_options(self.mode), "freezing": True}
                self.compiled = torch.compile(fn, dynamic=False, options=options)
            else:
                self.compiled = torch.compile(fn, mode=None if self.mode == "default" else self.mode, dynamic=False)
        return self.compiled

    def warm(self) -> None:
        """Compile every bucket not compiled yet (a forward of that many placeholder tokens after the
        committed context, then rolled back), so that no later call pays for compilation (benchmarks)."""
        if self.mode is None:
            return
        if not self.cache.keys:  # the first forward allocates the cache's layers: an eager one (larger than every
            self._placeholder(self.buckets[-1] + 1)  # bucket), so that no graph is traced through the allocation
        for Q in self.buckets:
            if Q < self.min_q or Q in self.shapes:
                continue
            self._placeholder(Q)

    def _placeholder(self, Q: int) -> None:
        """A forward of Q placeholder tokens after the committed context, then rolled back (not counted as a call)."""
        used, calls, features = self.cache.used, self.calls, self.last_features
        ids = torch.zeros((self.batch, Q), dtype=torch.int64, device=self.device)
        positions = (used + torch.arange(Q, device=self.device))[None].expand(self.batch, Q)
        with torch.inference_mode():
            self._warm_call(ids, positions)
        self.truncate(used)
        self.calls, self.last_features = calls, features

    def _warm_call(self, ids, positions):
        self.forward(ids, positions)

    def keep_path(self, length: int, path: list[int]) -> None:
        self.cache.keep_path(length, path)

    def truncate(self, length: int) -> None:
        if length > self.cache.used:
            raise RuntimeError(f"{self.role} cache has {self.cache.used} positions, cannot keep {length}")
        self.cache.used = length


class StaticFeatureRunner(StaticRunner):
    """A feature draft (:class:`otm.decode.feature_draft.FeatureDraft`) over a :class:`SlotCache` (as
    :class:`otm.decode.runner.FeatureRunner`: it returns hidden states, turned into logits by :meth:`logits`)."""

    def _call_inputs(self, ids, positions, mask, extra, features):
        return self.model(ids, features, position_ids=positions, past_key_values=self.cache, use_cache=True,
                          attention_mask=mask).hidden

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[b, q, H]`` of ``ids [b, q]`` with ``features [b, q, H]``."""
        return self._run(ids, positions, None, 0, {"features": features})

    def feed(self, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        return self.forward(*self.chain(tokens), features[None].to(self.dtype))[:, -1]

    def _warm_call(self, ids, positions):
        H = self.model.config.hidden_size
        self.forward(ids, positions, torch.zeros((*ids.shape, H), dtype=self.dtype, device=self.device))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)


_POOL: "weakref.WeakKeyDictionary" = None


def _pooled(model, key: tuple, buckets, make):
    """The runner of ``model`` for ``key``, made once per process and reused (its compiled graphs with it);
    its buckets grow to include ``buckets`` (a new size compiles on its first use)."""
    global _POOL
    if _POOL is None:
        _POOL = weakref.WeakKeyDictionary()
    runners = _POOL.setdefault(model, {})
    runner = runners.get(key)
    if runner is None:
        runner = runners[key] = make()
    runner.buckets = tuple(sorted(set(runner.buckets) | set(buckets)))
    runner.cache.used, runner.calls, runner.last_features = 0, 0, None  # a fresh run over the same buffers
    return runner


def warm_all(*models, mode=None) -> None:
    """:meth:`StaticRunner.warm` every pooled runner of ``models`` compiled in ``mode`` (their compiled steps, every
    bucket); ``mode=None``: every mode. A run warms its own mode only: the runners another step left in the pool (the
    compile decision's, say) would compile shapes nobody calls."""
    for model in models:
        for runner in (_POOL or {}).get(model, {}).values():
            if mode is None or runner.mode == mode:
                runner.warm()


WINDOW = 64
"""The precompiled step's attention reads the cache's first slots only, a multiple of this many (:func:`window`)."""


def window(needed: int, capacity: int) -> int:
    """The slots a precompiled call's attention reads: the ``needed`` ones (committed, the call's own) rounded up to a
    multiple of :data:`WINDOW`, at most ``capacity``. One graph takes every window (the mask's last dimension is
    dynamic in it: :mod:`otm.decode.precompile`), so a long run's calls cost what they read, not what the cache holds."""
    return min(int(capacity), -(-int(needed) // WINDOW) * WINDOW)


def capacity_for(positions: int) -> int:
    """Static cache positions for runs of up to ``positions`` (prompt, new tokens, largest forward): a
    multiple of 512, so runs of similar lengths share one cache and one compiled graph per shape."""
    return -(-(int(positions) + 64) // 512) * 512


def static_runners(target, draft, *, k: int, length: int, refeed: bool, compile, capacity: int, features: bool):
    """``(target runner, draft runner or None)`` of a static-shape run (the decoder's, :mod:`otm.decode.decoder`).

    One runner per model, role, cache size, compile mode (and the draft's k) per process: a later run
    reuses its buffers and compiled graphs. The target's buckets gain 1 and the run's largest tree pass
    (:func:`buckets_for`); the draft's are 1 and 2 (the tokens it is fed after a step), over k rows.
    """
    top = buckets_for(k, length, refeed)
    room = capacity_for(int(capacity) + top[-1])
    # compiled, the target always returns its features too (nothing more to compute in the graph), so that an
    # autoregressive run and a feature draft's run share one graph per shape (one compilation fewer)
    returns = features or compile is not None
    t = _pooled(target, ("target", room, compile, returns), top, lambda: StaticRunner(
        target, "target", capacity=room, buckets=top, compile=compile, with_features=returns))
    if draft is None:
        return t, None
    cls = StaticFeatureRunner if features else StaticRunner
    d = _pooled(draft, ("draft", room, k, compile), (1, 2), lambda: cls(
        draft, "draft", capacity=room, batch=k, buckets=(1, 2), compile=compile))
    return t, d


__all__ = ["COMPILE_MODES", "GROUPED", "MIN_ROWS", "SlotCache", "attention_configs", "eager_attention", "grouped_attention", "StaticFeatureRunner", "StaticRunner", "buckets_for", "capacity_for", "slot_cache", "static_runners", "warm_all"]
