"""``otm bench-decode``: block efficiency and wall clock of the decoder and its peers on fixed prompts.

Contenders, all on the same models, prompts, sampling and token budget, in one run:

* ``autoregressive``: :func:`otm.decode.autoregressive_decode` (block efficiency 1 by definition);
* ``hf generate (autoregressive)``: transformers' own ``target.generate(do_sample=True)``, the
  same sampling in the same dtype (a peer check that our autoregressive loop is not slow);
* ``hf assisted``: transformers' own assisted generation, ``target.generate(...,
  assistant_model=draft, do_sample=True)`` with transformers' default assistant settings; its
  target calls are counted by a forward hook on the target. transformers cannot run a draft that
  reads the target's features (:class:`otm.decode.feature_draft.FeatureDraft`); with one, this row runs
  a plain causal-LM ``peer_draft`` instead (the CLI's default: the embedded token-only draft) and
  says so in its name;
* ``k = 1`` (ordinary speculative sampling) for each L;
* k x L for each verifier (``kseq``, ``rrs`` on i.i.d. drafts; ``rrs_without_replacement`` on
  drafts without replacement).

Every prompt runs every contender in turn (interleaved), so a slow spell of the shared machine
hits all of them alike. Seeds are per (prompt, contender). Figures are totals over the prompts:
block efficiency = new tokens / target calls, tokens/s = new tokens / wall seconds, speedup =
tokens/s over the autoregressive row's; speedup in CPU time = the same ratio with this process's CPU
seconds (``time.process_time``; one torch thread) instead of wall seconds: on a shared machine it
leaves out the time the process waited for a core, though not the memory bandwidth other jobs take.
``target s`` and ``draft s`` split our rows' step time (target forward + laws; drafting), the rest
being verification and bookkeeping. Every contender runs the same models in the same dtype
(``--dtype auto``: bfloat16 where the CPU has it natively).

The cost model (:class:`Costs`, :func:`measure_costs`, :func:`predicted_tokens_per_second`): before
the table the bench times, on the first prompt's context, one target call of n positions for
every tree size of the grid (the decoder's own call: tree mask, positions, laws), one draft call
at batch 1 and batch k and the prompt's prefill (the fastest of 7 interleaved rounds); a row's
*predicted* tokens/s is its measured tokens over the time those costs give (each run's prefill,
then steps of a tree of 1 + k L positions and L draft calls). The gap between predicted and
measured is what the model leaves out: verification, bookkeeping, trees smaller than 1 + k L when
rows share prefixes, cache-length effects, and the load of a shared machine (the costs are the
fastest rounds).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field

from .steps import EAGER, PRECOMPILED, SWAPS, step_of

PROMPTS = (
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in simple terms.",
    "Give me three tips for learning a new programming language.",
    "What are the main differences between a cat and a dog as pets?",
    "Describe the water cycle step by step.",
    "Write a haiku about autumn leaves.",
    "How does a bicycle stay upright when it moves?",
    "Summarize the plot of a fairy tale of your choice in a few sentences.",
)
"""The fixed prompt set (user messages; the tokenizer's chat template is applied when it has one)."""


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "autoregressive", "hf_assisted" or "speculative"
    k: int = 0
    length: int = 0
    verifier: str = ""
    scheme: str = ""
    delay: int = 0  # a delayed tree's shared path (speculative_decode's delay; k >= 2 rows only)


@dataclass
class Row:
    contender: Contender
    new_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time over the same runs (time.process_time)
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    verified1: int = 0
    accepted1: int = 0
    runs: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds else float("nan")

    @property
    def tokens_per_cpu_second(self) -> float:
        return self.new_tokens / self.cpu_seconds if self.cpu_seconds else float("nan")


SCHEME_VARIANTS = {"traversal_without_replacement": ("traversal", "without_replacement")}
"""Bench names of a rule run on the other draft scheme: name -> (verifier, scheme)."""


def contenders(ks, lengths, verifiers, *, hf: bool = True, delay: int = 0) -> list[Contender]:
    """The bench's rows: autoregressive, HF assisted, k = 1 per L (speculative, and block when asked), then k x L per verifier
    (with ``delay`` > 0: delayed trees, the lengths L > delay only)."""
    from .decoder import VERIFIERS
    from .tree_registry import TREE_RULES

    chains = [v for v in verifiers if v in TREE_RULES and TREE_RULES[v].chain_only]  # k = 1 rules (block)
    rows = [Contender("autoregressive", "autoregressive")]
    if hf:
        rows.append(Contender("hf generate (autoregressive)", "hf_generate"))
        rows.append(Contender("hf assisted (transformers defaults)", "hf_assisted"))
    if 1 in ks:
        for L in lengths:
            rows.append(Contender(f"speculative k=1 L={L}", "speculative", 1, L, "speculative", "iid"))
            for v in chains:  # block verification (and any chain rule) of the same single chain
                rows.append(Contender(f"{v} k=1 L={L}", "speculative", 1, L, v, TREE_RULES[v].schemes[0]))
    for v in verifiers:
        if v in chains:
            continue  # k = 1 only: beside the speculative rows above
        verifier, scheme = SCHEME_VARIANTS.get(v, (v, next((s for s, names in VERIFIERS.items() if v in names), None)))
        for k in ks:
            if k == 1:
                continue
            for L in lengths:
                if delay and L <= delay:
                    continue  # a delayed tree needs L > delay
                name = f"{v} k={k} L={L}" + (f" delay={delay}" if delay else "")
                rows.append(Contender(name, "speculative", k, L, verifier, scheme, delay))
    return rows


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a user message: the chat template with the generation prompt when there is one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(text)["input_ids"]]


HF_CACHE_LEN = 512
"""The capacity of the StaticCache given to transformers' generate row (one shape for every prompt and run, so its
compiled forward is built once): a multiple of 512 covering prompt and new tokens, as otm's static step."""


def hf_step_options(compile: str, model=None, tokens: int = 0) -> dict:
    """``generate``'s keywords for the run's ``--compile`` choice, so that transformers' own loop runs as otm's
    rows do: ``none`` its growing cache; ``static`` a ``StaticCache`` uncompiled; a torch.compile mode a
    ``StaticCache`` with the forward compiled in that mode (transformers' ``CompileConfig``, on every device:
    by default transformers compiles only on accelerators). The cache (for ``model``, room for ``tokens``,
    rounded up to :data:`HF_CACHE_LEN`) has one shape for every call, so nothing is compiled twice."""
    compile = step_of(compile)  # onednn, int4(-compiled): the models themselves are swapped
    options = None
    if compile == PRECOMPILED:  # otm's own ahead-of-time graphs: transformers' loop compiles its forward itself
        from .precompile import inductor_options  # (under dynamo) with the same settings: siblings' GEMMs merged

        compile, options = None, inductor_options()
    if compile == "none":  # generate's loop is eager
        return {}
    from transformers import StaticCache

    capacity = -(-max(tokens, 1) // HF_CACHE_LEN) * HF_CACHE_LEN
    cache = {"past_key_values": StaticCache(config=model.config, max_cache_len=capacity)} if model is not None else {}
    if compile == "static":
        return {**cache, "disable_compile": True}
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, dynamic=False, mode=compile, options=options)  # torch takes one of the two
    config._compile_all_devices = True  # transformers' switch to compile off accelerators too
    return {**cache, "compile_config": config}


def _hf_generate(target, ids, sampling, max_new_tokens, eos, seed, compile: str = "none") -> tuple[int, int, int, float]:
    """transformers' own sampling loop, ``target.generate(do_sample=True)`` with the run's sampling and the run's
    step (:func:`hf_step_options`): (new tokens, target calls, 0, seconds); calls counted by a forward hook."""
    step = hf_step_options(compile, target, len(ids) + max_new_tokens)
    from .static import attention_configs, eager_attention

    # compiled on the CPU: transformers' eager attention in its graph, as otm's compiled step runs it
    compiled = "compile_config" in step and target.device.type == "cpu"
    with eager_attention(attention_configs(target) if compiled else ()):
        return _hf_assisted(target, None, ids, sampling, max_new_tokens, eos, seed, step=step)


def _hf_assisted(target, draft, ids, sampling, max_new_tokens, eos, seed, step=None) -> tuple[int, int, int, float]:
    """transformers' assisted generation: (new tokens, target calls, draft calls, seconds).

    transformers' defaults for the assistant (5.23): ``num_assistant_tokens=20`` with the
    ``"constant"`` schedule, ``assistant_confidence_threshold=0.4`` (drafting stops early when the
    draft's confidence drops below it; the threshold adapts and persists across calls with the
    same assistant). Calls are counted by forward hooks.
    """
    import torch

    calls = [0, 0]
    hooks = [target.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))]
    if draft is not None:
        hooks.append(draft.register_forward_hook(lambda *_: calls.__setitem__(1, calls[1] + 1)))
    assistant = {} if draft is None else {"assistant_model": draft}
    try:
        inp = torch.tensor([ids], device=target.device)
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                inp, attention_mask=torch.ones_like(inp), **assistant, do_sample=sampling.temperature > 0,
                temperature=sampling.temperature if sampling.temperature > 0 else None, top_k=sampling.top_k,
                top_p=sampling.top_p, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos,
                **(step or {}),
            )
        seconds = time.perf_counter() - start
    finally:
        for hook in hooks:
            hook.remove()
    return out.shape[1] - len(ids), calls[0], calls[1], seconds


def _run(c: Contender, target, draft, ids, sampling, max_new_tokens, eos, seed, hf_draft, *, count_host_reads=False,
         compile: str = "none"):
    """One run of a contender: (new tokens, target calls, draft calls, seconds, DecodeStats or None);
    ``hf_draft`` is the draft of the hf assisted row; ``compile`` a choice of ``--compile`` for otm's rows.
    otm's rows run with ``validate=False``: the samplers and verifiers get the decoder's own laws (whose
    model-fault checks stay), and each value check would be a device sync (docs/decode.md, "Syncs per step")."""
    from .steps import compile_options
    from .decoder import autoregressive_decode, speculative_decode

    step = compile_options(compile)
    if c.kind == "hf_assisted":
        return (*_hf_assisted(target, hf_draft, ids, sampling, max_new_tokens, eos, seed), None)
    if c.kind == "hf_generate":
        return (*_hf_generate(target, ids, sampling, max_new_tokens, eos, seed, compile), None)
    if c.kind == "autoregressive":
        g = autoregressive_decode(target, ids, sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos, seed=seed,
                                  count_host_reads=count_host_reads, validate=False, **step)
    else:
        g = speculative_decode(target, draft, ids, k=c.k, length=c.length, verifier=c.verifier, scheme=c.scheme,
                               delay=c.delay, sampling=sampling, max_new_tokens=max_new_tokens, eos_token_id=eos, seed=seed,
                               count_host_reads=count_host_reads, validate=False, **step)
    s = g.stats
    return s.new_tokens, s.target_calls, s.draft_calls, s.wall_seconds, s


# -- the cost model ----------------------------------------------------------------------------


@dataclass
class Costs:
    """Measured costs of the decoder's two kinds of calls, in milliseconds (:func:`measure_costs`).

    ``target_ms[n]``: one target call on n positions (the root and n - 1 tree nodes after a cached
    context: the tree's 4D mask and positions, the forward, the float64 laws of the n positions);
    ``draft_ms[b]``: one draft call on b rows of one new element each (forward, head, laws).
    """

    target_ms: dict[int, float]
    draft_ms: dict[int, float]
    context: int
    prefill_ms: float = 0.0  # the first call of a run: the prompt's forward on an empty cache
    prompt: int = 0  # the prompt's length in that measurement
    draft_prefill_ms: float = 0.0  # the same with a feature draft (every position's logits kept: their features)

    def target(self, n: int) -> float:
        """ms of a target call on n positions: measured, else linear between the nearest measured sizes."""
        if n in self.target_ms:
            return self.target_ms[n]
        sizes = sorted(self.target_ms)
        lo = max((x for x in sizes if x < n), default=sizes[0])
        hi = min((x for x in sizes if x > n), default=sizes[-1])
        if lo == hi:
            return self.target_ms[lo]
        return self.target_ms[lo] + (n - lo) * (self.target_ms[hi] - self.target_ms[lo]) / (hi - lo)

    def step_ms(self, k: int, length: int, delay: int = 0) -> float:
        """ms of one step of k rows of depth L: a target call on 1 + k L positions (the most a tree of
        k rows can have) and L draft calls (the first at batch 1, the next L - 1 at batch k). A delayed tree
        (shared path of ``delay`` = L1 tokens): 1 + L1 + k (L - L1) positions, 1 + L1 draft calls at batch 1
        and L - L1 - 1 at batch k."""
        if length == 0:
            return self.target(1)
        rest = length - delay - 1  # draft calls at batch k
        return self.target(1 + delay + k * (length - delay)) + (1 + delay) * self.draft_ms[1] + (
            rest * self.draft_ms[k] if rest else 0.0)


def predicted_tokens_per_second(block_efficiency: float, k: int, length: int, costs: Costs, *,
                                new_tokens: int = 0, runs: int = 0, delay: int = 0) -> float:
    r"""Tokens/s the cost model predicts from the measured block efficiency B (tokens per target call).

    Steady state (``runs = 0``): :math:`1000 B / S` with the step time
    :math:`S = T(1 + kL) + d(1) + (L - 1) d(k)` in ms (:class:`Costs`); ``length = 0``:
    autoregressive, :math:`S = T(1)`. With ``runs`` runs emitting ``new_tokens`` in all, each run's
    first call is the prompt's prefill P (``costs.prefill_ms``; ``draft_prefill_ms`` for speculative
    rows, where a feature draft keeps every prompt position; it drafts nothing) and the other
    :math:`N / B - \text{runs}` calls are steps: tokens/s :math:`= 1000 N / (\text{runs} P + (N / B - \text{runs}) S)`.
    The prefill costs every contender the same, so it dilutes every speed-up.

    >>> c = Costs({1: 50.0, 5: 60.0}, {1: 2.0}, 100, prefill_ms=300.0)
    >>> predicted_tokens_per_second(1.0, 1, 0, c), round(predicted_tokens_per_second(1.6, 1, 4, c), 2)
    (20.0, 23.53)
    >>> round(predicted_tokens_per_second(1.0, 1, 0, c, new_tokens=64, runs=1), 2)  # 64000 / (300 + 63 * 50)
    18.55
    """
    step = costs.step_ms(k, length, delay)
    if not runs:
        return 1000.0 * block_efficiency / step
    calls = new_tokens / block_efficiency
    prefill = costs.draft_prefill_ms if length and costs.draft_prefill_ms else costs.prefill_ms
    return 1000.0 * new_tokens / (runs * prefill + max(calls - runs, 0.0) * step)


def measure_costs(target, draft, context: list[int], sizes, batches, *, sampling=None, repeats: int = 7,
                  prompt: list[int] | None = None, compile: str = "none", capacity: int | None = None) -> Costs:
    """Time the decoder's own target call on each tree size in ``sizes`` (positions, root included) and
    its draft call at each batch in ``batches``, after ``context`` (token ids) in the cache, and the
    prefill of ``prompt`` (default ``context``) on an empty cache.

    ``repeats`` rounds, each timing every call once (interleaved, so a slow spell of a shared machine
    hits every size alike), after one untimed round; each cost is the fastest of its rounds, the cost
    of an undisturbed call (on a loaded machine medians of 7 were seen out of order, T(1) > T(3)), so
    on a busy machine the measured tokens/s fall below the predicted by the load's share.

    ``compile``: a choice of ``--compile`` (:data:`otm.decode.cli.COMPILE_CHOICES`): other than none, the
    static step (:mod:`otm.decode.static`) is timed, each size a bucket of the runners the decoder then
    reuses (``capacity``: the decoder's, prompt + new tokens), so nothing is compiled twice; the first,
    untimed round compiles.
    """
    import torch

    from .runner import FeatureRunner, Runner, is_feature_draft_model
    from .sampling import Sampling, next_token_laws
    from .tree import DraftTree, tree_inputs

    sampling = Sampling() if sampling is None else sampling
    prompt = list(context if prompt is None else prompt)
    features = is_feature_draft_model(draft)
    calls: dict[tuple[str, int], object] = {}
    static = compile not in EAGER
    if compile in SWAPS:  # the same calls with the models swapped (oneDNN, the GGUF's 4-bit blocks), then as they were
        from .onednn import for_choice

        undo = for_choice(compile, target, draft, require=False)
        try:
            return measure_costs(target, draft, context, sizes, batches, sampling=sampling, repeats=repeats,
                                 prompt=prompt, compile=step_of(compile), capacity=capacity)
        finally:
            undo()

    def static_runner(b: int, tree_sizes=(1,)):
        """The decoder's pooled static runner (:func:`otm.decode.static.static_runners`): b = 0 the target."""
        from .static import static_runners

        size = max(capacity or 0, len(context) + max(sizes))
        t, d = static_runners(target, draft if b else None, k=max(b, 1), length=0, refeed=False,
                              compile=None if compile == "static" else compile, capacity=size, features=features)
        t.buckets = tuple(sorted(set(t.buckets) | set(tree_sizes)))
        return d if b else t

    with torch.inference_mode():
        # static: every runner first (getting one from the pool resets the target's), then the target last
        static_drafts = {b: static_runner(b) for b in sorted(set(batches))} if static else {}
        t = static_runner(0, sizes) if static else Runner(target, "target")
        t.feed(context[:-1])
        past = t.length()

        def target_call(n: int):
            rows = [context[-1:] * (n - 1)]  # one chain: the root and n - 1 nodes, n positions
            tree = DraftTree.from_rows(rows, context[-1]) if n > 1 else DraftTree.root_only(context[-1])

            def call():
                ids, positions, mask = tree_inputs(tree, context[-1:], past, dtype=t.dtype, device=t.device)
                next_token_laws(t.forward(ids, positions, mask, keep=tree.size)[0], sampling, dtype=torch.float64)
                t.truncate(past)

            return call

        def draft_call(b: int):
            d = static_drafts[b] if static else (FeatureRunner if features else Runner)(draft, "draft")
            H = getattr(getattr(draft, "config", None), "hidden_size", 0)
            if features:
                d.feed(context, torch.zeros(len(context), H, dtype=d.dtype, device=d.device))
            else:
                d.feed(context)
            if b > 1:
                d.cache.batch_repeat_interleave(b)
            length = d.length()
            ids = torch.tensor([context[-1:]] * b, device=d.device)  # [b, 1]
            positions = torch.full((b, 1), length, dtype=torch.int64, device=d.device)

            def call():
                if features:
                    hidden = d.forward(ids, positions, torch.zeros(b, 1, H, dtype=d.dtype, device=d.device))
                    logits = d.logits(hidden[:, -1])
                else:
                    logits = d.forward(ids, positions, keep=1)[:, -1]
                next_token_laws(logits, sampling, dtype=torch.float64)
                d.truncate(length)

            return call

        def prefill_call(keep_all: bool):
            def call():
                p = Runner(target, "target")
                logits = p.forward(*p.chain(prompt), keep=len(prompt) if keep_all else 1)
                next_token_laws(logits[0, -1:], sampling, dtype=torch.float64)

            return call

        calls[("prefill", 0)] = prefill_call(False)
        if features:  # a feature draft's first pass keeps every prompt position's logits (their features)
            calls[("prefill", 1)] = prefill_call(True)
        for n in sorted(set(sizes)):
            calls[("target", n)] = target_call(n)
        for b in sorted(set(batches)):
            calls[("draft", b)] = draft_call(b)
        times: dict[tuple[str, int], list[float]] = {key: [] for key in calls}
        for round_ in range(repeats + 1):
            for key, call in calls.items():
                t0 = time.perf_counter()
                call()
                if round_:  # the first round warms up
                    times[key].append(time.perf_counter() - t0)
    ms = {key: 1000.0 * min(v) for key, v in times.items()}
    return Costs({n: v for (kind, n), v in ms.items() if kind == "target"},
                 {b: v for (kind, b), v in ms.items() if kind == "draft"}, len(context),
                 prefill_ms=ms[("prefill", 0)], prompt=len(prompt),
                 draft_prefill_ms=ms.get(("prefill", 1), ms[("prefill", 0)]))


def cost_lines(costs: Costs) -> list[str]:
    """The measured costs as printed under the conditions."""
    t1 = costs.target_ms[min(costs.target_ms)]
    tree = ", ".join(f"T({n}) {ms:.1f} ms = {ms / t1:.2f} T(1)" for n, ms in sorted(costs.target_ms.items()))
    drafts = ", ".join(f"batch {b} {ms:.2f} ms" for b, ms in sorted(costs.draft_ms.items()))
    return [f"cost model (after a {costs.context}-token context, fastest of 7 interleaved rounds): target call on n "
            f"positions: {tree}",
            f"cost model: draft call: {drafts}; prefill of a {costs.prompt}-token prompt {costs.prefill_ms:.0f} ms "
            f"({costs.draft_prefill_ms:.0f} ms keeping every position for a feature draft); "
            f"predicted tokens/s = 1000 N / (runs P + (N / B - runs) S), S = T(1 + kL) + d(1) + (L - 1) d(k)"]


def conditions(target, draft, *, dtype, device, seed, sampling, max_new_tokens, n_prompts, command,
               compile: str = "none") -> list[str]:
    import torch
    import transformers

    from ..machine import machine
    from .allocator import line as malloc_line

    def size(m):
        return sum(p.numel() for p in m.parameters())

    return [
        machine().line(step_line(compile)),
        f"platform: {platform.platform()}; python {platform.python_version()}; {malloc_line()}",
        f"torch {torch.__version__} ({torch.get_num_threads()} threads); transformers {transformers.__version__}; "
        f"device {device}; dtype {dtype}",
        f"target {type(target).__name__} {size(target):,} parameters; draft {type(draft).__name__} "
        f"{size(draft):,} parameters; V = {target.config.vocab_size}",
        f"sampling: temperature {sampling.temperature}, top-k {sampling.top_k}, top-p {sampling.top_p}; "
        f"max new tokens {max_new_tokens}; {n_prompts} prompts; seed {seed}",
        f"command: {command}",
    ]


def step_line(compile: str) -> str:
    """How otm's rows run their step, for the machine line."""
    if compile == "none":
        return "eager step (no compilation)"
    if compile == "onednn":
        return ("eager step, every linear layer on oneDNN's prepacked GEMM instead of torch's own, sibling projections "
                "and RMSNorms fused (no compilation), for every row, transformers' included")
    if compile == "int4":
        return ("eager step, the target's block layers on its GGUF's own 4-bit weights (torch's int4 CPU GEMM; group "
                "scales, zeros and the layers' inputs in bfloat16), every other linear layer on oneDNN's prepacked GEMM, siblings and "
                "RMSNorms fused (no compilation), for every row, transformers' included")
    if compile == "int4-compiled":
        return ("static-shape step compiled ahead of time by inductor (one graph per shape, saved in the user cache and "
                "loaded by later runs, called without dynamo's guards), the target's block layers on its GGUF's own 4-bit "
                "weights, every other linear layer on oneDNN's prepacked GEMM (one opaque call each in the graph), "
                "transformers' eager attention in the graph; transformers' generate row with its StaticCache compiled by "
                "torch.compile (inductor's defaults, the siblings' GEMMs merged by the same pass, same attention; under dynamo), "
                "its assisted row eager")
    if compile == "static":
        return "static-shape step, eager kernels (no compilation; transformers' generate row with its StaticCache)"
    return (f"static-shape step compiled by torch.compile (mode {compile}) for otm's rows and transformers' "
            "generate row (its StaticCache; on a CPU both graphs with transformers' eager attention); its assisted row eager")


def run_bench(target, draft, tokenizer, *, ks, lengths, verifiers, sampling, max_new_tokens, n_prompts, seed,
              hf=True, peer_draft=None, progress=True, out=print, command="", compile: str = "none",
              delay: int = 0) -> list[Row]:
    """Run the table (see the module docstring) and print it with ``out``; returns the rows.

    ``peer_draft``: the draft of the ``hf assisted`` row when it is not ``draft`` (needed when
    ``draft`` reads the target's features, which transformers' assisted generation cannot feed).
    """
    from ..progress import bar as tqdm  # a live bar on a terminal, plain lines elsewhere

    from .feature_draft import FeatureDraft
    from ..laws import OtmError

    prompts = [encode_prompt(tokenizer, p) for p in PROMPTS[:n_prompts]]
    eos = tokenizer.eos_token_id
    rows = [Row(c) for c in contenders(ks, lengths, verifiers, hf=hf, delay=delay)]
    hf_draft = draft if peer_draft is None else peer_draft
    if hf and isinstance(hf_draft, FeatureDraft):
        raise OtmError("transformers' assisted generation cannot run a draft that reads the target's features: "
                       "give a plain causal-LM peer draft (--peer-draft) or leave the row out (--no-hf)")
    if peer_draft is not None:
        from dataclasses import replace

        for row in rows:
            if row.contender.kind == "hf_assisted":
                row.contender = replace(row.contender, name="hf assisted (peer draft, defaults)")
    ours = [r.contender for r in rows if r.contender.kind == "speculative"]
    if compile == "auto":  # the cost model decides, for the grid's largest tree (otm.decode.compile_choice)
        from .compile_choice import choose

        big = max(ours, key=lambda c: 1 + c.delay + c.k * (c.length - c.delay), default=None)
        picked = choose(target, draft, prompts[0], measure=measure_costs, k=big.k if big else 1, length=big.length if big else 0,
                        delay=big.delay if big else 0, sampling=sampling,
                        new_tokens=max_new_tokens * len(prompts) * len(rows), out=out,
                        capacity=max(map(len, prompts)) + max_new_tokens)
        out(picked.line)
        compile = picked.choice
    if compile in SWAPS:  # every contender on the same swapped models (left swapped: the caller's run goes on)
        from .onednn import for_choice

        for_choice(compile, target, draft, hf_draft)
    for row in rows:  # warm-up: every contender once, 4 tokens (first-call costs stay out of the table)
        _run(row.contender, target, draft, prompts[0], sampling, 4, eos, seed, hf_draft, compile=compile)
    if compile not in EAGER + ("static",):  # every compiled shape now, so that no row's time includes compilation
        from .static import warm_all

        warm_all(target, draft, mode=step_of(compile))
    costs = measure_costs(target, draft, (prompts[0] * 2)[: len(prompts[0]) + max_new_tokens // 2],
                          [1] + [1 + c.delay + c.k * (c.length - c.delay) for c in ours],  # tree sizes
                          [1] + [c.k for c in ours], sampling=sampling,
                          prompt=prompts[0], compile=compile, capacity=max(map(len, prompts)) + max_new_tokens)
    if compile not in EAGER + ("static",):
        warm_all(target, draft, mode=step_of(compile))  # the cost model's sizes
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    bar = tqdm(total=len(rows) * len(prompts), disable=not progress, file=sys.stderr, desc="bench-decode", leave=False)
    for i, ids in enumerate(prompts):
        for j, row in enumerate(rows):
            c = row.contender
            run_seed = seed * 1_000_003 + i * 1009 + j
            bar.set_postfix_str(c.name)
            cpu_start = time.process_time()
            new, calls, draft_calls, seconds, stats = _run(c, target, draft, ids, sampling, max_new_tokens, eos, run_seed,
                                                           hf_draft, compile=compile)
            row.new_tokens += new
            row.target_calls += calls
            row.draft_calls += draft_calls
            row.wall_seconds += seconds
            row.cpu_seconds += time.process_time() - cpu_start
            if stats is not None:
                row.target_seconds += stats.target_seconds
                row.draft_seconds += stats.draft_seconds
                if stats.verified_by_depth:
                    row.verified1 += stats.verified_by_depth[0]
                    row.accepted1 += stats.accepted_by_depth[0]
            row.runs += 1
            bar.update(1)
    bar.close()
    load_end = os.getloadavg() if hasattr(os, "getloadavg") else None
    dtype = next(target.parameters()).dtype
    for line in conditions(target, draft, dtype=dtype, device=next(target.parameters()).device, seed=seed,
                           sampling=sampling, max_new_tokens=max_new_tokens, n_prompts=len(prompts), command=command,
                           compile=compile):
        out(line)
    if isinstance(draft, FeatureDraft):
        out("draft: reads the target's features (EAGLE-style; embedding and head are the target's, not counted)")
    from .draft_vocab import draft_vocab_of

    S = draft_vocab_of(draft)
    out(f"draft vocabulary: {'the whole vocabulary' if S is None else f'the {S} most frequent tokens (FR-Spec)'}; "
        f"every contender runs in {dtype}")
    if hf and peer_draft is not None:
        out(f"hf assisted row: peer draft {type(peer_draft).__name__} "
            f"{sum(p.numel() for p in peer_draft.parameters()):,} parameters (transformers cannot feed a feature draft)")
    if load_start is not None:
        out(f"load average (1, 5, 15 min) at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
            f"at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    for line in cost_lines(costs):
        out(line)
    out("")
    out(format_table(rows, costs))
    out("")
    for line in host_read_lines(rows, target, draft, prompts[0], sampling, eos, seed):
        out(line)
    return rows


HOST_READ_TOKENS = 16
"""Tokens of the separate, counted run of each of otm's contenders (counting slows every torch call)."""


def host_read_lines(rows, target, draft, ids, sampling, eos, seed) -> list[str]:
    """Host reads per step of otm's contenders, by phase (:mod:`otm.decode.host_reads`): on a GPU each is a
    device sync. Counted on a separate run of :data:`HOST_READ_TOKENS` tokens of ``ids``."""
    from .host_reads import PHASES, device_paths

    lines = [f"host reads per step (tensor values read back: a device sync each on a GPU; counted on a separate "
             f"{HOST_READ_TOKENS}-token run of the first prompt with the device's paths), by phase "
             f"{' / '.join(PHASES[:-1])}:"]
    for row in rows:
        c = row.contender
        if c.kind not in ("autoregressive", "speculative"):
            continue
        with device_paths():  # what a GPU would sync on (the CPU's own paths read more, at no cost there)
            s = _run(c, target, draft, ids, sampling, HOST_READ_TOKENS, eos, seed, None, count_host_reads=True)[-1]
        per = [s.host_reads.get(ph, 0) / s.steps for ph in PHASES[:-1]]  # all but "other"
        lines.append(f"  {c.name}: {' / '.join(f'{x:.1f}' for x in per)} ({sum(per):.1f} in all; "
                     f"{s.host_reads.get('other', 0) / s.steps:.1f} more between steps)")
    return lines


def best_speculative(rows: list[Row]) -> Row | None:
    """The speculative row with the most tokens/s."""
    ours = [r for r in rows if r.contender.kind == "speculative" and r.wall_seconds > 0]
    return max(ours, key=lambda r: r.tokens_per_second, default=None)


def _predicted(r: Row, costs: Costs | None) -> str:
    c = r.contender
    if costs is None or c.kind == "hf_assisted" or not r.target_calls:
        return "-"
    length = c.length if c.kind == "speculative" else 0
    return f"{predicted_tokens_per_second(r.block_efficiency if length else 1.0, c.k, length, costs, new_tokens=r.new_tokens, runs=r.runs, delay=c.delay if length else 0):.1f}"


def format_table(rows: list[Row], costs: Costs | None = None) -> str:
    """The markdown table; with ``costs``, a column of the cost model's predicted tokens/s."""
    ar = next((r for r in rows if r.contender.kind == "autoregressive"), None)
    base = ar.tokens_per_second if ar is not None else float("nan")
    base_cpu = ar.tokens_per_cpu_second if ar is not None else float("nan")
    head = (f"| {'contender':<36} | tokens | target calls | block efficiency | acceptance at depth 1 | "
            f"draft calls | wall s | target s | draft s | tokens/s | predicted tokens/s | speedup | speedup in CPU time |")
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        acc = f"{r.accepted1 / r.verified1:.3f}" if r.verified1 else "-"
        draft_calls = str(r.draft_calls) if r.contender.kind in ("speculative", "hf_assisted") else "-"
        ours = not r.contender.kind.startswith("hf_")
        target_s = f"{r.target_seconds:.1f}" if ours else "-"
        draft_s = f"{r.draft_seconds:.1f}" if r.contender.kind == "speculative" else "-"
        lines.append(
            f"| {r.contender.name:<36} | {r.new_tokens:>6} | {r.target_calls:>12} | {r.block_efficiency:>16.2f} | "
            f"{acc:>21} | {draft_calls:>11} | {r.wall_seconds:>6.1f} | {target_s:>8} | {draft_s:>7} | "
            f"{r.tokens_per_second:>8.1f} | {_predicted(r, costs):>18} | {r.tokens_per_second / base:>7.2f} | "
            f"{r.tokens_per_cpu_second / base_cpu:>19.2f} |"
        )
    return "\n".join(lines)
