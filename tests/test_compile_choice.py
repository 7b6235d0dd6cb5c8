"""``--compile auto`` (otm.decode.compile_choice): the cost model's choice between the eager and the compiled
static-shape step, measured once per machine, models and shape and kept in the user cache.

The timing itself is the bench's (``measure_costs``, tested in test_bench / test_static_step); here it is
replaced by given costs, so the decision rule, the cache and the wiring into the CLI are checked exactly."""

from __future__ import annotations

import json

import pytest
import torch

from otm.decode import compile_choice
from otm.decode.bench import Costs, measure_costs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _tiny_llama(seed: int, V: int = 8):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OTM_CACHE", str(tmp_path))
    return tmp_path


def _fake_costs(eager: float, compiled: float, calls: list, onednn: float | None = None, int4: float | None = None,
                int4_compiled: float | None = None):
    """measure_costs' stand-in: T(n) and d(b) of ``eager`` ms each with compile none, ``onednn`` (default: the
    eager figure) with the linear layers on oneDNN, ``int4`` (default: the eager figure) on the GGUF's 4-bit
    blocks, ``int4_compiled`` (default: the eager figure) on those compiled ahead of time, ``compiled`` otherwise."""

    def fake(target, draft, context, sizes, batches, *, compile="none", **kw):
        calls.append(compile)
        swapped = {"onednn": onednn, "int4": int4, "int4-compiled": int4_compiled}
        ms = (eager if compile == "none" else (eager if swapped[compile] is None else swapped[compile])
              if compile in swapped else compiled)
        return Costs({n: ms for n in sizes}, {b: ms / 10 for b in batches}, len(context))

    return fake


def test_a_short_decode_is_not_worth_compiling(cache):
    """A toy model's whole decode takes milliseconds: none, without timing the compiled step or keeping anything."""
    t, d = _tiny_llama(0), _tiny_llama(1)
    picked = compile_choice.choose(t, d, [1, 2, 3], measure=measure_costs, k=2, length=2, new_tokens=8)
    assert picked.choice == "none" and "under 2 s" in picked.line and "\n" not in picked.line
    assert not (cache / compile_choice.FILE).exists()


def test_the_faster_step_is_chosen_and_kept(cache):
    t, d = _tiny_llama(0), _tiny_llama(1)
    calls = []
    fake = _fake_costs(eager=100.0, compiled=60.0, calls=calls)
    picked = compile_choice.choose(t, d, [1, 2, 3], measure=fake, k=4, length=2, new_tokens=64)
    assert picked.choice == "default" and calls == ["none", "onednn", "default"]
    # T(9) + d(1) + d(4): 100 + 10 + 10
    assert "eager 120.0 ms, eager with oneDNN linears 120.0 ms, compiled (default) 72.0 ms" in picked.line
    kept = json.loads((cache / compile_choice.FILE).read_text())
    assert [e["choice"] for e in kept.values()] == ["default"]
    # the same machine, models and shape: read back, nothing measured again
    again = compile_choice.choose(t, d, [1, 2, 3], measure=fake, k=4, length=2, new_tokens=64)
    assert again.choice == "default" and calls == ["none", "onednn", "default"] and "kept in" in again.line
    # another shape is another decision
    compile_choice.choose(t, d, [1, 2, 3], measure=fake, k=2, length=3, new_tokens=64)
    assert calls == ["none", "onednn", "default"] * 2 and len(json.loads((cache / compile_choice.FILE).read_text())) == 2


def test_a_compiled_step_within_the_noise_is_not_chosen(cache):
    """Negative control of the rule: compiled 3 % faster (inside MARGIN = 5 %) stays eager."""
    t, d = _tiny_llama(0), _tiny_llama(1)
    fake = _fake_costs(eager=100.0, compiled=97.0, calls=[])
    assert compile_choice.choose(t, d, [1, 2], measure=fake, k=1, length=0, new_tokens=64).choice == "none"
    fake = _fake_costs(eager=100.0, compiled=94.0, calls=[])
    assert compile_choice.choose(t, d, [1, 2], measure=fake, k=1, length=1, new_tokens=64).choice == "default"


def test_the_key_names_what_the_decision_depends_on():
    t, d = _tiny_llama(0), _tiny_llama(1)
    base = compile_choice.key(t, d, k=2, length=2, delay=0, device="cpu")
    assert "LlamaForCausalLM" in base and torch.__version__ in base and "machine:" in base
    assert base != compile_choice.key(t, d, k=2, length=3, delay=0, device="cpu")
    assert base != compile_choice.key(t, d.to(torch.float64), k=2, length=2, delay=0, device="cpu")


def test_auto_must_be_resolved_before_the_run():
    from otm.decode.steps import COMPILE_CHOICES, compile_options

    assert "auto" in COMPILE_CHOICES and compile_options("none") == {}
    with pytest.raises(ValueError, match="resolved"):
        compile_options("auto")


def test_the_cli_says_the_choice_when_asked(tmp_path, capsys, cache):
    """``otm decode``'s default says nothing about a toy decode; ``--compile auto`` given says what it chose."""
    from test_decode import _save_pair

    from otm.cli import main

    target, draft = _save_pair(tmp_path)
    models = ["--target", target, "--draft", draft, "--no-progress", "--max-new-tokens", "4"]
    assert main(["decode", "--prompt", "a b c", "-k", "2", "--length", "2", *models]) == 0
    assert "compile auto" not in capsys.readouterr().err
    assert main(["decode", "--prompt", "a b c", "-k", "2", "--length", "2", "--compile", "auto", *models]) == 0
    assert "compile auto: none (the whole decode takes about" in capsys.readouterr().err


def test_the_eager_step_on_onednn_is_chosen_when_fastest(cache):
    """oneDNN's linears 40 % faster, the compiled step 10 %: onednn; oneDNN within the noise: the compiled step."""
    t, d = _tiny_llama(0), _tiny_llama(1)
    calls = []
    picked = compile_choice.choose(t, d, [1, 2, 3], measure=_fake_costs(100.0, 90.0, calls, onednn=60.0), k=4, length=2,
                                   new_tokens=64)
    assert picked.choice == "onednn" and calls == ["none", "onednn", "default"]
    assert compile_choice.choose(t, d, [1, 2], measure=_fake_costs(100.0, 90.0, [], onednn=97.0), k=2, length=1,
                                 new_tokens=64).choice == "default"


def test_onednn_is_not_timed_for_models_it_cannot_take(cache):
    """A float64 model (oneDNN's swap takes float32 CPU models only) is timed eager and compiled only."""
    t, d = _tiny_llama(0).double(), _tiny_llama(1).double()
    calls = []
    compile_choice.choose(t, d, [1, 2, 3], measure=_fake_costs(100.0, 60.0, calls), k=2, length=2, new_tokens=64)
    assert calls == ["none", "default"]


def test_the_ggufs_4bit_blocks_are_timed_where_the_target_has_them(cache, monkeypatch):
    """A target the 4-bit swap takes (here: declared so) is timed on it too, and chosen when fastest; the choice
    and its line name it."""
    from otm.decode import int4

    monkeypatch.setattr(int4, "available", lambda model: model is t)
    t, d = _tiny_llama(0), _tiny_llama(1)
    calls = []
    picked = compile_choice.choose(t, d, [1, 2, 3], measure=_fake_costs(100.0, 90.0, calls, onednn=70.0, int4=50.0),
                                   k=1, length=2, new_tokens=64)
    assert picked.choice == "int4" and calls == ["none", "onednn", "int4", "int4-compiled", "default"]
    assert "eager on the GGUF's 4-bit blocks 50.0 ms" in picked.line
    calls.clear()
    assert compile_choice.choose(t, d, [1, 2, 3], measure=_fake_costs(100.0, 90.0, calls, onednn=70.0, int4=80.0),
                                 k=2, length=2, new_tokens=64).choice == "onednn"
    assert "int4" in calls
    # the same models compiled ahead of time, faster still: chosen, and named in the line
    calls.clear()
    picked = compile_choice.choose(t, d, [1, 2, 3], measure=_fake_costs(100.0, 90.0, calls, onednn=70.0, int4=50.0,
                                                                        int4_compiled=40.0), k=2, length=1, new_tokens=64)
    assert picked.choice == "int4-compiled" and "the 4-bit blocks compiled ahead of time 40.0 ms" in picked.line
    calls.clear()  # a target without 4-bit blocks: neither is timed
    monkeypatch.setattr(int4, "available", lambda model: False)
    compile_choice.choose(t, d, [1, 2, 3], measure=_fake_costs(100.0, 90.0, calls, int4_compiled=10.0), k=2,
                          length=3, new_tokens=64)
    assert "int4" not in calls and "int4-compiled" not in calls
