"""Tests of otm.decode.bench's rows and cost model (no timings are asserted: only structure and arithmetic)."""

from __future__ import annotations

import math

import pytest

from otm.decode.bench import (
    Contender, Costs, Row, best_speculative, contenders, format_table, measure_costs, predicted_tokens_per_second,
)
from otm.decode.feature_draft import build_feature_draft

from test_draft_vocab import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_contenders_put_transformers_generate_beside_our_autoregressive_loop():
    names = [c.name for c in contenders([1, 4], [2], ["kseq"])]
    assert names[:3] == ["autoregressive", "hf generate (autoregressive)", "hf assisted (transformers defaults)"]
    assert "hf generate (autoregressive)" not in [c.name for c in contenders([1], [2], ["kseq"], hf=False)]


def test_cost_model_arithmetic():
    c = Costs({1: 50.0, 3: 52.0, 9: 60.0}, {1: 2.0, 4: 3.0}, 100)
    assert c.target(3) == 52.0 and c.target(6) == pytest.approx(56.0)  # measured; linear between 3 and 9
    assert c.target(20) == 60.0  # beyond the largest measured size: that size's cost
    assert c.step_ms(4, 2) == 60.0 + 2.0 + 3.0  # T(1 + 4 * 2) + d(1) + (2 - 1) d(4)
    assert c.step_ms(1, 0) == 50.0
    assert predicted_tokens_per_second(1.0, 1, 0, c) == 20.0
    assert predicted_tokens_per_second(1.8, 4, 2, c) == pytest.approx(1000 * 1.8 / 65.0)
    # with the prefill: each of the runs' first calls is the prompt's forward, the rest are steps
    c = Costs({1: 50.0, 9: 60.0}, {1: 2.0, 4: 3.0}, 100, prefill_ms=300.0, prompt=40, draft_prefill_ms=330.0)
    assert predicted_tokens_per_second(1.0, 1, 0, c, new_tokens=128, runs=2) == pytest.approx(
        1000 * 128 / (2 * 300.0 + 126 * 50.0))
    assert predicted_tokens_per_second(1.6, 4, 2, c, new_tokens=128, runs=2) == pytest.approx(
        1000 * 128 / (2 * 330.0 + (80 - 2) * 65.0))


@pytest.mark.parametrize("kind", ["plain", "feature"])
def test_measure_costs_times_every_requested_call(kind):
    target = tiny_llama(1)
    draft = tiny_llama(2) if kind == "plain" else build_feature_draft(target, seed=3).eval()
    costs = measure_costs(target, draft, [1, 4, 2, 7, 3], [1, 3, 9], [1, 4], repeats=2)
    assert sorted(costs.target_ms) == [1, 3, 9] and sorted(costs.draft_ms) == [1, 4]
    assert all(v > 0 and math.isfinite(v) for v in [*costs.target_ms.values(), *costs.draft_ms.values()])
    assert costs.context == 5


def test_table_has_the_predicted_column_and_the_best_row():
    ar = Row(Contender("autoregressive", "autoregressive"), new_tokens=100, target_calls=100, wall_seconds=5.0,
             cpu_seconds=4.0)
    hf = Row(Contender("hf assisted (transformers defaults)", "hf_assisted"), new_tokens=100, target_calls=70,
             draft_calls=90, wall_seconds=4.0)
    a = Row(Contender("speculative k=1 L=2", "speculative", 1, 2, "speculative", "iid"), new_tokens=100,
            target_calls=60, draft_calls=120, wall_seconds=4.5)
    b = Row(Contender("kseq k=4 L=2", "speculative", 4, 2, "kseq", "iid"), new_tokens=100, target_calls=55,
            draft_calls=110, wall_seconds=3.9, cpu_seconds=2.5)
    costs = Costs({1: 50.0, 3: 52.0, 9: 60.0}, {1: 2.0, 4: 3.0}, 100)
    lines = format_table([ar, hf, a, b], costs).splitlines()
    assert "predicted tokens/s" in lines[0] and lines[0].rstrip(" |").endswith("speedup in CPU time")
    cells = {line.split("|")[1].strip(): [x.strip() for x in line.split("|")[2:-1]] for line in lines[2:]}
    assert cells["autoregressive"][-3] == "20.0"  # 1000 / T(1)
    assert cells["hf assisted (transformers defaults)"][-3] == "-"  # its peer draft's costs are not measured
    assert cells["kseq k=4 L=2"][-3] == f"{1000 * (100 / 55) / 65.0:.1f}"
    assert cells["kseq k=4 L=2"][-2] == f"{(100 / 3.9) / 20.0:.2f}"  # speed-up over autoregressive
    assert cells["kseq k=4 L=2"][-1] == f"{(100 / 2.5) / (100 / 4.0):.2f}"  # the same in CPU seconds
    assert best_speculative([ar, hf, a, b]) is b
    no_costs = format_table([ar, a]).splitlines()[2:]  # without costs: "-" in the predicted column
    assert [line.split("|")[-4].strip() for line in no_costs] == ["-", "-"]


def test_transformers_generate_row_runs_the_same_step():
    """With --compile, transformers' generate row gets a StaticCache of one shape (compiled once, in the run's mode,
    on every device); with none, its growing cache. The static row decodes all its tokens."""
    from otm.decode.bench import HF_CACHE_LEN, _hf_generate, hf_step_options
    from otm.decode.sampling import Sampling

    model = tiny_llama(3)
    assert hf_step_options("none", model, 40) == {}
    static = hf_step_options("static", model, HF_CACHE_LEN + 1)
    assert static["disable_compile"] and static["past_key_values"].get_max_length() == 2 * HF_CACHE_LEN
    compiled = hf_step_options("max-autotune", model, 40)
    assert compiled["compile_config"].mode == "max-autotune" and compiled["compile_config"]._compile_all_devices
    assert compiled["past_key_values"].get_max_length() == HF_CACHE_LEN
    # beside otm's graphs compiled ahead of time, transformers' row gets the same inductor settings (the siblings'
    # GEMMs merged by the same pass); equal configs from call to call (transformers compiles again on a new one),
    # and a pair torch.compile takes (mode or options, not both)
    from otm.decode.precompile import same_calls

    ahead, again = hf_step_options("int4-compiled", model, 40), hf_step_options("int4-compiled", model, 40)
    config = ahead["compile_config"]
    assert config.mode is None and config.options["post_grad_custom_pre_pass"] is same_calls()
    assert config == again["compile_config"] and config._compile_all_devices
    import torch

    twice = torch.compile(lambda x: 2 * x, **config.to_dict())
    assert torch.equal(twice(torch.ones(3)), torch.full((3,), 2.0))
    new, calls, _, _ = _hf_generate(model, [1, 2, 3], Sampling(), 6, None, 0, "static")
    assert new == 6 and calls == 6
