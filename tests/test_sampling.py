"""otm.decode.sampling: the processed next-token law is the law transformers' ``generate`` samples.

``next_token_laws`` runs transformers' own warpers (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``) and a softmax. The first test holds it against ``generate`` itself: with
``output_scores`` and ``output_logits``, ``generate(do_sample=True, ...)`` returns each step's raw
logits and the processed scores it samples from, and ``softmax(scores)`` must equal
``next_token_laws(logits)`` bit for bit in float32. The planted bug there is top-p applied before the
temperature (the order some samplers use): a different law, which the same comparison must reject.
The other tests pin the boundary cases (ties at the top-k and top-p boundaries, a top-p below the
largest mass, where ``min_tokens_to_keep = 1`` keeps one token) against warpers built by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from otm.decode.sampling import Sampling, next_token_laws
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SETTINGS = [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.8), (0.5, 20, 0.9), (1.0, 1, 1.0), (0.9, 0, 1e-6)]


def by_hand(logits: torch.Tensor, t: float, k: int, p: float) -> torch.Tensor:
    """softmax after the warpers ``generate`` builds for one beam (its ``_get_logits_processor``)."""
    warpers = LogitsProcessorList()
    if t != 1.0:
        warpers.append(TemperatureLogitsWarper(t))
    if k != 0:
        warpers.append(TopKLogitsWarper(top_k=k, min_tokens_to_keep=1))
    if p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=p, min_tokens_to_keep=1))
    return torch.softmax(warpers(None, logits.clone()), -1)


def _generate_steps(t, k, p, *, seed=0, V=64, steps=6):
    """(raw logits, processed scores) of each step of ``generate(do_sample=True)`` on a tiny random Llama."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    out = model.generate(torch.tensor([[1, 2, 3]]), do_sample=True, temperature=t, top_k=k, top_p=p,
                         max_new_tokens=steps, min_new_tokens=steps,
                         output_scores=True, output_logits=True, return_dict_in_generate=True)
    return out.logits, out.scores


@pytest.mark.parametrize("t, k, p", SETTINGS)
def test_the_law_is_the_one_generate_samples_bit_for_bit(t, k, p):
    logits, scores = _generate_steps(t, k, p)
    sampling = Sampling(temperature=t, top_k=k, top_p=p)
    for raw, processed in zip(logits, scores):
        law = next_token_laws(raw, sampling, dtype=torch.float32)  # [1, V]
        assert torch.equal(law, torch.softmax(processed, -1))
        assert torch.equal(law == 0, torch.isneginf(processed))  # removed tokens: mass 0.0 exactly


def test_planted_top_p_before_the_temperature_is_caught():
    """Negative control for the comparison above: top-p cut on the untempered law, then the temperature."""
    t, p = 0.5, 0.9
    logits, scores = _generate_steps(t, 0, p)
    caught = 0
    for raw, processed in zip(logits, scores):
        kept = torch.softmax(TopPLogitsWarper(p)(None, raw.clone()), -1) > 0
        wrong = torch.softmax((raw / t).masked_fill(~kept, -math.inf), -1)
        caught += not torch.equal(wrong, torch.softmax(processed, -1))
    assert caught >= 3, caught  # of 6 steps


def test_ties_at_the_boundaries_and_a_tiny_top_p_follow_transformers():
    """Ties at the top-k boundary are all kept; ties at the top-p boundary are split as transformers'
    ``torch.sort`` splits them; a top-p below the largest mass keeps exactly the top token."""
    log = torch.log(torch.tensor([[0.4, 0.3, 0.3], [0.2, 0.5, 0.3]], dtype=torch.float64))
    law = next_token_laws(log, Sampling(top_p=0.5), dtype=torch.float64)
    assert (law > 0).sum(-1).tolist() == [2, 1]  # row 0: one of the tied pair crosses 0.5; row 1: 0.5 alone reaches it
    assert torch.equal(law, by_hand(log, 1.0, 0, 0.5))
    tk = next_token_laws(torch.tensor([[2.0, 1.0, 1.0, 0.0]]), Sampling(top_k=2))
    assert (tk > 0).tolist() == [[True, True, True, False]]  # the tie at the k-th logit is kept
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(16, 1000, generator=g) * 3).to(torch.bfloat16).float()  # bf16 logits: many ties
    assert (x[:, :, None] == x[:, None, :]).sum() > 16 * 1000  # there are ties
    for t, k, p in SETTINGS + [(1.0, 0, 0.95), (0.8, 2000, 0.5)]:
        s = Sampling(temperature=t, top_k=k, top_p=p)
        for dtype in (torch.float32, torch.float64):
            assert torch.equal(next_token_laws(x, s, dtype=dtype), by_hand(x.to(dtype), t, k, p)), (t, k, p, dtype)
    kept = next_token_laws(x, Sampling(top_p=0.95), dtype=torch.float64) > 0
    split = [bool(set(x[r][kept[r]].tolist()) & set(x[r][~kept[r]].tolist())) for r in range(16)]
    assert sum(split) >= 3  # rows where a tie straddles the top-p boundary: the case compared above
    tiny = next_token_laws(x, Sampling(top_p=1e-9), dtype=torch.float64)
    assert torch.equal(tiny, torch.zeros_like(tiny).scatter_(-1, x.argmax(-1, keepdim=True), 1.0))


def test_shapes_dtypes_and_greedy():
    x = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(1))
    s = Sampling(temperature=0.8, top_k=3, top_p=0.9)
    law = next_token_laws(x, s, dtype=torch.float64)  # [2, 3, 7]: any leading shape
    assert law.shape == (2, 3, 7) and law.dtype == torch.float64
    assert torch.equal(law, next_token_laws(x.reshape(6, 7), s, dtype=torch.float64).reshape(2, 3, 7))
    torch.testing.assert_close(law.sum(-1), torch.ones(2, 3, dtype=torch.float64), rtol=0, atol=1e-15)
    greedy = next_token_laws(torch.tensor([[0.0, 3.0, 3.0]]), Sampling(temperature=0))
    assert greedy.tolist() == [[0.0, 1.0, 0.0]]  # the first maximum, as generate's argmax
    with pytest.raises(OtmError, match="law dtype"):
        next_token_laws(x, s, dtype=torch.float16)
