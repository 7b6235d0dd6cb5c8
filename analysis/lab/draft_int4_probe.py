#!/usr/bin/env python
# PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/lab/draft_int4_probe.py  (about 1 minute)
"""Depth-1 acceptance of the committed draft against the same draft with its linear layers rounded to 4 bits
(group 32, asymmetric, round to nearest: what torch's int4 kernel would compute), paired on the same positions;
and the draft's linear layers' GEMM time dense bf16 (oneDNN via F.linear) vs the int4 kernel at M = 1."""
import sys, copy, time, torch
sys.path.insert(0, "analysis"); sys.path.insert(0, "analysis/lab")
torch.set_num_threads(1)
from speedup_ceiling import acceptances
from draftlab import HELD_OUT_PROMPTS
from otm.decode.models import load_pair
target, draft, tok = load_pair(dtype="bfloat16", draft_vocab=4096)
def rtn4(w, g=32):
    n, k = w.shape
    x = w.float().reshape(n, k // g, g)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    s = ((hi - lo) / 15).clamp_min(1e-12)
    q = ((x - lo) / s).round().clamp(0, 15)
    return (q * s + lo).reshape(n, k).to(w.dtype)
q4 = copy.deepcopy(draft)
q4.__dict__["embedding"] = draft.embedding; q4.__dict__["head"] = draft.head
names = []
with torch.no_grad():
    for name, m in q4.named_modules():
        if isinstance(m, torch.nn.Linear) and m.weight.shape[1] % 32 == 0 and "head" not in name:
            m.weight.copy_(rtn4(m.weight)); names.append((name, tuple(m.weight.shape)))
print("rounded:", names, file=sys.stderr)
a = acceptances(target, draft, tok, HELD_OUT_PROMPTS[:8], 48, (1,))
b = acceptances(target, q4, tok, HELD_OUT_PROMPTS[:8], 48, (1,))
x, y = a["k=1: sum min(p, q)"], b["k=1: sum min(p, q)"]
d = y - x
print(f"positions {len(x)}: bf16 draft {x.mean():.4f}, 4-bit draft {y.mean():.4f}, paired diff {d.mean():+.4f} +- {d.std(ddof=1)/len(d)**0.5:.4f}", file=sys.stderr)
def bench(f, reps=300):
    for _ in range(10): f()
    t = time.perf_counter()
    for _ in range(reps): f()
    return 1e6 * (time.perf_counter() - t) / reps
tot_d = tot_q = 0
for name, (n, k) in names:
    w = torch.randn(n, k).bfloat16()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
    sz = torch.randn(k // 32, n, 2).bfloat16()
    x1 = torch.randn(1, k).bfloat16()
    td = bench(lambda: torch.nn.functional.linear(x1, w)); tq = bench(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x1, packed, 32, sz))
    tot_d += td; tot_q += tq
print(f"draft linears at M=1 (cache-warm microbench, sum): dense bf16 {tot_d:.0f} us, int4 {tot_q:.0f} us", file=sys.stderr)
