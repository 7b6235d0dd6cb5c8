"""``--compile int4`` (otm.decode.int4): the target's block layers on its GGUF's own 4-bit weights.

* the blocks are read as GGML lays them out (both 4-bit formats), dequantised bit for bit as the GGUF reader
  transformers loads with (``gguf.quants.dequantize``), and the query/key rows reordered as transformers does;
* :class:`Int4Linear` computes the blocks' weights with bfloat16 group scales and zeros, to bfloat16 rounding, and
  each row the same whether a call computes 1 or 9 rows (bit for bit): one run is one model;
* on a tiny Llama whose weights are a tiny GGUF's, the swap fuses siblings, gives the dense bfloat16 model's
  logits up to rounding, decodes, and undoes exactly; a float32 target keeps float32 around the kernel; a target
  that is not the file's conversion (one weight changed), a block format the kernel does not run, a float64
  target and an unknown GGUF are refused in one line;
* the bench's cost model times the swapped target and leaves it as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from otm.decode import int4
from otm.decode.siblings import LastCall
from otm.laws import OtmError

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not int4.OP, reason="this torch has no 4-bit CPU GEMM")]


def pack(q: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """GGML's bytes of Q4_1 blocks (Q4_0 when ``m`` is None): per block d (float16), m, then byte j = q[j] | q[j+16] << 4."""
    n, k = q.shape
    qb = q.reshape(n, k // 32, 32).astype(np.uint8)
    nib = qb[..., :16] | (qb[..., 16:] << 4)
    parts = [d.astype(np.float16)[..., None].view(np.uint8)]
    if m is not None:
        parts.append(m.astype(np.float16)[..., None].view(np.uint8))
    return np.concatenate(parts + [nib], axis=-1).reshape(n, -1)


def random_blocks(rng, n: int, k: int, kind: int):
    q = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.03, size=(n, k // 32)) * rng.choice([-1, 1], size=(n, k // 32))).astype(np.float16)
    # centred blocks (m near -8 d, as a quantiser's minimum is): the layers' outputs then depend on their inputs
    m = None if kind == int4.Q4_0 else (-8.0 * d + rng.normal(0.0, 0.003, size=d.shape)).astype(np.float16)
    return q, d, m


@pytest.mark.parametrize("kind", [int4.Q4_0, int4.Q4_1])
def test_blocks_read_and_dequantised_as_ggufs_own_reader(kind):
    import gguf

    rng = np.random.default_rng(kind)
    q, d, m = random_blocks(rng, 24, 96, kind)
    raw = pack(q, d, m)
    assert raw.shape == (24, 3 * int4.BLOCK_BYTES[kind])
    q2, d2, m2 = int4.unpack(raw, kind)
    assert np.array_equal(q2, q) and np.array_equal(d2, d)
    assert np.array_equal(m2, np.zeros_like(d) if m is None else m)
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(kind))  # transformers' GGUF loader uses this
    assert np.array_equal(int4.dequantize(q2, d2, m2, kind), reference)
    with pytest.raises(OtmError, match="whole blocks"):
        int4.unpack(raw[:, :-1], kind)
    with pytest.raises(OtmError, match="not a 4-bit block format"):
        int4.unpack(raw, 8)  # Q8_0


@pytest.mark.parametrize("n,heads", [(64, 2), (32, 1), (96, 3)])
def test_query_and_key_rows_reordered_as_transformers_does(n, heads):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    file_rows = np.arange(n, dtype=np.float32)[:, None]
    want = LlamaTensorProcessor(config={})._reverse_permute_weights(file_rows, heads, heads)[:, 0]
    assert np.array_equal(int4.rope_rows(n, heads), want.astype(np.int64))


def test_the_kernel_computes_the_blocks_to_bfloat16_rounding_and_each_row_alike():
    rng = np.random.default_rng(0)
    q, d, m = random_blocks(rng, 160, 96, int4.Q4_1)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 1)
    sz = int4.scales_and_zeros(d, m, int4.Q4_1)
    # the weights as computed: (q - 8) s + z with s, z the bfloat16 roundings of d and m + 8 d
    s = sz[..., 0].double().t().repeat_interleave(32, 1)
    z = sz[..., 1].double().t().repeat_interleave(32, 1)
    w = (torch.from_numpy(q).double() - 8) * s + z
    exact = torch.from_numpy(int4.dequantize(q, d, m, int4.Q4_1)).double()
    assert (w - exact).abs().max() <= 2 ** -8 * exact.abs().max()  # the rounding of scales and zeros only
    torch.manual_seed(0)
    x = torch.randn(9, 96).bfloat16()
    lin = torch.nn.Linear(96, 160, bias=False).bfloat16()
    layer = int4.Int4Linear(lin, packed, sz, 0, LastCall())
    with torch.inference_mode():
        out = layer(x)
        rows = [layer(x[i : i + 1].clone()) for i in range(9)]
        firsts = [layer(x[:j].clone()) for j in range(1, 9)]
    want = x.double() @ w.t()
    assert out.dtype == torch.bfloat16
    assert ((out.double() - want).abs() <= 2 ** -7 * want.abs() + 1e-2).all()
    assert all(torch.equal(r, out[i : i + 1]) for i, r in enumerate(rows))  # one row alone = the same row in a call of 9
    assert all(torch.equal(f, out[: j + 1]) for j, f in enumerate(firsts))


def _tiny_target(tmp_path, *, kind: int = int4.Q4_1, seed: int = 0, tamper: bool = False, head_kind=None,
                 dtype=torch.bfloat16):
    """A tiny bfloat16 Llama whose block weights are a tiny GGUF's 4-bit blocks, and that GGUF (written with gguf-py;
    query and key rows stored in llama.cpp's order)."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None, attn_implementation="sdpa", initializer_range=0.5)
    model = LlamaForCausalLM(cfg).eval()
    rng = np.random.default_rng(seed)
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for file_name, parent, name in int4.LLAMA:
                lin = getattr(getattr(layer, parent), name)
                n, k = lin.weight.shape
                this = head_kind if (head_kind is not None and i == 1 and name == "down_proj") else kind
                if this == 8:  # a Q8_0 tensor where the kernel wants 4 bits
                    data = rng.standard_normal((n, k)).astype(np.float32) * 0.05
                    writer.add_tensor(f"blk.{i}.{file_name}.weight", gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                    continue
                q, d, m = random_blocks(rng, n, k, this)
                w = int4.dequantize(q, d, np.zeros_like(d) if m is None else m, this)
                lin.weight.copy_(torch.from_numpy(w))
                raw = pack(q, d, m)
                if name in ("q_proj", "k_proj"):  # llama.cpp's order: HF row r is file row rope_rows[r]
                    rows = int4.rope_rows(n, cfg.num_attention_heads if name == "q_proj" else cfg.num_key_value_heads)
                    stored = np.empty_like(raw)
                    stored[rows] = raw
                    raw = stored
                writer.add_tensor(f"blk.{i}.{file_name}.weight", raw, raw_dtype=gguf.GGMLQuantizationType(this))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model = model.to(dtype)
    if tamper:
        with torch.no_grad():
            model.model.layers[1].mlp.up_proj.weight[3, 5] += 0.25
    model.otm_gguf = path
    return model, path


def test_a_tiny_target_on_its_gguf_blocks_decodes_and_undoes(tmp_path):
    from otm.decode import speculative_decode
    from otm.decode.sampling import Sampling

    model, _ = _tiny_target(tmp_path)
    ids = torch.tensor([[3, 9, 27, 1, 44, 5]])
    with torch.inference_mode():
        dense = model(ids).logits
    assert int4.available(model)
    undo = int4.use_int4(model)
    assert undo.count == 14 and sum(isinstance(m, int4.Int4Linear) for m in model.modules()) == 14
    fused = model.model.layers[0].self_attn
    assert fused.q_proj.packed is fused.k_proj.packed is fused.v_proj.packed  # one GEMM for the three
    assert int4.use_int4(model).count == 0  # not swapped twice
    with torch.inference_mode():
        swapped = model(ids).logits
        gen = speculative_decode(model, model, [3, 9, 27], k=2, length=2, max_new_tokens=12, seed=0,
                                 sampling=Sampling(temperature=1.0))
    assert len(gen.tokens) == 12
    # the same Q4_1 model: bfloat16 weights against bfloat16 group scales, to bfloat16 rounding of the logits
    assert (swapped.float() - dense.float()).abs().max() <= 0.05 * dense.float().abs().max()
    assert not torch.equal(swapped, dense)  # the swap is in effect
    undo()
    assert not any(isinstance(m, int4.Int4Linear) for m in model.modules())
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, dense)


def test_targets_that_are_not_the_files_conversion_are_refused(tmp_path):
    tampered, _ = _tiny_target(tmp_path, tamper=True)
    with pytest.raises(OtmError, match=r"--compile int4: the target's layer 1 up_proj is not tiny.gguf's blk.1.ffn_up.weight"):
        int4.use_int4(tampered)
    assert not any(isinstance(m, int4.Int4Linear) for m in tampered.modules())  # nothing half-swapped
    (tmp_path / "b").mkdir()
    q8, _ = _tiny_target(tmp_path / "b", head_kind=8)
    with pytest.raises(OtmError, match="blk.1.ffn_down.weight is Q8_0; the 4-bit kernel runs Q4_0 and Q4_1 blocks only"):
        int4.use_int4(q8)
    (tmp_path / "c").mkdir()
    f64, _ = _tiny_target(tmp_path / "c")
    f64 = f64.double()
    assert not int4.available(f64)
    with pytest.raises(OtmError, match="runs a bfloat16 or float32 target on the CPU, this one is float64"):
        int4.use_int4(f64)
    (tmp_path / "d").mkdir()
    unknown, _ = _tiny_target(tmp_path / "d")
    del unknown.otm_gguf
    assert not int4.available(unknown)
    with pytest.raises(OtmError, match="has none that otm knows"):
        int4.use_int4(unknown)
    from otm.decode.onednn import for_choice

    with pytest.raises(OtmError, match="--compile int4"):
        for_choice("int4", unknown, None)


def test_a_float32_target_keeps_float32_around_the_kernel(tmp_path):
    """A float32 target (the CPU without native bfloat16 decodes in float32): its block layers round their inputs to
    bfloat16 for the kernel and return float32; everything else stays float32."""
    model, _ = _tiny_target(tmp_path, dtype=torch.float32)
    (tmp_path / "r").mkdir()
    rounded, _ = _tiny_target(tmp_path / "r")  # the same weights through bfloat16: not the file's any more
    with pytest.raises(OtmError, match="differ by up to"):
        int4.use_int4(rounded.float())
    ids = torch.tensor([[3, 9, 27, 1, 44, 5]])
    with torch.inference_mode():
        dense = model(ids).logits
        assert int4.available(model) and int4.use_int4(model).count == 14
        swapped = model(ids).logits
        out = model.model.layers[0].mlp.down_proj(torch.randn(1, 2, 128))
    assert swapped.dtype == torch.float32 == out.dtype and model.model.norm.weight.dtype == torch.float32
    assert not torch.equal(swapped, dense)
    assert (swapped - dense).abs().max() <= 0.05 * dense.abs().max()


@pytest.mark.parametrize("kind", [int4.Q4_0, int4.Q4_1])
def test_both_block_formats_swap(tmp_path, kind):
    model, _ = _tiny_target(tmp_path, kind=kind)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        dense = model(ids).logits.float()
        assert int4.use_int4(model).count == 14
        swapped = model(ids).logits.float()
    assert (swapped - dense).abs().max() <= 0.05 * dense.abs().max()


def test_measure_costs_on_int4_times_the_swapped_target_and_leaves_it(tmp_path):
    from otm.decode.bench import measure_costs

    model, _ = _tiny_target(tmp_path)
    costs = measure_costs(model, None, [1, 2, 3, 4], [1, 3], [], repeats=1, compile="int4")
    assert set(costs.target_ms) == {1, 3}
    assert not any(isinstance(m, int4.Int4Linear) for m in model.modules())


def test_the_embedded_target_is_known_by_its_cache_directory(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from otm.decode import embedded

    monkeypatch.setenv("OTM_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "target_gguf", lambda: tmp_path / "x.gguf")
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(tmp_path / embedded.TARGET_CACHE_NAME)))
    assert int4.gguf_source(model) == tmp_path / "x.gguf"
    other = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(tmp_path / "my-model")))
    assert int4.gguf_source(other) is None


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest total variation between the laws (softmax) of two logit tensors, over positions."""
    return 0.5 * (torch.softmax(a.double(), -1) - torch.softmax(b.double(), -1)).abs().sum(-1).max().item()


def test_a_sibling_called_with_another_input_computes_its_own_columns_and_a_stale_group_is_caught(tmp_path,
                                                                                                    monkeypatch):
    """k_proj called with a tensor q_proj did not see returns k's columns of that tensor, not the group's last
    output; the laws of a second forward are the dense model's up to rounding (TV 0.026 at most here: bfloat16
    weights against bfloat16 group scales). Negative control, the realistic bug: a group that returns its kept
    output whatever the input (a stale cache of the last call): the second forward's laws then lie TV 0.99 from
    the dense model's, and the same bound fails."""
    model, _ = _tiny_target(tmp_path)
    attn = model.model.layers[0].self_attn
    ids1, ids2 = torch.tensor([[3, 9, 27, 1]]), torch.tensor([[50, 2, 33, 8]])
    with torch.inference_mode():
        dense2 = model(ids2).logits
        int4.use_int4(model)
        x1, x2 = torch.randn(1, 3, 64).bfloat16(), torch.randn(1, 3, 64).bfloat16()
        attn.q_proj(x1)
        k2 = attn.k_proj(x2)  # another tensor: its own columns
        attn.q_proj(x2.clone())  # the whole group on (a copy of) x2
        assert torch.equal(k2, attn.k_proj.last.out[..., attn.k_proj.lo : attn.k_proj.hi])
        model(ids1)
        assert _tv(model(ids2).logits, dense2) < 0.1

    def stale(self, x):  # the planted bug: the kept output, whatever x is
        last = self.last
        if last.out is None:
            flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, int4.GROUP, self.scale_zero)
            last.x, last.out = x, out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
        return last.out[..., self.lo : self.hi]

    monkeypatch.setattr(int4.Int4Linear, "forward", stale)
    for m in model.modules():
        if isinstance(m, int4.Int4Linear):
            m.last.x = m.last.out = None
    with torch.inference_mode():
        model(ids1)
        assert _tv(model(ids2).logits, dense2) > 0.5


def _swapped_and_eager(tmp_path):
    """The tiny target swapped onto its 4-bit blocks and oneDNN, a prompt, and the eager swapped model's logits of
    the next token after it."""
    from otm.decode.onednn import use_onednn
    from otm.decode.runner import Runner

    model, _ = _tiny_target(tmp_path)
    int4.use_int4(model)
    use_onednn(model)
    prompt = [3, 9, 27, 1, 44, 5]
    torch._dynamo.reset()
    with torch.inference_mode():
        eager = Runner(model, "target")
        eager.feed(prompt)
        return model, prompt, eager.forward(*eager.chain([7]))[0, -1]


def _twice_profiled(runner, prompt):
    """The next token's logits from ``runner`` (fed ``prompt``) twice, the second call profiled: (first, second,
    operator counts of the second)."""
    from torch.profiler import profile

    with torch.inference_mode():
        got = runner.forward(*runner.chain([7]))[0, -1]
        runner.truncate(len(prompt))
        with profile() as p:
            again = runner.forward(*runner.chain([7]))[0, -1]
    return got, again, {e.key: e.count for e in p.key_averages()}


def test_a_compiled_step_runs_each_groups_gemm_once_to_the_same_logits(tmp_path, monkeypatch):
    """``--compile int4-compiled``: the static step compiled by inductor (with freezing, as it runs) over the swapped
    target. Traced, each sibling asks for its group's GEMM and the graph computes it once (4 GEMMs a layer: q/k/v, o,
    gate/up, down; 7 if the siblings were not merged), the head stays one opaque oneDNN call where oneDNN takes the
    model, and the next token's logits are the eager swapped model's to bfloat16 rounding."""
    from otm.decode.onednn import dtypes
    from otm.decode.static import StaticRunner

    model, prompt, want = _swapped_and_eager(tmp_path)
    with torch.inference_mode():
        static = StaticRunner(model, "target", capacity=64, buckets=(1,), compile="default", progress=None)
        static.feed(prompt)  # the prompt runs eagerly (larger than every bucket)
    got, again, calls = _twice_profiled(static, prompt)  # the first call compiles
    assert calls.get("aten::_weight_int4pack_mm_for_cpu") == 4 * len(model.model.layers)
    if torch.bfloat16 in dtypes():
        assert calls.get("otm::packed_linear") == 1  # the head
    assert torch.equal(again, got)
    assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()
    real_tv = _tv(got, want)
    _plant_keys_for_values(monkeypatch)
    with torch.inference_mode():
        planted = StaticRunner(model, "target", capacity=64, buckets=(1,), compile="default", progress=None)
        planted.feed(prompt)
        bad = planted.forward(*planted.chain([7]))[0, -1]
    bad_tv = _tv(bad, want)  # measured: compiled 0.0207 (bfloat16 rounding), with the wrong row 0.33
    assert (bad.float() - want.float()).abs().max() > 0.02 * want.float().abs().max() and bad_tv > 10 * real_tv


def _plant_keys_for_values(monkeypatch):
    """The planted wrong row of a compiled step: traced, the values take the keys' columns of the q/k/v group (both
    kv-head wide), a slice off by one sibling in the compiled path only; dynamo's state reset."""
    plain = int4.Int4Linear.forward

    def keys_for_values(self, x):
        if torch.compiler.is_compiling() and self.hi == self.packed.shape[0] and self.lo > self.out_features:  # v_proj
            return self._group(x)[..., self.lo - self.out_features : self.lo]
        return plain(self, x)

    monkeypatch.setattr(int4.Int4Linear, "forward", keys_for_values)
    torch._dynamo.reset()


_LOAD_IN_ANOTHER_PROCESS = r"""
import io, sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.test_int4 import _tiny_target
from otm.decode import int4
from otm.decode.onednn import use_onednn
from otm.decode.static import StaticRunner
Path(sys.argv[2]).mkdir()
model, _ = _tiny_target(Path(sys.argv[2]))
int4.use_int4(model)
use_onednn(model)
said = io.StringIO()
with torch.inference_mode():
    runner = StaticRunner(model, "target", capacity=64, buckets=(1,), compile="precompiled", progress=said)
    runner.feed([3, 9, 27, 1, 44, 5])
    logits = runner.forward(*runner.chain([7]))[0, -1]
torch.save(logits, sys.argv[3])
print(said.getvalue())
"""


def _precompiled_runner(model, prompt, said):
    from otm.decode.static import StaticRunner

    with torch.inference_mode():
        runner = StaticRunner(model, "target", capacity=64, buckets=(1,), compile="precompiled", progress=said)
        runner.feed(prompt)
    return runner


def test_a_precompiled_step_is_saved_loaded_in_another_process_and_merges_the_siblings(tmp_path, monkeypatch):
    """``--compile int4-compiled`` runs the static step compiled ahead of time (:mod:`otm.decode.precompile`): the
    first runner compiles each shape and saves it in the user cache; a later one, here in another process, loads it
    (no tracing: nothing compiled there) and gives the same logits bit for bit, which are the eager swapped model's
    to bfloat16 rounding. The siblings' GEMMs are merged by otm's pass (4 a layer); the negative control, the same
    graph without the pass, runs 7 a layer. A damaged file is said in one line and compiled again."""
    import io
    import subprocess
    import sys
    from pathlib import Path

    from otm.decode import precompile
    from otm.decode.onednn import dtypes

    monkeypatch.setenv("OTM_CACHE", str(tmp_path / "cache"))
    model, prompt, want = _swapped_and_eager(tmp_path)
    said = io.StringIO()
    runner = _precompiled_runner(model, prompt, said)
    got, again, calls = _twice_profiled(runner, prompt)  # compiles, saves
    keys = runner.cache.keys[0]  # float32 keys for the bfloat16 model, one spare slot past the capacity (64)
    assert keys.dtype == torch.float32 and keys.shape[2] == 65
    assert "compiling the target's step for 1 position ahead of time" in said.getvalue()
    saved = sorted(precompile.folder().glob("*.bin"))
    assert len(saved) == 1 and saved[0].name.startswith("target-1-")
    assert calls.get("aten::_weight_int4pack_mm_for_cpu") == 4 * len(model.model.layers)
    if torch.bfloat16 in dtypes():
        assert calls.get("otm::packed_linear") == 1  # the head
    assert torch.equal(again, got)
    assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()

    # another process loads the saved graph: nothing traced there, the same logits
    out = tmp_path / "logits.pt"
    root = str(Path(__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", _LOAD_IN_ANOTHER_PROCESS, root, str(tmp_path / "other"), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "loaded the target's step for 1 position" in run.stdout and "compiling" not in run.stdout
    assert torch.equal(torch.load(out), got)

    # a damaged file: said, compiled again, the same logits
    saved[0].write_bytes(b"not a graph")
    torch._dynamo.reset()
    said = io.StringIO()
    with torch.inference_mode():
        third = _precompiled_runner(model, prompt, said)
        assert torch.equal(third.forward(*third.chain([7]))[0, -1], got)
    assert "did not load" in said.getvalue() and "compiling the target's step" in said.getvalue()

    # negative control: without otm's pass the unfrozen graph asks for each sibling's group GEMM (7 a layer)
    monkeypatch.setenv("OTM_CACHE", str(tmp_path / "control"))
    monkeypatch.setattr(precompile, "same_calls", lambda: None)
    torch._dynamo.reset()
    _, _, calls = _twice_profiled(_precompiled_runner(model, prompt, io.StringIO()), prompt)
    assert calls.get("aten::_weight_int4pack_mm_for_cpu") == 7 * len(model.model.layers)

    # the planted wrong row in the saved graph (values from the keys' columns): caught by the logit bound, and its law
    # is far from the eager one where the real graph's is not (measured: TV 0.0207 real, bfloat16 rounding; 0.33)
    monkeypatch.undo()
    monkeypatch.setenv("OTM_CACHE", str(tmp_path / "planted"))
    _plant_keys_for_values(monkeypatch)
    bad, _, _ = _twice_profiled(_precompiled_runner(model, prompt, io.StringIO()), prompt)
    assert (bad.float() - want.float()).abs().max() > 0.02 * want.float().abs().max()
    assert _tv(bad, want) > 10 * _tv(got, want)


def test_merge_same_calls_merges_pure_repeats_only():
    """The pass merges a repeated pure call (same operator, same arguments), never a mutating or a random one."""
    from otm.decode.precompile import merge_same_calls

    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    b = g.call_function(torch.ops.aten.mul.Tensor, (x, x))  # a repeat: merged
    c = g.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))  # other arguments: kept
    r1 = g.call_function(torch.ops.aten.rand_like.default, (x,))
    r2 = g.call_function(torch.ops.aten.rand_like.default, (x,))  # random: kept
    m = g.call_function(torch.ops.aten.add_.Tensor, (x, a))
    m2 = g.call_function(torch.ops.aten.add_.Tensor, (x, a))  # mutating: kept
    g.output((a, b, c, r1, r2, m, m2))
    assert merge_same_calls(g) == 1
    targets = [n.target for n in g.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.mul.Tensor) == 2 and targets.count(torch.ops.aten.rand_like.default) == 2
    assert targets.count(torch.ops.aten.add_.Tensor) == 2
    assert list(g.nodes)[-1].args[0][1] is a  # the repeat's uses go to the first call


def test_prune_removes_other_versions_graphs_once_unused(tmp_path, monkeypatch):
    """Each version of the decoder's sources keeps its graphs in its own folder; saving a graph removes the folders
    of other versions unused for a day, and keeps this one and recently used others."""
    import os
    import time

    from otm.decode import precompile

    monkeypatch.setenv("OTM_CACHE", str(tmp_path))
    here = precompile.folder()
    old, recent = here.parent / ("0" * 16), here.parent / ("1" * 16)
    for d in (here, old, recent):
        d.mkdir(parents=True)
        (d / "target-1-x.bin").write_bytes(b"graph")
    now = time.time()
    os.utime(old, (now - 2 * 86400, now - 2 * 86400))
    os.utime(here, (now - 2 * 86400, now - 2 * 86400))  # the current version's folder is never removed
    assert precompile.prune(now) == [old]
    assert here.is_dir() and recent.is_dir() and not old.exists()
