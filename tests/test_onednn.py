"""``--compile onednn`` (otm.decode.onednn): the models' float32 linear layers on oneDNN.

* :class:`OneDnnLinear` gives ``nn.Linear``'s outputs up to float32 rounding (2-D and 3-D inputs, with and
  without bias), keeps the dense weight (tied weights, ``get_output_embeddings``), and the undo puts the very
  modules back (bit-identical outputs after it);
* the decoder on swapped tiny Llamas at temperature 0 gives the tokens of the unswapped models, and the
  feature hooks, caches and rollbacks work through the swapped head;
* ``measure_costs(compile="onednn")`` times the swapped models and leaves them as they were;
* models oneDNN cannot take (float64, or a planted non-float32 layer) are left alone;
* sibling projections (q/k/v, gate/up) fused into one GEMM give each its own columns, and a sibling called with
  another input computes its own; only Llama's RMSNorm (and its copies) gets the fused norm.
"""

from __future__ import annotations

import pytest
import torch

from otm.decode import autoregressive_decode, speculative_decode
from otm.decode.bench import measure_costs
from otm.decode.onednn import POINTWISE, FusedLinear, OneDnnLinear, available, dtypes, for_choice, use_onednn

ON = (OneDnnLinear, FusedLinear)  # a layer on oneDNN: alone, or one of fused siblings
from otm.decode.sampling import Sampling
from otm.laws import OtmError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_llama(seed: int, V: int = 48, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.5, tie_word_embeddings=tie,
                      attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("pointwise", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 40), (1, 5, 40), (2, 1, 40)])
def test_onednn_linear_is_linear_up_to_rounding(bias, shape, pointwise, monkeypatch):
    """Both of its paths: the prepacked pointwise op, and oneDNN tensors where a torch lacks that op."""
    import otm.decode.onednn as onednn

    monkeypatch.setattr(onednn, "POINTWISE", pointwise and onednn.POINTWISE)
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 70, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = lin(x), OneDnnLinear(lin)(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.bfloat16 not in dtypes(),
                    reason="oneDNN computes no bfloat16 on this CPU")
def test_bfloat16_layers_are_swapped_where_onednn_computes_them():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, dtype=torch.bfloat16)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        want, got = lin(x), OneDnnLinear(lin)(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)  # bfloat16: 8 bits of mantissa
    m = tiny_llama(0).to(torch.bfloat16)
    norms = sum(type(x).__name__ == "LlamaRMSNorm" for x in m.modules())
    assert available(m) and use_onednn(m).count == sum(isinstance(x, ON) for x in m.modules()) + norms > norms
    assert OneDnnLinear(lin).weight is lin.weight  # the dense weight is shared, not copied


def test_swap_and_undo_on_a_model_with_tied_head():
    m = tiny_llama(0, tie=True)
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.inference_mode():
        before = m(ids).logits
    n_linear = sum(type(x) is torch.nn.Linear for x in m.modules())
    n_norms = sum(type(x).__name__ == "LlamaRMSNorm" for x in m.modules())
    undo = use_onednn(m)
    assert undo.count == n_linear + n_norms and not any(type(x) is torch.nn.Linear for x in m.modules())
    assert all("forward" in x.__dict__ for x in m.modules() if type(x).__name__ == "LlamaRMSNorm")  # fused norms
    assert isinstance(m.get_output_embeddings(), OneDnnLinear)
    assert m.get_output_embeddings().weight is m.get_input_embeddings().weight  # still tied
    ran = []
    hooks = [x.register_forward_hook(lambda *_: ran.append(1)) for x in m.modules() if isinstance(x, ON)]
    with torch.inference_mode():
        swapped = m(ids).logits
    for h in hooks:
        h.remove()
    torch.testing.assert_close(swapped, before, rtol=1e-4, atol=1e-4)
    assert len(ran) == n_linear  # every layer went through oneDNN
    undo()
    assert sum(type(x) is torch.nn.Linear for x in m.modules()) == n_linear
    assert not any("forward" in x.__dict__ for x in m.modules())
    with torch.inference_mode():
        assert torch.equal(m(ids).logits, before)  # the very modules are back


def test_models_onednn_cannot_take_are_left_alone():
    m = tiny_llama(0).double()
    assert not available(m) and use_onednn(m, None).count == 0
    assert for_choice("none", tiny_llama(1)).count == 0  # only the onednn choice swaps
    with pytest.raises(OtmError, match="--compile onednn swaps the linear layers"):  # asked for, nothing to swap
        for_choice("onednn", m)
    spread = tiny_llama(2)
    spread.hf_device_map = {"model": "cpu", "lm_head": "disk"}  # accelerate's placement (--device-map)
    assert not available(spread) and use_onednn(spread).count == 0
    hooked = tiny_llama(3)
    hooked.lm_head._hf_hook = object()  # a layer accelerate moves in and out: left alone, the others swapped
    use_onednn(hooked)
    assert type(hooked.lm_head) is torch.nn.Linear and isinstance(hooked.model.layers[0].mlp.down_proj, OneDnnLinear)


def test_decoder_on_swapped_models_gives_the_same_greedy_tokens():
    """Temperature 0: every choice is the argmax, so the GEMM's rounding cannot move a token (random weights:
    no near-ties here); both rollbacks, the walk, the caches and the bonus go through the swapped layers."""
    greedy = Sampling(temperature=0.0)
    target, draft = tiny_llama(0), tiny_llama(1)
    prompt = [3, 1, 4, 1, 5]
    runs = lambda: [speculative_decode(target, draft, prompt, k=3, length=3, verifier="kseq", sampling=greedy,
                                       max_new_tokens=20, seed=0, target_rollback=r).tokens for r in ("gather", "refeed")] + \
        [autoregressive_decode(target, prompt, sampling=greedy, max_new_tokens=20, seed=0).tokens]
    want = runs()
    undo = use_onednn(target, draft)
    got = runs()
    undo()
    assert got == want and len(want[0]) == 20


def test_measure_costs_on_onednn_leaves_the_models_as_they_were():
    target, draft = tiny_llama(0), tiny_llama(1)
    costs = measure_costs(target, draft, [1, 2, 3, 4], [1, 4], [1, 2], repeats=1, compile="onednn")
    assert set(costs.target_ms) == {1, 4} and all(v > 0 for v in costs.target_ms.values())
    assert all(type(x) is not OneDnnLinear for m in (target, draft) for x in m.modules())


def test_a_feature_draft_and_a_subset_head_use_onednn_and_decode_the_same():
    """The feature draft's head and the draft-vocabulary subset head (F.linear on a weight, not an nn.Linear) get
    oneDNN copies: same logits up to rounding, the same greedy tokens (the capture hook on the swapped target
    head still feeds the draft), and the undo removes them."""
    from otm.decode.draft_vocab import restrict_draft
    from otm.decode.feature_draft import build_feature_draft

    target = tiny_llama(3, V=40)
    draft = build_feature_draft(target, seed=4).eval()
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad and p.ndim == 2:
                p.normal_(0, 0.4)
    whole = use_onednn(draft)  # over the whole vocabulary the draft's own head gets the copy
    assert "onednn_linear" in draft.__dict__
    with torch.inference_mode():
        torch.testing.assert_close(draft.logits(torch.ones(1, 32)), torch.ones(1, 32) @ draft.head.T, rtol=1e-5, atol=1e-5)
    whole()
    assert "onednn_linear" not in draft.__dict__
    restrict_draft(draft, 30, torch.arange(40).flip(0))
    h = torch.randn(2, 32)
    greedy = Sampling(temperature=0.0)
    run = lambda: speculative_decode(target, draft, [5, 6, 7], k=2, length=3, sampling=greedy, max_new_tokens=16,
                                     seed=0).tokens
    with torch.inference_mode():
        want_logits, want = draft.logits(h), run()
    undo = use_onednn(target, draft)
    assert "onednn_linear" in draft.subset_head.__dict__ and "onednn_linear" not in draft.__dict__  # (head unused)
    with torch.inference_mode():
        got_logits, got = draft.logits(h), run()
    undo()
    assert "onednn_linear" not in draft.subset_head.__dict__ and "onednn_linear" not in draft.__dict__
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isinf(got_logits), torch.isinf(want_logits)) and got == want


def test_sibling_projections_fused_give_each_its_own_columns():
    """q/k/v and gate/up as one GEMM: each sibling's output equals its own ``nn.Linear``'s (float32 rounding); a
    sibling called with another input than the first (a stale cache would hand it the first input's columns)
    computes its own; a group that differs in width or bias is left as separate layers."""
    m = tiny_llama(0)
    attn, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
    originals = {n: getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj")}
    originals.update({n: getattr(mlp, n) for n in ("gate_proj", "up_proj")})
    x, y = torch.randn(1, 3, 32), torch.randn(1, 3, 32)
    with torch.inference_mode():
        want = {n: lin(x) for n, lin in originals.items()}
        other = originals["k_proj"](y)
    undo = use_onednn(m)
    assert all(isinstance(getattr(attn, n), FusedLinear) for n in ("q_proj", "k_proj", "v_proj"))
    assert attn.k_proj.packed is attn.q_proj.packed and mlp.up_proj.packed is mlp.gate_proj.packed
    assert attn.o_proj.__class__ is OneDnnLinear  # no sibling: alone
    with torch.inference_mode():
        got = {n: getattr(attn, n)(x) for n in ("q_proj", "k_proj", "v_proj")}
        got.update({n: getattr(mlp, n)(x) for n in ("gate_proj", "up_proj")})
        assert attn.k_proj.last.x is x  # the siblings read the first's output: one GEMM
        torch.testing.assert_close(attn.k_proj(y), other, rtol=1e-5, atol=1e-5)  # another input: its own
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-5)
    undo()
    assert all(getattr(attn if n[0] in "qkv" else mlp, n) is lin for n, lin in originals.items())
    odd = tiny_llama(1)
    odd.model.layers[0].mlp.up_proj = torch.nn.Linear(32, 64, bias=True)  # bias on one sibling only
    use_onednn(odd)
    assert isinstance(odd.model.layers[0].mlp.up_proj, OneDnnLinear)  # swapped alone, not fused
    assert isinstance(odd.model.layers[1].mlp.up_proj, FusedLinear)


def test_only_llamas_rms_norm_is_fused():
    """The fused RMSNorm replaces exactly transformers' Llama forward (and its word-for-word copies): its output
    within float32 rounding; a norm computing something else (Gemma's 1 + weight) is left alone."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    torch.manual_seed(0)
    x = torch.randn(2, 5, 32) * 3
    for cls, fused in ((LlamaRMSNorm, True), (Qwen2RMSNorm, True), (GemmaRMSNorm, False)):
        norm = cls(32, eps=1e-6)
        with torch.no_grad():
            norm.weight.normal_()
        parent = torch.nn.Sequential(norm, torch.nn.Linear(32, 4))
        with torch.inference_mode():
            want = norm(x)
            undo = use_onednn(parent)
            assert ("forward" in norm.__dict__) is fused, cls.__name__
            torch.testing.assert_close(norm(x), want, rtol=1e-6, atol=1e-6)
        undo()
        assert "forward" not in norm.__dict__


def test_fuse_false_swaps_every_layer_alone():
    """``use_onednn(..., fuse=False)`` (the A/B of analysis/onednn_fused_ab.py): every linear a OneDnnLinear, no
    norm replaced, and the same outputs as the fused swap up to rounding."""
    alone, fused = tiny_llama(0), tiny_llama(0)
    n_linear = sum(type(x) is torch.nn.Linear for x in alone.modules())
    assert use_onednn(alone, fuse=False).count == n_linear
    assert not any(isinstance(x, FusedLinear) or "forward" in x.__dict__ for x in alone.modules())
    use_onednn(fused)
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.inference_mode():
        torch.testing.assert_close(alone(ids).logits, fused(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not POINTWISE, reason="the prepacked path (torch.ops.mkldnn._linear_pointwise)")
def test_a_compiled_graph_names_prepacked_weights_by_their_content():
    """The handle a compiled graph passes to ``otm::packed_linear`` is a digest of the weights: the same in every
    swap of the same weights (so inductor's kernel cache finds the graph in the next process), different for other
    weights; a handle held by two modules still resolves when one of them is gone. Traced, the swapped model gives
    the eager swapped model's logits."""
    import copy
    import gc

    from otm.decode import onednn

    a = tiny_llama(3)
    b = copy.deepcopy(a)
    c = tiny_llama(4)
    for m in (a, b, c):
        use_onednn(m)
    handles = [[x.handle for x in m.modules() if isinstance(x, ON)] for m in (a, b, c)]
    assert handles[0] == handles[1] and not set(handles[0]) & set(handles[2])
    assert len(set(handles[0])) == 2 * 4 + 1  # per layer q/k/v, o, gate/up, down; and the head
    del b
    gc.collect()
    ids = torch.tensor([[1, 5, 9, 2]])
    torch._dynamo.reset()
    with torch.inference_mode():
        want = a(ids).logits
        got = torch.compile(lambda x: a(x).logits, backend="aot_eager", dynamic=False)(ids)
    assert all(onednn._holder(h) is not None for h in handles[0])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
