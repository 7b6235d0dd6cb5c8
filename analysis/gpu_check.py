"""The prepared device check (``make gpu-check``): run it in one call as soon as a GPU machine is lent.

It needs nothing but the machine's own torch, transformers and scipy (``PYTHONPATH=.``, no install, no
network) and writes, under ``--out``, one JSON (``gpu_check.json``), one markdown report (``gpu_check.md``)
and a figure (``verify_us.png`` / ``.svg``):

(a) **laws on the device**: every ``otm.torch`` verifier (k = 2) draws ``n`` rows of drafts on the device
    from a fixed (target, draft) pair and verifies them; the output token's counts against the target law
    (lossless: the output law is the target) by a chi-square test at level 1e-3, with power 0.99 against
    every law at TV >= 0.015 (``otm.certify.power.draws_for``: n = 48,668 here); a planted bug (K-SEQ's
    residual drawn with its first accept uniform, ``otm.certify.mutants``: TV 0.019 on this pair) must be
    rejected by the same test;
(b) **microseconds per call** of each verifier at V = 49152, 128256 and 151936, batch 1, 32 and 256,
    k = 1, 2, 4, 8 (median of timed calls, CUDA events on a GPU; CUDA-graph replay where the verifier
    captures), beside transformers' ``_speculative_sampling`` (one candidate, batch 1) on the same device;
(c) **the decoder** on a random-weight Llama pair built on the device (a target of about 1.2B parameters
    with V = 128256; as drafts a 2-layer model and the target itself, whose acceptance of 1 is the
    machinery's ceiling): tokens per second of autoregressive and speculative decoding, the step split
    into target, draft and verify seconds, and host reads (device syncs) per step;
(d) **the engines' CUDA kernels in their own layouts**, where their wheels import on the CUDA device:
    SGLang's ``tree_speculative_sampling_target_only`` (``sgl_kernel``) by ``otm.certify.tree_kernels.certify_tree``
    (layout ``sglang``, top-k drafting, thresholds 1) and FlashInfer's ``chain_speculative_sampling`` by
    ``otm.certify.chain.certify_chain`` (layout ``flashinfer``); otherwise the row says "not run: needs CUDA" or
    "not installed". The quick check certifies our CPU rewrite of SGLang's kernel in the same code path.

``--quick`` runs the same code on the CPU with small sizes (make test runs it, so it cannot rot).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without an install (the GPU machine's image)
    sys.path.insert(0, str(ROOT))

import otm.torch as ot  # noqa: E402
from otm.certify import mutants  # noqa: E402
from otm.certify.power import draws_for  # noqa: E402
from otm.testing import chi2_gof  # noqa: E402

SAMPLERS = {"rrs_without_replacement": "sample_without_replacement", "kseq_without_replacement": "sample_without_replacement",
            "optimal_embedded": "sample_without_replacement", "greedy": "sample_greedy", "spechub": "sample_spechub"}
UNIFORMS = {"speculative": lambda k: 2, "spechub": lambda k: 3, "kseq_without_replacement": lambda k: 2 * k,
            "optimal_embedded": lambda k: 2 * k + 1, "optimal": lambda k: k + 2}
HOST_SET_UP = {"optimal_embedded": (32, 8), "kseq_without_replacement": (1, 4)}
"""Verifiers with a heavy set-up per row, timed up to this batch and k, 5 calls: kseq_without_replacement's
root search (43 race quadratures a row on the device path, ``otm/torch/_wor_trials.py``; 25-85 ms a row on a
CPU core on the host path) and optimal_embedded's walk followed by optimal's grouped layout."""
TARGET = np.array([0.30, 0.22, 0.15, 0.12, 0.09, 0.07, 0.05])
DRAFT = np.array([0.18, 0.30, 0.12, 0.08, 0.16, 0.06, 0.10])


def _k_of(name: str, k: int) -> int:
    return 1 if name == "speculative" else 2 if name == "spechub" else k


def _drafts(name, q, k, gen):
    return getattr(ot, SAMPLERS.get(name, "sample_iid"))(q, _k_of(name, k), generator=gen)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# (a) ---------------------------------------------------------------------------------------------------------


def law_checks(device, n: int | None, seed: int = 0) -> list[dict]:
    """Each verifier's output token against the target on the device, and a planted bug (see the module doc)."""
    tv, alpha = 0.015, 1e-3
    n = n or draws_for(TARGET, tv, alpha)
    gen = torch.Generator(device=device).manual_seed(seed)
    p = torch.tensor(TARGET, device=device).expand(n, -1).contiguous()
    q = torch.tensor(DRAFT, device=device).expand(n, -1).contiguous()
    rows = []
    rules = dict(ot.VERIFIERS)
    rules["planted: kseq, residual drawn with the first accept uniform"] = mutants.MUTANTS["kseq_shared_uniform"].torch
    for name, fn in rules.items():
        base = name.split(":")[0]
        k = _k_of(base, 2)
        d = _drafts(base, q, k, gen)
        start = time.perf_counter()
        out = fn(p, q, d, generator=gen)
        _sync(device)
        counts = np.bincount(out.token.cpu().numpy(), minlength=TARGET.size)
        res = chi2_gof(counts, TARGET, alpha=alpha)
        rows.append({"verifier": name, "k": k, "n": n, "pvalue": res.pvalue, "reject": bool(res.reject),
                     "expected": "reject" if name.startswith("planted") else "accept",
                     "ok": bool(res.reject) == name.startswith("planted"), "seconds": time.perf_counter() - start})
    return rows


# (b) ---------------------------------------------------------------------------------------------------------


def _peaked_laws(batch, V, device, gen):
    z = torch.randn(batch, V, device=device, generator=gen) * 2.0
    e = torch.randn(batch, V, device=device, generator=gen)
    return torch.softmax(z, -1), torch.softmax(0.9 * z + 0.44 * e, -1)


def _time_calls(fn, device, reps: int) -> tuple[float, str]:
    """Median microseconds per call, and how it was timed (graph replay where the call captures)."""
    for _ in range(2):
        fn()
    _sync(device)
    if device.type == "cuda":
        mode = "cuda graph"
        try:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        except Exception:  # noqa: BLE001 - a verifier that syncs cannot be captured: timed eagerly, and said so
            mode, run = "eager (not capturable)", fn
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times.append(1000.0 * a.elapsed_time(b))
        return statistics.median(times), mode
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(1e6 * (time.perf_counter() - t))
    return statistics.median(times), "eager, CPU clock"


def _transformers_call(p, q, d):
    """transformers' ``_speculative_sampling`` on one candidate (batch 1), in its own layout."""
    import inspect

    from transformers.generation.utils import _speculative_sampling

    extra = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(_speculative_sampling).parameters else {}
    q_logits = q[:1].log()[:, None]  # [1, 1, V]
    p_logits = p[:1].log()[:, None].expand(1, 2, -1)  # [1, 2, V]: the candidate's position and the bonus
    return lambda: _speculative_sampling(d[:1, :1], q_logits, 1, p_logits, **extra)


def timings(device, Vs, batches, ks, reps, names=None) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(1)
    rows = []
    names = names or list(ot.VERIFIERS)
    for V in Vs:
        for batch in batches:
            p, q = _peaked_laws(batch, V, device, gen)
            for name in names:
                host = name in HOST_SET_UP
                if host and batch > HOST_SET_UP[name][0]:
                    continue
                for k in sorted({_k_of(name, k) for k in ks if not host or k <= HOST_SET_UP[name][1]}):
                    d = _drafts(name, q, k, gen)
                    u = torch.rand(batch, UNIFORMS.get(name, lambda k: k + 1)(k), device=device, dtype=torch.float64,
                                   generator=gen)
                    fn = ot.VERIFIERS[name]
                    us, mode = _time_calls(lambda: fn(p, q, d, uniforms=u, validate=False), device,
                                           min(reps, 5) if host else reps)
                    rows.append({"verifier": name, "V": V, "batch": batch, "k": k, "us": us, "timing": mode})
            if batch == 1:
                d = ot.sample_iid(q, 1, generator=gen)
                us, mode = _time_calls(_transformers_call(p, q, d), device, reps)
                rows.append({"verifier": "transformers _speculative_sampling", "V": V, "batch": 1, "k": 1, "us": us,
                             "timing": mode})
    return rows


# (c) ---------------------------------------------------------------------------------------------------------


def _llama(layers, V, hidden, inter, heads, kv, seed, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return model


def decoder_runs(device, quick: bool, new_tokens: int, step: str = "none") -> dict:
    """Decoder rows on a random-weight Llama pair; ``step`` other than none adds the static-shape step's rows
    (``static``: eager kernels, what the quick check runs so the path cannot rot; a torch.compile mode, e.g.
    ``reduce-overhead`` for CUDA graphs)."""
    from otm.decode import autoregressive_decode, speculative_decode
    from otm.decode.host_reads import device_paths
    from otm.decode.steps import compile_options

    if quick:
        shape = dict(V=512, hidden=64, inter=128, heads=4, kv=2)
        target = _llama(2, seed=0, device=device, dtype=torch.float32, **shape)
        small = _llama(1, seed=1, device=device, dtype=torch.float32, **shape)
    else:  # Llama-3.2-1B's shape, random weights
        shape = dict(V=128256, hidden=2048, inter=8192, heads=32, kv=8)
        target = _llama(16, seed=0, device=device, dtype=torch.bfloat16, **shape)
        small = _llama(2, seed=1, device=device, dtype=torch.bfloat16, **shape)
    params = sum(x.numel() for x in target.parameters())
    prompt = list(range(5, 37))
    runs = []

    def record(name, run):
        g = run(False)
        s = g.stats
        with device_paths():  # the device's paths even on the CPU (the quick check): what a GPU syncs on
            counted = run(True).stats
        runs.append({"contender": name, "tokens": s.new_tokens, "target_calls": s.target_calls,
                     "block_efficiency": s.block_efficiency, "seconds": s.wall_seconds,
                     "tokens_per_second": s.new_tokens / s.wall_seconds, "target_s": s.target_seconds,
                     "draft_s": s.draft_seconds, "verify_s": s.verify_seconds,
                     "host_reads_per_step": {k: v / counted.steps for k, v in counted.host_reads.items()}})

    record("autoregressive", lambda c: autoregressive_decode(target, prompt, max_new_tokens=new_tokens, seed=0,
                                                              count_host_reads=c))
    for draft_name, draft in (("2-layer draft", small), ("the target as its own draft", target)):
        for verifier, k, L in (("speculative", 1, 4), ("kseq", 4, 2), ("optimal", 4, 2)):
            record(f"{verifier} k={k} L={L}, {draft_name}",
                   lambda c, v=verifier, k=k, L=L, d=draft: speculative_decode(
                       target, d, prompt, k=k, length=L, verifier=v, max_new_tokens=new_tokens, seed=0,
                       validate=False, count_host_reads=c))
    if step != "none":
        opts = compile_options(step)
        if "compile" in opts:  # compile every shape before anything is timed
            from otm.decode.static import warm_all

            autoregressive_decode(target, prompt, max_new_tokens=4, seed=0, **opts)
            speculative_decode(target, small, prompt, k=4, length=2, max_new_tokens=4, seed=0, validate=False, **opts)
            warm_all(target, small)
        record(f"autoregressive, {step} step", lambda c: autoregressive_decode(
            target, prompt, max_new_tokens=new_tokens, seed=0, count_host_reads=c, **opts))
        record(f"kseq k=4 L=2, 2-layer draft, {step} step", lambda c: speculative_decode(
            target, small, prompt, k=4, length=2, verifier="kseq", max_new_tokens=new_tokens, seed=0, validate=False,
            count_host_reads=c, **opts))
    ar = runs[0]["tokens_per_second"]
    for r in runs:
        r["speedup"] = r["tokens_per_second"] / ar
    return {"target_parameters": params, "V": shape["V"], "dtype": str(next(target.parameters()).dtype),
            "new_tokens": new_tokens, "runs": runs}


# (d) ---------------------------------------------------------------------------------------------------------


def _sglang_on_cuda(kernel):
    """SGLang's kernel called on the CUDA device from the tree harness's CPU arrays; outputs copied back."""
    import inspect

    try:
        takes_draft = "draft_probs" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        takes_draft = True

    def call(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
             retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs):
        args = [x.cuda() for x in (predicts, accept_index, accept_token_num, candidates, retrive_index,
                                   retrive_next_token, retrive_next_sibling, uniform_samples,
                                   uniform_samples_for_final_sampling, target_probs)]
        kernel(*args, *([draft_probs.cuda()] if takes_draft else []))  # positional: the keyword names changed
        for cpu, dev in zip((predicts, accept_index, accept_token_num), args[:3]):
            cpu.copy_(dev.cpu())

    call.__name__ = "sgl_kernel.tree_speculative_sampling_target_only"
    return call


def _flashinfer_on_cuda(kernel, seed: int):
    """FlashInfer's chain kernel on the CUDA device from the chain harness's CPU tensors (its own CUDA generator)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def call(draft_probs, draft_token_ids, target_probs, generator=None):
        out = kernel(draft_probs.cuda(), draft_token_ids.to(torch.int32).cuda(), target_probs.cuda(), generator=gen)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.cpu()

    call.__name__ = "flashinfer.sampling.chain_speculative_sampling"
    return call


def _report_row(engine, kernel, how, report) -> dict:
    worst = report.worst
    return {"engine": engine, "kernel": kernel, "how": how, "verdict": report.verdict, "method": report.method,
            "command": report.command, "seconds": report.seconds, "notes": list(report.notes),
            "worst": None if worst is None else {"case": worst.name, "pvalue": worst.pvalue, "tv": worst.tv,
                                                 "reason": worst.reason}}


def engine_kernels(device, quick: bool) -> list[dict]:
    """(d): the engines' CUDA kernels certified in their layouts where they import on a CUDA device."""
    from otm.certify.tree_kernels import certify_tree, sglang_target_only

    rows = []
    cuda = device.type == "cuda"
    tv = 0.3 if quick else 0.15  # the real kernels: a few minutes of device time together
    try:
        from sgl_kernel import tree_speculative_sampling_target_only as sglang
    except Exception as exc:  # noqa: BLE001 - any import failure (missing wheel, ABI) is reported, not raised
        sglang, why = None, f"not installed ({type(exc).__name__})"
    if sglang is not None and not cuda:
        why = "not run: needs CUDA"
    if sglang is not None and cuda:
        for k, L in ((2, 2), (4, 3)):
            kernel = f"tree_speculative_sampling_target_only k={k} L={L}"
            try:
                rep = certify_tree(_sglang_on_cuda(sglang), layout="sglang", k=k, length=L, tv=tv, scheme="top_k")
                rows.append(_report_row("SGLang", kernel, "real code", rep))
            except Exception as exc:  # noqa: BLE001 - the rest of the check still runs; the row says why
                rows.append({"engine": "SGLang", "kernel": kernel, "how": "real code",
                             "verdict": f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
    else:
        rows.append({"engine": "SGLang", "kernel": "tree_speculative_sampling_target_only", "how": why,
                     "verdict": why})
        rep = certify_tree(sglang_target_only, layout="sglang", k=2, length=2, tv=0.3, scheme="top_k")
        rows.append(_report_row("SGLang", "tree_speculative_sampling_target_only k=2 L=2",
                                "rewrite (otm.certify.tree_kernels, CPU)", rep))
    try:
        from flashinfer.sampling import chain_speculative_sampling as chain
    except Exception as exc:  # noqa: BLE001
        chain, why = None, f"not installed ({type(exc).__name__})"
    if chain is not None and not cuda:
        chain, why = None, "not run: needs CUDA"
    if chain is not None:
        from otm.certify.chain import certify_chain

        try:
            rep = certify_chain(_flashinfer_on_cuda(chain, 0), layout="flashinfer", length=2, tv=tv)
            rows.append(_report_row("FlashInfer", "chain_speculative_sampling L=2", "real code", rep))
        except Exception as exc:  # noqa: BLE001
            rows.append({"engine": "FlashInfer", "kernel": "chain_speculative_sampling L=2", "how": "real code",
                         "verdict": f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
    else:
        rows.append({"engine": "FlashInfer", "kernel": "chain_speculative_sampling", "how": why, "verdict": why})
    return rows


# report ------------------------------------------------------------------------------------------------------


def _figure(rows, path: Path, conditions: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    batches = sorted({r["batch"] for r in rows})
    big = max(batches)
    for name in sorted({r["verifier"] for r in rows}):
        sel = sorted((r for r in rows if r["verifier"] == name and r["batch"] == (1 if "transformers" in name else big)
                      and r["k"] == max(x["k"] for x in rows if x["verifier"] == name)), key=lambda r: r["V"])
        if sel:
            ax.plot([r["V"] for r in sel], [r["us"] for r in sel], marker="o", label=f"{name} (k={sel[0]['k']}, "
                    f"batch {sel[0]['batch']})")
    ax.set_xlabel("vocabulary size V")
    ax.set_ylabel("microseconds per call (median)")
    ax.set_yscale("log")
    ax.set_title("otm.torch verifiers per call", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.text(0.01, 0.01, conditions, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = [path.with_suffix(".png"), path.with_suffix(".svg")]
    for p in out:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return out


def _markdown(report: dict) -> str:
    lines = [f"# gpu-check ({report['mode']})", "", f"- device: {report['device']}",
             f"- torch {report['torch']}, transformers {report['transformers']}, python {report['python']}",
             f"- command: `{report['command']}`", f"- total {report['seconds']:.0f} s", "",
             "## (a) laws on the device", "", "| verifier | k | n | p-value | expected | ok |", "|---|---|---|---|---|---|"]
    for r in report["laws"]:
        lines.append(f"| {r['verifier']} | {r['k']} | {r['n']} | {r['pvalue']:.3g} | {r['expected']} | {r['ok']} |")
    lines += ["", "## (b) microseconds per call", "", "| verifier | V | batch | k | us | timing |", "|---|---|---|---|---|---|"]
    for r in report["timings"]:
        lines.append(f"| {r['verifier']} | {r['V']} | {r['batch']} | {r['k']} | {r['us']:.1f} | {r['timing']} |")
    dec = report["decoder"]
    lines += ["", f"## (c) the decoder: random-weight Llama, {dec['target_parameters']:,} parameters, V = {dec['V']}, "
              f"{dec['dtype']}, {dec['new_tokens']} new tokens", "",
              "| contender | block efficiency | tokens/s | speedup | target s | draft s | verify s | host reads per step |",
              "|---|---|---|---|---|---|---|---|"]
    for r in dec["runs"]:
        reads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["host_reads_per_step"].items()))
        lines.append(f"| {r['contender']} | {r['block_efficiency']:.2f} | {r['tokens_per_second']:.1f} | "
                     f"{r['speedup']:.2f} | {r['target_s']:.2f} | {r['draft_s']:.2f} | {r['verify_s']:.2f} | {reads} |")
    lines += ["", "## (d) the engines' kernels in their own layouts", "",
              "| engine | kernel | how | verdict | worst case | notes |", "|---|---|---|---|---|---|"]
    for r in report.get("engines", []):
        w = r.get("worst") or {}
        worst = f"{w.get('case')}: p = {w.get('pvalue') or 0:.3g}, empirical TV {w.get('tv') or 0:.3g}" if w else "-"
        notes = "; ".join(r.get("notes") or []) or "-"
        lines.append(f"| {r['engine']} | {r['kernel']} | {r['how']} | {r['verdict']} | {worst} | {notes} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes on the CPU (what make test runs)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "gpu_check")
    ap.add_argument("--compile", default=None, choices=("none", "static", "default", "reduce-overhead"),
                    help="also run the decoder's static-shape step this way (default: static in --quick, none "
                         "on a GPU; reduce-overhead = CUDA graphs, allow a few minutes of compilation)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    if not args.quick and device.type != "cuda":
        print("gpu-check: no CUDA device here: run it on a GPU machine, or give --quick for the CPU check",
              file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"gpu-check on {name}: (a) laws ...", flush=True)
    laws = law_checks(device, None)
    print("(b) timings ...", flush=True)
    if args.quick:
        tim = timings(device, [1000], [1, 4], [1, 2], reps=3)
    else:
        tim = timings(device, [49152, 128256, 151936], [1, 32, 256], [1, 2, 4, 8], reps=20)
    print("(c) decoder ...", flush=True)
    step = args.compile or ("static" if args.quick else "none")
    dec = decoder_runs(device, args.quick, 16 if args.quick else 128, step)
    print("(d) engines' kernels ...", flush=True)
    engines = engine_kernels(device, args.quick)
    import transformers

    report = {"mode": "quick (CPU)" if args.quick else "full", "device": name, "torch": torch.__version__,
              "transformers": transformers.__version__, "python": platform.python_version(),
              "command": "python analysis/gpu_check.py" + (" --quick" if args.quick else ""),
              "laws": laws, "timings": tim, "decoder": dec, "engines": engines, "seconds": time.perf_counter() - t0}
    cond = f"{name}; torch {torch.__version__}; median per call; {report['command']}"
    report["figures"] = [str(p.name) for p in _figure(tim, args.out / "verify_us", cond)]
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=float))
    (args.out / "gpu_check.md").write_text(_markdown(report))
    bad = [r["verifier"] for r in laws if not r["ok"]]  # a real engine kernel refuted is a finding, reported in (d)
    bad += [r["kernel"] for r in engines if r["how"].startswith("rewrite") and r["verdict"] == "refuted"]
    print(_markdown(report))
    if bad:
        print(f"gpu-check: law check failed for {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
