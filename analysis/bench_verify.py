"""Time the batched torch verifiers (otm.torch) per verification call.

For every V in {32000, 49152, 128256}, batch in {1, 32} and k in {1, 2, 4, 8}, each
verifier is timed side by side, in the same run, with

* a straightforward per-row version: a Python loop over the rows calling a simple
  per-row torch implementation (``.item()`` decisions, ``torch.multinomial`` for the
  residual, SpecTr's bisection for rho*), the way research code writes these rules;
* single-draft rejection sampling (k = 1) as HF transformers and vLLM write it,
  transcribed below from their sources (see the comments), on the same laws.

Laws are LLM-like: target = softmax(2.5 z), draft = softmax(2.5 z + e) with z, e
standard normal, one pair per row (16 pairs taken in turn at batch 1), float32
(``--dtype``). Drafts come from each verifier's own scheme (otm.torch samplers),
drawn before timing, fresh for every call. Every
timed call gets fresh randomness from one seeded generator; the batched verifiers
run with ``validate=False`` (shape, dtype and device checks only, as a decoder
would call them after checking its inputs once). Times are means over
``--repeats`` calls (batch 1) or ``--batch-repeats`` calls (batch 32) after
``--warmup`` calls, under ``torch.inference_mode``; on CUDA each call is
synchronised. Means, not medians: the per-row loops and HF stop early when the
draft is accepted, so their cost per call is bimodal and the mean is the
expected cost of a verification.

    python analysis/bench_verify.py              # full grid
    python analysis/bench_verify.py --quick      # V = 49152 only, fewer repeats
    python analysis/bench_verify.py --device cuda
    python analysis/bench_verify.py --optimal-only --threads 1   # otm.torch.optimal beside kseq only
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import otm.torch as ot  # noqa: E402

SCHEME_OF = {
    "speculative": "iid",
    "kseq": "iid",
    "rrs": "iid",
    "rrs_without_replacement": "without_replacement",
    "greedy": "greedy",
    "spechub": "spechub",
}


def applies(name: str, k: int) -> bool:
    if name not in SCHEME_OF:  # optimal: numpy set-up per row, timed apart (optimal_rows)
        return False
    if name == "speculative":
        return k == 1
    if name == "spechub":
        return k == 2
    return True


# -- single-draft baselines, transcribed -------------------------------------------------


def hf_speculative_sampling(candidate_input_ids, q, p):
    """HF transformers ``_speculative_sampling`` (src/transformers/generation/utils.py), one position.

    Transcribed line by line, with two changes: HF takes logits and starts with
    ``q = candidate_logits.softmax(dim=-1)`` / ``p = new_logits.softmax(dim=-1)``; here
    ``q [1, 1, V]`` and ``p [1, 1, V]`` are those probabilities already. And when the
    draft is accepted HF goes on to sample a bonus token from the next position's
    target law, which single-position verification does not do: that branch returns
    the accepted draft. The function is batch size 1 only (``n_matches`` is a scalar
    and ``if n_matches < gamma`` synchronises); batches are looped over rows.
    Acceptance is ``r_i <= probability_ratio`` as in HF (it accepts p = 0 tokens at
    r_i = 0; see docs/audit.md).
    """
    candidate_length = 1
    new_candidate_input_ids = candidate_input_ids[:, -candidate_length:]
    q_i = q[:, torch.arange(candidate_length), new_candidate_input_ids].squeeze(0, 1)
    p_i = p[:, torch.arange(candidate_length), new_candidate_input_ids].squeeze(0, 1)
    probability_ratio = p_i / q_i
    r_i = torch.rand_like(probability_ratio)
    is_accepted = r_i <= probability_ratio
    n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum()  # this is `n` in algorithm 1
    gamma = q.shape[1]
    if n_matches < gamma:
        p_n_plus_1 = p[:, n_matches, :]
        q_n_plus_1 = q[:, n_matches, :]
        p_prime = torch.clamp((p_n_plus_1 - q_n_plus_1), min=0)
        p_prime.div_(p_prime.sum())
        t = torch.multinomial(p_prime, num_samples=1).squeeze(1)[None, :]
        return t, n_matches
    return new_candidate_input_ids, n_matches


def hf_baseline(target, draft, drafts, generator):
    """HF's function per row (it supports batch size 1); ``torch.rand_like`` uses the global generator."""
    out = []
    for i in range(target.shape[0]):
        t, _ = hf_speculative_sampling(drafts[i : i + 1, :1], draft[i : i + 1, None], target[i : i + 1, None])
        out.append(t.reshape(-1)[:1])
    return torch.cat(out)


def vllm_baseline(target, draft, drafts, generator):
    """vLLM v1 rejection sampler (vllm/v1/sample/rejection_sampler.py), one draft per request, in PyTorch.

    ``generate_uniform_probs``: float32 uniforms. ``sample_recovered_tokens``: one
    float32 ``Exp(1)`` vector per request (``q.exponential_()``), and the kernel's
    ``argmax(max(target - draft, 0) / q)`` (no normalisation: the argmax does not need
    it). ``rejection_random_sample_kernel``: accept iff ``draft_prob > 0 and
    target_prob / draft_prob >= uniform_prob``, else the recovered token. The Triton
    kernels run one program per request; these are the same operations as batched
    torch calls (vLLM's tests hold the kernels to a PyTorch reference of this form).
    """
    batch, vocab = target.shape
    draft_token_ids = drafts[:, 0]
    uniform_probs = torch.rand((batch,), dtype=torch.float32, device=target.device, generator=generator)
    q = torch.empty((batch, vocab), dtype=torch.float32, device=target.device)
    q.exponential_(generator=generator)
    prob = torch.clamp(target - draft, min=0)
    recovered_token_ids = torch.argmax(prob / q, dim=-1)
    draft_prob = draft.gather(1, draft_token_ids[:, None])[:, 0]
    target_prob = target.gather(1, draft_token_ids[:, None])[:, 0]
    accept = (draft_prob > 0) & (target_prob / draft_prob >= uniform_probs)
    return torch.where(accept, draft_token_ids, recovered_token_ids)


# -- straightforward per-row versions ----------------------------------------------------


def _rand(generator, device):
    return torch.rand((), generator=generator, device=device).item()


def _multinomial(weights, generator):
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))


def row_speculative(p, q, d, generator):
    x = int(d[0])
    if _rand(generator, p.device) * q[x].item() < p[x].item():
        return x
    return _multinomial((p - q).clamp(min=0), generator)


def row_rho_bisection(p, q, k, tol=1e-9):
    """SpecTr's bisection (Sun et al., NeurIPS 2023, K-SEQ; docs/theory.md section 3): upper end of the final bracket."""
    lo, hi = 1.0, float(k)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        b = torch.minimum(q, p / mid).sum().item()
        if 1 - (1 - b) ** k >= mid * b:
            lo = mid
        else:
            hi = mid
    return hi


def row_kseq(p, q, d, generator):
    k = d.numel()
    rho = row_rho_bisection(p, q, k) if k > 1 else 1.0
    for x in d.tolist():
        if _rand(generator, p.device) * rho * q[x].item() < p[x].item():
            return x
    b = torch.minimum(q, p / rho).sum().item()
    c = (1 - (1 - b) ** k) / b if b > 0 else 0.0
    return _multinomial((p - torch.minimum(p / rho, q) * c).clamp(min=0), generator)


def row_rrs(p, q, d, generator):
    current = p
    for x in d.tolist():
        if _rand(generator, p.device) * q[x].item() < current[x].item():
            return x
        nxt = (current - q).clamp(min=0)
        current = nxt / nxt.sum()
    return _multinomial(current, generator)


def row_rrs_without_replacement(p, q, d, generator):
    current, proposal = p, q
    for x in d.tolist():
        if _rand(generator, p.device) * proposal[x].item() < current[x].item():
            return x
        nxt = (current - proposal).clamp(min=0)
        current = nxt / nxt.sum()
        proposal = proposal.clone()
        proposal[x] = 0
        proposal = proposal / proposal.sum()
    return _multinomial(current, generator)


def row_greedy(p, q, d, generator):
    rest = q.clone()
    rest[d[:-1]] = 0
    last = rest / rest.sum()
    x = int(d[-1])
    if _rand(generator, p.device) * last[x].item() < p[x].item():
        return x
    return _multinomial((p - last).clamp(min=0), generator)


def row_spechub(p, q, d, generator):
    a = int(q.argmax())
    q_a = q.clone()
    q_a[a] = 0
    m2 = q[a] * q_a / q_a.sum()
    p_excess = (p - q_a).clamp(min=0)
    p_excess[a] = 0
    x1, x2 = d.tolist()
    if x1 == a:
        i = x2
        if _rand(generator, p.device) * m2[i].item() < p_excess[i].item():
            return i
        if _rand(generator, p.device) * (m2 - p_excess).clamp(min=0).sum().item() < p[a].item():
            return a
    else:
        i = x1
        if _rand(generator, p.device) * q_a[i].item() < p[i].item():
            return i
        left1 = (q_a - p).clamp(min=0)
        left1[a] = 0
        hub_rest = max(p[a].item() - (m2 - p_excess).clamp(min=0).sum().item(), 0.0)
        if _rand(generator, p.device) * left1.sum().item() < hub_rest:
            return a
    residual = (p - q_a - m2).clamp(min=0)
    residual[a] = 0
    return _multinomial(residual if residual.sum() > 0 else p, generator)


ROW = {
    "speculative": row_speculative,
    "kseq": row_kseq,
    "rrs": row_rrs,
    "rrs_without_replacement": row_rrs_without_replacement,
    "greedy": row_greedy,
    "spechub": row_spechub,
}


def row_loop(name):
    f = ROW[name]

    def run(target, draft, drafts, generator):
        return [f(target[i], draft[i], drafts[i], generator) for i in range(target.shape[0])]

    return run


# -- timing ------------------------------------------------------------------------------


def laws(batch, vocab, dtype, device, generator):
    z = torch.randn(batch, vocab, generator=generator, device=device)
    e = torch.randn(batch, vocab, generator=generator, device=device)
    return torch.softmax(2.5 * z, -1).to(dtype), torch.softmax(2.5 * z + e, -1).to(dtype)


def timed(f, warmup, repeats, device):
    """Mean wall time of one call ``f(i)``, in microseconds; ``i`` counts the calls (warmup first)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for i in range(warmup):
        f(i)
    sync()
    times = []
    for i in range(warmup, warmup + repeats):
        start = time.perf_counter()
        f(i)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.mean(times) * 1e6


def goal(args, device, dtype, results, vocab=49152, k=8, rounds=None):
    """The stated goal, measured interleaved: K-SEQ (k = 8, V = 49152, batch 1) against single-draft
    rejection sampling. Each round calls every contender once, in turn, on the same law pair and fresh
    drafts, so slow phases of a shared machine hit all of them alike."""
    rounds = rounds or 2 * args.repeats
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    torch.manual_seed(args.seed + 1)
    pairs = [laws(1, vocab, dtype, device, gen) for _ in range(16)]
    contenders = {
        "K-SEQ k=8 (otm.torch.kseq)": ("iid", k, lambda t, q, d: ot.kseq(t, q, d, generator=gen, validate=False)),
        "K-SEQ k=8, validate=True": ("iid", k, lambda t, q, d: ot.kseq(t, q, d, generator=gen)),
        "single draft: otm.torch.speculative": ("iid", 1, lambda t, q, d: ot.speculative(t, q, d, generator=gen, validate=False)),
        "single draft: HF _speculative_sampling": ("iid", 1, lambda t, q, d: hf_baseline(t.float(), q.float(), d, gen)),
        "single draft: vLLM rejection sampler": ("iid", 1, lambda t, q, d: vllm_baseline(t.float(), q.float(), d, gen)),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {name: [] for name in contenders}
    with torch.inference_mode():
        for r in range(args.warmup + rounds):
            t, q = pairs[r % len(pairs)]
            for name, (scheme, kk, f) in contenders.items():
                d = ot.sample_drafts(scheme, q, kk, generator=gen)
                sync()
                start = time.perf_counter()
                f(t, q, d)
                sync()
                if r >= args.warmup:
                    times[name].append(time.perf_counter() - start)
    mean = {name: statistics.mean(ts) * 1e6 for name, ts in times.items()}
    print(f"goal, interleaved ({rounds} rounds, V={vocab}, batch 1, mean us per call):")
    for name, us in mean.items():
        print(f"  {name:42s} {us:8,.0f}")
    kseq_us = mean["K-SEQ k=8 (otm.torch.kseq)"]
    single = min(mean["single draft: HF _speculative_sampling"], mean["single draft: vLLM rejection sampler"])
    print(f"  K-SEQ / fastest peer single-draft = {kseq_us / single:.2f} (goal <= 2: {'met' if kseq_us <= 2 * single else 'NOT met'}); "
          f"K-SEQ < 1 ms: {'met' if kseq_us < 1000 else 'NOT met'}")
    results["goal"] = mean


def optimal_rows(args, device, dtype, vocab=49152, ks=(2, 4, 8), reps1=None, reps32=None):
    """``otm.torch.optimal`` (set-up + one verification per call) beside ``otm.torch.kseq``, interleaved.

    Each round calls both rules once on the same laws and fresh drafts; ms per position at batch 1
    and ms per row at batch 32 (distinct law pairs per row). The optimal set-up is the grouped numpy
    ``otm.verifiers.optimal.build`` per row; its work depends on the laws, so the mean, the median and
    the largest call are printed."""
    reps1 = reps1 or max(20, args.repeats // 4)
    reps32 = reps32 or max(3, args.batch_repeats)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"\noptimal beside kseq (V={vocab}, {args.dtype} laws as above, validate=False; "
          f"{reps1} rounds at batch 1 over 16 law pairs, {reps32} at batch 32 over fresh batches of 32 pairs):")
    print("| batch | k | optimal ms (mean / median / max) | kseq ms (mean) | optimal / kseq | goal |")
    print("|---|---|---|---|---|---|")
    out = {}
    for batch, reps in ((1, reps1), (32, reps32)):
        gen = torch.Generator(device=device).manual_seed(args.seed + 7)
        pairs = [laws(batch, vocab, dtype, device, gen) for _ in range(16 if batch == 1 else reps + args.warmup)]
        for k in ks:
            times = {"optimal": [], "kseq": []}
            for r in range(args.warmup + reps):
                t, q = pairs[r % len(pairs)]
                d = ot.sample_iid(q, k, generator=gen)
                for name in times:
                    f = ot.VERIFIERS[name]
                    sync()
                    start = time.perf_counter()
                    f(t, q, d, generator=gen, validate=False)
                    sync()
                    if r >= args.warmup:
                        times[name].append((time.perf_counter() - start) * 1e3 / batch)
            o, ks_ = times["optimal"], statistics.mean(times["kseq"])
            goal_ms = 2.0 if batch == 1 else 1.0
            mean = statistics.mean(o)
            print(f"| {batch} | {k} | {mean:.2f} / {statistics.median(o):.2f} / {max(o):.2f} | {ks_:.3f} | "
                  f"{mean / ks_:.0f} | {'met' if mean <= goal_ms else 'NOT met'} (<= {goal_ms:g} ms) |", flush=True)
            out[batch, k] = (mean, statistics.median(o), max(o), ks_)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="V = 49152 only, fewer timed calls")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=200, help="timed calls at batch 1")
    ap.add_argument("--batch-repeats", type=int, default=10, help="timed calls at batch 32")
    ap.add_argument("--optimal-only", action="store_true", help="only the optimal-beside-kseq rows")
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.repeats, args.batch_repeats = 2, 40, 3
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    vocabs = [49152] if args.quick else [32000, 49152, 128256]
    ks, batches = [1, 2, 4, 8], [1, 32]

    print(f"# bench_verify  {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"command: python {' '.join(['analysis/bench_verify.py'] + (argv if argv is not None else sys.argv[1:]))}")
    print(f"machine: {platform.platform()}; {platform.machine()}; {os.cpu_count()} CPUs; python {platform.python_version()}")
    print(f"torch {torch.__version__}; threads {torch.get_num_threads()}; device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"dtype {args.dtype}; seed {args.seed}; warmup {args.warmup}; timed calls {args.repeats} at batch 1, "
          f"{args.batch_repeats} at batch 32; mean time per call in microseconds; validate=False")
    if hasattr(os, "getloadavg"):
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    if args.optimal_only:
        with torch.inference_mode():
            results = {"optimal": optimal_rows(args, device, dtype)}
        if hasattr(os, "getloadavg"):
            print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return results
    header = "| V | batch | k | verifier | batched (us) | per-row loop (us) | loop / batched |"
    print(header)
    print("|" + "---|" * 7)
    results = {}
    with torch.inference_mode():
        for vocab in vocabs:
            for batch in batches:
                gen = torch.Generator(device=device).manual_seed(args.seed)
                torch.manual_seed(args.seed)  # HF's rand_like / multinomial use the global generator
                reps = args.repeats if batch == 1 else args.batch_repeats
                calls = args.warmup + reps
                # every call sees other drafts (and, at batch 1, one of 16 law pairs): the cost of the
                # rules that stop early depends on whether the draft is accepted
                pairs = [laws(batch, vocab, dtype, device, gen) for _ in range(16 if batch == 1 else 1)]
                pairs32 = [(t.float(), q.float()) for t, q in pairs]

                def law(i):
                    return pairs[i % len(pairs)]

                def law32(i):
                    return pairs32[i % len(pairs)]

                d1 = [ot.sample_iid(law(i)[1], 1, generator=gen) for i in range(calls)]
                base = {
                    "HF _speculative_sampling": timed(lambda i: hf_baseline(*law32(i), d1[i], gen), args.warmup, reps, device),
                    "vLLM rejection sampler": timed(lambda i: vllm_baseline(*law32(i), d1[i], gen), args.warmup, reps, device),
                }
                for label, us in base.items():
                    results[vocab, batch, 1, label] = (us, None)
                    print(f"| {vocab} | {batch} | 1 | {label} | {us:,.0f} | | |", flush=True)
                for k in ks:
                    for name in ot.VERIFIERS:
                        if not applies(name, k):
                            continue
                        drafts = [ot.sample_drafts(SCHEME_OF[name], law(i)[1], k, generator=gen) for i in range(calls)]
                        f, loop_f = ot.VERIFIERS[name], row_loop(name)
                        fast = timed(lambda i: f(*law(i), drafts[i], generator=gen, validate=False), args.warmup, reps, device)
                        loop = timed(lambda i: loop_f(*law32(i), drafts[i], gen), args.warmup, reps, device)
                        results[vocab, batch, k, name] = (fast, loop)
                        print(f"| {vocab} | {batch} | {k} | {name} | {fast:,.0f} | {loop:,.0f} | {loop / fast:.1f} |", flush=True)
                        if (vocab, batch, k, name) == (49152, 1, 8, "kseq"):
                            results["kseq validate"] = timed(lambda i: f(*law(i), drafts[i], generator=gen), args.warmup, reps, device)
    print()
    goal(args, device, dtype, results)
    with torch.inference_mode():
        results["optimal"] = optimal_rows(args, device, dtype)
    if hasattr(os, "getloadavg"):
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return results


if __name__ == "__main__":
    main()
