"""Tests of the distillation losses of analysis/train_draft.py (no model is loaded).

The top-k loss coarsens both laws to the target's top-k tokens plus one tail cell: with k = V it
must be the exact full-vocabulary KL and acceptance, and with k < V the coarsened KL can only be
smaller (data processing) and the coarsened acceptance sum min(target, draft) only larger
(min(a + b, c + d) >= min(a, c) + min(b, d)). The acceptance term used by ``--tv-weight`` must
carry a gradient that raises the acceptance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from train_draft import kl_and_acceptance, topk_kl_and_acceptance  # noqa: E402


def _laws(n=6, v=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    target_logits = 2.0 * torch.randn(n, v, generator=g, dtype=torch.float64)
    draft_logits = 2.0 * torch.randn(n, v, generator=g, dtype=torch.float64)
    return target_logits, draft_logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topk_loss_with_every_token_is_the_exact_loss(seed):
    t_logits, d_logits = _laws(seed=seed)
    p = torch.softmax(t_logits, -1)
    top_p, top_i = p.topk(p.shape[1], dim=-1)
    kl_k, acc_k = topk_kl_and_acceptance(d_logits, top_p, top_i)
    kl, acc = kl_and_acceptance(d_logits, t_logits)
    assert abs(kl_k.item() - kl.item()) < 1e-6
    assert abs(acc_k.item() - acc.item()) < 1e-9


@pytest.mark.parametrize("k", [1, 5, 20])
def test_topk_loss_bounds_the_exact_loss(k):
    t_logits, d_logits = _laws(seed=k)
    p = torch.softmax(t_logits, -1)
    top_p, top_i = p.topk(k, dim=-1)
    kl_k, acc_k = topk_kl_and_acceptance(d_logits, top_p, top_i)
    kl, acc = kl_and_acceptance(d_logits, t_logits)
    assert kl_k.item() <= kl.item() + 1e-9
    assert acc_k.item() >= acc.item() - 1e-12
    assert acc_k.item() < 1.0


def test_acceptance_term_has_an_ascent_gradient():
    """One small step along the gradient of the acceptance raises the exact acceptance."""
    t_logits, d_logits = _laws(seed=7)
    d_logits = d_logits.clone().requires_grad_(True)
    p = torch.softmax(t_logits, -1)
    top_p, top_i = p.topk(10, dim=-1)
    _, acc = topk_kl_and_acceptance(d_logits, top_p, top_i)
    assert acc.requires_grad
    acc.backward()
    assert d_logits.grad.abs().sum() > 0
    with torch.no_grad():
        before = kl_and_acceptance(d_logits, t_logits)[1].item()
        after = kl_and_acceptance(d_logits + 0.5 * d_logits.grad, t_logits)[1].item()
    assert after > before


# --- self-speculative drafts: the target's first layers, shared (tiny models) -----------------


def _tiny_target(layers=3, intermediate=32, seed=0):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=48, hidden_size=16, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def test_shared_layer_draft_saves_only_its_own_layers_and_loads_onto_the_targets(tmp_path):
    """build_shared_draft(share_layers=2) + save + otm.models.load_draft: the file holds only the
    trained layer and norm, the loaded draft uses the target's own Parameters for layers 0-1 and
    its embedding, and computes the same logits as the draft that was trained."""
    from safetensors.torch import load_file, save_file
    from train_draft import build_shared_draft, save

    from otm.models import SHARED_LAYERS_KEY, load_draft

    target = _tiny_target()
    draft = build_shared_draft(target, [0, 1, 2], 32, share_layers=2)
    assert [any(p.requires_grad for p in layer.parameters()) for layer in draft.model.layers] == [False, False, True]
    with torch.no_grad():  # the trained layer moves away from the target's layer 2
        for p in draft.model.layers[2].parameters():
            p.add_(0.1 * torch.randn_like(p))
    save(draft, tmp_path / "d", save_file)
    stored = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert stored and all(k.startswith(("model.layers.2.", "model.norm.")) for k in stored), sorted(stored)
    assert json.loads((tmp_path / "d" / "config.json").read_text())[SHARED_LAYERS_KEY] == 2

    loaded = load_draft(tmp_path / "d", target)
    assert loaded.model.layers[1].mlp.down_proj.weight is target.model.layers[1].mlp.down_proj.weight
    assert loaded.model.layers[0].self_attn.q_proj.weight is target.model.layers[0].self_attn.q_proj.weight
    assert loaded.model.layers[2].mlp.up_proj.weight is not target.model.layers[2].mlp.up_proj.weight
    ids = torch.randint(0, 48, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = loaded(input_ids=ids).logits
        want = draft.eval()(input_ids=ids).logits
        plain_target = target(input_ids=ids).logits
    # fp16 storage of the trained layer: close, not equal; and not the target itself
    assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()
    assert not torch.allclose(got, plain_target, atol=1e-2)


def test_shared_layer_draft_refuses_a_target_that_cannot_give_the_layers(tmp_path):
    from safetensors.torch import save_file
    from train_draft import build_shared_draft, save

    from otm.laws import OtmError
    from otm.models import load_draft

    save(build_shared_draft(_tiny_target(), [0, 1, 2], 32, share_layers=2), tmp_path / "d", save_file)
    with pytest.raises(OtmError) as exc:  # another MLP width: layer shapes differ
        load_draft(tmp_path / "d", _tiny_target(intermediate=40))
    assert "\n" not in str(exc.value) and "layer 0" in str(exc.value)
    with pytest.raises(OtmError) as exc:  # too few layers
        load_draft(tmp_path / "d", _tiny_target(layers=1))
    assert "\n" not in str(exc.value) and "first 2 layers" in str(exc.value)


def test_shared_layers_must_be_the_first_layers_at_the_targets_width():
    from train_draft import build_shared_draft

    with pytest.raises(SystemExit, match="start with 0"):
        build_shared_draft(_tiny_target(), [1, 2], 32, share_layers=1)
    with pytest.raises(SystemExit, match="--intermediate 32"):
        build_shared_draft(_tiny_target(), [0, 1], 16, share_layers=1)


def test_decoding_with_a_shared_layer_draft_equals_decoding_with_an_unshared_copy(tmp_path):
    """The draft and the target share layer Parameters but never caches: the decoder gives the
    same tokens with the loaded (shared) draft as with a deep copy that shares nothing, and the
    target's weights are untouched."""
    import copy

    from safetensors.torch import save_file
    from train_draft import build_shared_draft, save

    from otm.decode import Sampling, speculative_decode
    from otm.models import load_draft

    target = _tiny_target(layers=3)
    draft = build_shared_draft(target, [0, 1, 2], 32, share_layers=2)
    with torch.no_grad():
        for p in draft.model.layers[2].parameters():
            p.add_(0.2 * torch.randn_like(p))
    save(draft, tmp_path / "d", save_file)
    shared = load_draft(tmp_path / "d", target)
    assert shared.model.layers[0].self_attn.k_proj.weight is target.model.layers[0].self_attn.k_proj.weight
    unshared = copy.deepcopy(shared)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    ids = torch.tensor([[1, 5, 9, 3]])
    runs = [speculative_decode(target, d, ids, k=3, length=3, verifier="kseq", scheme="iid",
                               sampling=Sampling(temperature=1.0, top_k=0, top_p=1.0),
                               max_new_tokens=20, eos_token_id=None, seed=7)
            for d in (shared, unshared)]
    assert len(runs[0].tokens) == 20
    assert list(runs[0].tokens) == list(runs[1].tokens)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_data_directory_meta_refuses_other_settings_and_accepts_older_files(tmp_path):
    from train_draft import check_meta

    path = tmp_path / "meta.json"
    meta = dict(seed=0, prompt_set="self", self=dict(query_tokens=96, min_chars=12, oversample=1.5))
    check_meta(path, meta)  # no file yet: fine
    path.write_text(json.dumps(dict(seed=0, prompt_set="self")))  # written before "self" existed
    check_meta(path, meta)
    path.write_text(json.dumps(meta))
    check_meta(path, meta)
    changed = dict(meta, self=dict(query_tokens=64, min_chars=12, oversample=1.5))
    with pytest.raises(SystemExit) as exc:
        check_meta(path, changed)
    msg = str(exc.value)
    assert "\n" not in msg and "query_tokens" in msg and "other settings" in msg
