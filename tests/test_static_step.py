"""The static-shape step (otm.decode.static): fixed caches written at named slots, forwards padded to two
sizes per model, rollback by slot, optionally compiled.

Exact: the real decoder with ``static=True``, every run enumerated by its exact mode, gives the target's
law of T tokens to 1e-12 on toy LMs for the token-level rules, block and traversal, both schemes and both
rollbacks. The planted realistic bug -- the rollback commits the accepted path without moving its keys
down, so the next step reads the stale slots of a rejected branch -- is caught by the same check (law
error above 1e-4 on the cases below, against < 1e-12).

Same tokens: on tiny float64 Llama pairs (a token draft and a feature draft) the same seed gives the same
tokens through the static step as through the eager dynamic one, compiled (dynamo traced, the
``aot_eager`` backend: the graph is captured, the kernels stay eager so the test takes seconds) or not.
Inductor's compiled kernels run in ``make test-slow``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import otm.decode.static as static
from otm.decode import autoregressive_decode, speculative_decode
from otm.decode.exact_mode import exact_decode_law, law_error, target_law
from otm.decode.toy import ToyLM, model_law
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = [0, 2]

CASES = [
    dict(k=2, length=2, verifier="kseq"),
    dict(k=3, length=1, verifier="rrs"),
    dict(k=2, length=2, verifier="traversal"),
    dict(k=1, length=3, verifier="block"),
    dict(k=3, length=2, verifier="rrs_without_replacement", scheme="without_replacement"),
    dict(k=2, length=2, verifier="traversal", scheme="without_replacement"),
    dict(k=2, length=2, verifier="kseq", target_rollback="refeed"),
]


def _error(V, seeds, T, **options):
    target, draft = ToyLM(V, seed=seeds[0]), ToyLM(V, seed=seeds[1])
    prompt = [0, 1]
    law = exact_decode_law(target, draft, prompt, max_new_tokens=T, static=True, **options)
    return law_error(law, target_law(model_law(target, prompt, None), T))


@pytest.mark.parametrize("options", CASES, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_static_step_is_exact(options):
    assert _error(2, (0, 1), 3, **options) < 1e-12


def test_static_step_is_exact_on_a_larger_vocabulary():
    assert _error(3, (0, 1), 3, k=2, length=2, verifier="traversal", scheme="without_replacement") < 1e-12


def test_static_autoregressive_is_exact():
    target = ToyLM(3, seed=4)
    law = exact_decode_law(target, None, PROMPT, max_new_tokens=3, static=True)
    assert law_error(law, target_law(model_law(target, PROMPT, None), 3)) < 1e-12


def _forgotten_gather(self, length, path):
    """Planted bug: the rollback commits the accepted path's length without moving its keys and values
    down, so the next step reads the slots of the tree's first nodes -- a rejected branch -- as the path."""
    self.used = length + len(path)


@pytest.mark.parametrize("options", [CASES[0], CASES[2], CASES[4]], ids=["kseq", "traversal", "rrs_wor"])
def test_stale_slots_read_by_the_next_step_are_caught(monkeypatch, options):
    """The planted realistic bug (stale static-cache slots of a rejected branch read by the next step,
    :func:`_forgotten_gather`): law error 1.7e-4 (traversal), 3.2e-4 (kseq), 3.3e-4 (rrs without
    replacement) at V = 2, T = 3 (1.8e-2 to 7.2e-2 at V = 3), against < 1e-12 for the real step."""
    cls = type(static.slot_cache(1, 1))
    monkeypatch.setattr(cls, "keep_path", _forgotten_gather)
    assert _error(2, (0, 1), 3, **options) > 1e-4


def _llama(seed, V=40):
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None, initializer_range=0.3)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).double().eval()


def _feature_pair(seed):
    from otm.decode.feature_draft import build_feature_draft

    target = _llama(seed)
    draft = build_feature_draft(target, seed=seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad and p.ndim == 2:
                p.normal_(0, 0.4)
    return target, draft.double().eval()


RUNS = [
    dict(k=3, length=3, verifier="kseq"),
    dict(k=2, length=2, verifier="traversal"),
    dict(k=4, length=2, verifier="rrs_without_replacement", scheme="without_replacement"),
    dict(k=1, length=4, verifier="block", target_rollback="refeed"),
]


@pytest.mark.parametrize("options", RUNS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_same_tokens_static_and_dynamic_on_a_llama_pair(options):
    target, draft = _llama(0), _llama(1)
    prompt = list(range(1, 9))
    a = speculative_decode(target, draft, prompt, max_new_tokens=40, seed=3, **options)
    b = speculative_decode(target, draft, prompt, max_new_tokens=40, seed=3, static=True, **options)
    assert a.tokens == b.tokens
    assert (a.stats.target_calls, a.stats.draft_calls) == (b.stats.target_calls, b.stats.draft_calls)


def test_same_tokens_static_and_dynamic_with_a_feature_draft():
    target, draft = _feature_pair(5)
    prompt = list(range(1, 9))
    for options in (dict(k=3, length=2, verifier="kseq"), dict(k=2, length=3, verifier="traversal")):
        a = speculative_decode(target, draft, prompt, max_new_tokens=30, seed=1, **options)
        b = speculative_decode(target, draft, prompt, max_new_tokens=30, seed=1, static=True, **options)
        assert a.tokens == b.tokens


def _traced(self, fn):
    """The compiled path with dynamo's graph capture and eager kernels (seconds, not minutes)."""
    if self.compiled is None:
        self.compiled = torch.compile(fn, backend="aot_eager", dynamic=False)
    return self.compiled


def test_compiled_static_step_gives_the_same_tokens(monkeypatch, capsys):
    """Same tokens compiled and eager; one graph per bucket and model (target 1 and 1 + kL, draft 1 and 2),
    whatever the strides of the decoder's inputs (a slice of the draft rows once compiled a graph per step
    shape: caught here as extra graphs), and nothing compiled again in a second run."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(static.StaticRunner, "_compiled", _traced)
    target, draft = _llama(2), _llama(3)
    prompt = list(range(1, 9))
    options = dict(k=3, length=2, verifier="kseq", max_new_tokens=24, seed=7)
    a = speculative_decode(target, draft, prompt, **options)
    torch._dynamo.reset()
    counters.clear()
    b = speculative_decode(target, draft, prompt, compile="default", **options)
    assert a.tokens == b.tokens
    runners = [r for model in (target, draft) for r in static._POOL[model].values()]
    graphs = sum(len(r.shapes) for r in runners)  # the buckets each runner compiled
    assert counters["stats"]["unique_graphs"] == graphs <= 4
    err = capsys.readouterr().err
    assert "compiling the target's step for 7 positions" in err and "compiling the draft's step" in err
    assert runners[0].shapes <= {static.MIN_ROWS, 7}  # the target: one graph per bucket, MIN_ROWS and the largest tree (1 + k L)
    c = speculative_decode(target, draft, prompt, compile="default", **options)  # a second run: nothing recompiles
    assert c.tokens == a.tokens and "compiling" not in capsys.readouterr().err
    assert counters["stats"]["unique_graphs"] == graphs
    ar = autoregressive_decode(target, prompt, max_new_tokens=12, seed=2)
    assert autoregressive_decode(target, prompt, max_new_tokens=12, seed=2, compile="default").tokens == ar.tokens


def test_static_cache_refuses_a_step_past_its_capacity_in_one_line():
    target, draft = _llama(0), _llama(1)
    with pytest.raises(OtmError, match="static (target|draft) cache holds .* positions") as e:
        speculative_decode(target, draft, [1] * 600, max_new_tokens=5, k=2, length=2, static=True,
                           max_cache=8)
    assert "\n" not in str(e.value)
    with pytest.raises(OtmError, match="compile must be None or one of"):
        static.StaticRunner(target, "target", capacity=16, compile="fast")
    import otm.decode.runner as runner_module

    with pytest.MonkeyPatch.context() as mp:  # a model on a GPU: the ahead-of-time step is the CPU's
        mp.setattr(runner_module, "device_and_dtype", lambda model: (torch.device("cuda"), torch.float32))
        with pytest.raises(OtmError, match="precompiled static step runs on the CPU, not on cuda") as e:
            static.StaticRunner(target, "target", capacity=16, compile="precompiled")
    assert "\n" not in str(e.value)


def test_cli_decode_and_bench_with_the_static_step(tmp_path, capsys):
    """``otm decode --compile static`` gives the tokens of the eager step (same seed); ``otm bench-decode
    --compile static`` names the step in its machine line and runs every row and its cost model through it."""
    import json

    from otm.cli import main
    from test_decode import _save_pair

    target_dir, draft_dir = _save_pair(tmp_path)
    common = ["--target", target_dir, "--draft", draft_dir, "--no-progress", "--max-new-tokens", "12"]
    runs = []
    for step in ("none", "static"):
        assert main(["decode", "--prompt", "a b c", "-k", "3", "--length", "2", "--json", "--compile", step,
                     *common]) == 0
        runs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert runs[0] == runs[1] and len(runs[0]) == 12
    assert main(["bench-decode", "--k", "2", "--length", "2", "--verifiers", "kseq", "--prompts", "1", "--no-hf",
                 "--compile", "static", *common]) == 0
    out = capsys.readouterr().out
    assert "static-shape step, eager kernels" in out and "kseq k=2 L=2" in out and "--compile static" in out


def test_warm_compiles_every_bucket_once_and_leaves_the_cache_as_it_was(monkeypatch):
    monkeypatch.setattr(static.StaticRunner, "_compiled", _traced)
    target = _llama(4)
    runner = static.StaticRunner(target, "target", capacity=64, buckets=(1, 5), compile="default", progress=None)
    with torch.inference_mode():
        runner.feed([1, 2, 3])
    before = [k[:, :, :3].clone() for k in runner.cache.keys]
    runner.warm()
    assert runner.shapes == {static.MIN_ROWS, 5} and runner.length() == 3
    assert all(torch.equal(k[:, :, :3], b) for k, b in zip(runner.cache.keys, before))


def test_a_compiled_cpu_call_runs_eager_attention_and_puts_the_setting_back(monkeypatch):
    """On the CPU a compiled call runs transformers' eager attention with grouped queries (SDPA's CPU kernel with the static mask was
    slow for one query); the model's own setting is back after the call (the run's eager contenders keep theirs);
    a static step that is not compiled keeps SDPA."""
    monkeypatch.setattr(static.StaticRunner, "_compiled", _traced)
    target = _llama(6)
    target.config._attn_implementation = "sdpa"
    seen = []
    attention = target.model.layers[0].self_attn
    original = attention.forward

    def spy(*args, **kwargs):
        seen.append(attention.config._attn_implementation)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "forward", spy)
    for mode, inside in ((None, "sdpa"), ("default", static.GROUPED)):
        seen.clear()
        runner = static.StaticRunner(target, "target", capacity=64, buckets=(1,), compile=mode, progress=None)
        with torch.inference_mode():
            runner.feed([1, 2, 3])  # the prompt: eager, not compiled
            runner.forward(*runner.chain([4]))
        assert seen == ["sdpa", inside] and target.config._attn_implementation == "sdpa"


def test_a_compiled_run_compiles_every_shape_before_its_first_step(monkeypatch, capsys):
    """The run's clock and its streamed tokens start after compilation: every shape of the target and the draft is
    compiled (and said) before the first step's tokens, none after; a second run compiles nothing."""
    monkeypatch.setattr(static.StaticRunner, "_compiled", _traced)
    target, draft = _llama(8), _llama(9)
    prompt = list(range(1, 9))
    torch._dynamo.reset()
    before_first = []

    def on_tokens(new):
        if not before_first:
            before_first.append(capsys.readouterr().err)

    gen = speculative_decode(target, draft, prompt, k=2, length=2, verifier="kseq", max_new_tokens=16, seed=3,
                             compile="default", on_tokens=on_tokens)
    assert len(gen.tokens) == 16
    assert "compiling the target's step" in before_first[0] and "compiling the draft's step" in before_first[0]
    assert "compiling" not in capsys.readouterr().err
    speculative_decode(target, draft, prompt, k=2, length=2, verifier="kseq", max_new_tokens=8, seed=4,
                       compile="default")
    assert "compiling" not in capsys.readouterr().err


def test_transformers_compiled_generate_runs_eager_attention_as_ours_does(monkeypatch):
    """The bench's ``hf generate`` row, compiled on the CPU, runs transformers' eager attention (as otm's compiled
    step does: SDPA with the static mask is slow for one query there) and puts the model's setting back; eager, it
    keeps SDPA."""
    from otm.decode import bench
    from otm.decode.sampling import Sampling

    target = _llama(10)
    target.config._attn_implementation = "sdpa"
    seen = []

    def generate(inp, **kwargs):
        seen.append((target.config._attn_implementation, "compile_config" in kwargs))
        return torch.cat([inp, inp[:, :2]], 1)

    monkeypatch.setattr(target, "generate", generate)
    for compile in ("none", "default"):
        bench._hf_generate(target, [1, 2, 3], Sampling(), 2, None, 0, compile=compile)
    assert seen == [("sdpa", False), (static.GROUPED, True)] and target.config._attn_implementation == "sdpa"


def test_warm_all_warms_the_runners_of_the_run_s_mode_only(monkeypatch):
    """A run warms the pooled runners of its own step: the runners another step left in the pool (the compile
    decision's ``default`` ones, beside the run's ``precompiled`` ones) compiled shapes nobody called."""
    target = _llama(0)
    warmed = []
    monkeypatch.setattr(static.StaticRunner, "warm", lambda self: warmed.append(self.mode))
    for mode in ("default", "precompiled"):
        static.static_runners(target, None, k=1, length=1, refeed=False, compile=mode, capacity=32, features=False)
    static.warm_all(target, mode="precompiled")
    assert warmed == ["precompiled"]
    static.warm_all(target)
    assert sorted(warmed[1:]) == ["default", "precompiled"]


def test_a_compiled_target_serves_autoregressive_and_feature_runs_with_one_runner():
    """Compiled, the target's pooled runner returns its features whether the run needs them or not, so an
    autoregressive run and a feature draft's run share its graphs (one compilation per shape, not two); an eager
    forward with ``keep`` computes the head on the kept positions only and leaves every position's features."""
    target = _llama(0)
    common = dict(k=1, length=1, refeed=False, capacity=32)
    plain, _ = static.static_runners(target, None, compile="default", features=False, **common)
    feats, _ = static.static_runners(target, None, compile="default", features=True, **common)
    assert plain is feats and plain.with_features
    eager, _ = static.static_runners(target, None, compile=None, features=False, **common)
    assert eager is not plain and not eager.with_features  # uncompiled: the plain forward, as before
    runner = static.StaticRunner(target, "target", capacity=32, with_features=True)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        kept = runner.forward(ids, torch.arange(5)[None], keep=1)
        features = runner.last_features
        runner.truncate(0)
        full = runner.forward(ids, torch.arange(5)[None])
    assert kept.shape[1] == 1 and full.shape[1] == 5 and features.shape[1] == 5
    assert torch.allclose(kept[0, -1], full[0, -1], atol=1e-6)


def test_grouped_attention_is_transformers_eager_attention():
    """:func:`otm.decode.static.grouped_attention` (each key/value head read once for its group of query heads)
    gives transformers' ``eager_attention_forward`` exactly in float64, for one and several queries, batch 1 and 2,
    with a mask; negative control: grouping the query heads the other way round (head j on key/value head j % 3,
    not j // 3) is caught."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    class Attention(torch.nn.Module):
        num_key_value_groups = 3

    module = Attention().eval()
    g = torch.Generator().manual_seed(0)
    for b, q, S in ((1, 1, 16), (2, 4, 16)):
        query = torch.randn(b, 9, q, 8, dtype=torch.float64, generator=g)
        key, value = (torch.randn(b, 3, S, 8, dtype=torch.float64, generator=g) for _ in range(2))
        mask = torch.zeros(1, 1, q, S + 4, dtype=torch.float64)  # longer than the keys: cut to them
        mask[..., 5:9] = torch.finfo(torch.float64).min
        want, want_probs = eager_attention_forward(module, query, key, value, mask[..., :S], 0.3)
        got, probs = static.grouped_attention(module, query, key, value, mask, 0.3)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=1e-12)
        assert torch.allclose(probs, want_probs, rtol=0, atol=1e-12)
        swapped = query.reshape(b, 3, 3, q, 8).transpose(1, 2).reshape(b, 9, q, 8)  # head j on kv head j % 3
        wrong, _ = static.grouped_attention(module, swapped, key, value, mask, 0.3)
        assert (wrong - eager_attention_forward(module, query, key, value, mask[..., :S], 0.3)[0]).abs().max() > 1e-3


def test_a_precompiled_step_reads_a_window_of_the_cache_and_compiles_once(tmp_path, monkeypatch):
    """The precompiled step's attention reads the cache's first ``window(used + padded)`` slots, not all of them (a long
    run's calls cost what they read): one graph, compiled once, takes every window (its mask's width is dynamic), and
    its logits before, at and after each window's edge are those of the same graph reading the whole cache (float64,
    1e-12; both within 1e-5 of the eager model's, whose attention's softmax is float64, not float32). Negative
    control, the realistic off-by-one: a window that leaves out the call's own slot (counted from the committed slots
    only) is caught at the edges."""
    import io

    from otm.decode import precompile
    from otm.decode.runner import Runner

    monkeypatch.setenv("OTM_CACHE", str(tmp_path / "cache"))
    model = _llama(7)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 40, (200,), generator=g).tolist()
    calls_at = [60, 62, 63, 64, 65, 127, 128, 129, 191, 192]  # committed slots before each one-token call
    widths = []
    real_call = precompile.Precompiled.__call__

    def recorded(self, *args, **kwargs):
        widths.append(args[2].shape[-1])
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(precompile.Precompiled, "__call__", recorded)
    said = io.StringIO()

    def logits(window):
        monkeypatch.setattr(static, "window", window)
        widths.clear()
        out = []
        with torch.inference_mode():
            runner = static.StaticRunner(model, "target", capacity=256, buckets=(1,), compile="precompiled",
                                         progress=said)
            for used in calls_at:
                runner.truncate(0)
                runner.feed(tokens[:used])  # eager (larger than the bucket), through the same cache
                out.append(runner.forward(*runner.chain([tokens[used]]))[0, -1])
        return torch.stack(out)

    real = static.window
    whole = logits(lambda needed, capacity: capacity)
    assert widths == [256] * len(calls_at)
    got = logits(real)
    assert widths == [real(used + 1, 256) for used in calls_at] and sorted(set(widths)) == [64, 128, 192, 256]
    assert (got - whole).abs().max() < 1e-12
    assert said.getvalue().count("compiling the target's step for 1 position") == 1  # one graph for every window
    with torch.inference_mode():
        for used, row in zip(calls_at, got):
            eager = Runner(model, "target")
            eager.feed(tokens[:used])
            assert (row - eager.forward(*eager.chain([tokens[used]]))[0, -1]).abs().max() < 1e-5
    off_by_one = logits(lambda needed, capacity: real(needed - 1, capacity))
    assert (off_by_one - whole).abs().max() > 1e-3
