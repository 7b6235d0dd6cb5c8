"""The most any tree of the embedded pair can gain on this machine: the speed-up with free verification and
bookkeeping, the best lossless verifier, and an acceptance that never falls with depth.

For a tree of k i.i.d. rows of depth L the speed-up over autoregressive sampling is B / (S / T(1)), with
S = T(1 + kL) + d(1) + (L - 1) d(k) the step's calls (:class:`otm.decode.bench.Costs`, measured here as the
decoder makes them, fastest of the rounds) and B = 1 + a_1 + a_1 a_2 + ... the tokens per step. At depth 1
no lossless verifier accepts more than alpha*(k) (the optimum over every rule whose output law is the
target's, here from the closed form of :func:`otm.optimum.optimal_acceptance`), so the ceiling puts
a_d = alpha*(k) at every depth (the measured acceptance falls with depth: docs/models.md) and counts
nothing between the calls:

    ceiling(k, L) = (1 + a + ... + a^L) / (S(k, L) / T(1)),  a = mean alpha*(k) over the positions

The acceptances are exact per position: the target samples a continuation of each of the lab's held-out
prompts at temperature 1 (the decode's setting), and at every generated position both models' processed
laws are taken as the decoder takes them (the run's dtype, the draft over its FR-Spec vocabulary, float64
laws); printed beside them: single-draft acceptance, K-SEQ's, and the target's mass on the draft's k most
likely tokens (what a deterministic top-k tree, EAGLE-2's, can accept at best).

    PYTHONPATH=. .venv/bin/python analysis/speedup_ceiling.py [--prompts 8] [--tokens 48] [--compile onednn] [--ks 1,2,4,8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch


def acceptances(target, draft, tokenizer, prompts, tokens: int, ks, seed: int = 0) -> dict[str, np.ndarray]:
    """Exact per-position depth-1 acceptances (columns by name) on target-sampled continuations."""
    from otm.decode.feature_draft import draft_logits, target_features
    from otm.decode.sampling import Sampling, next_token_laws
    from otm.optimum import optimal_acceptance
    from otm.verifiers import kseq

    rows: dict[str, list[float]] = {}
    sampling = Sampling()
    for i, prompt in enumerate(prompts):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        torch.manual_seed(seed * 1000 + i)
        with torch.inference_mode():
            seq = target.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens,
                                  pad_token_id=tokenizer.eos_token_id)
            start = enc["input_ids"].shape[1] - 1
            logits, feats = target_features(target, seq)
            p_all = next_token_laws(logits[0, start:-1], sampling, dtype=torch.float64).numpy()
            q_all = next_token_laws(draft_logits(draft, target, seq, feats)[0, start:-1], sampling,
                                    dtype=torch.float64).numpy()
        for p, q in zip(p_all, q_all):
            top = np.cumsum(p[np.argsort(-q, kind="stable")[: max(ks)]])
            rows.setdefault("k=1: sum min(p, q)", []).append(float(np.minimum(p, q).sum()))
            for k in ks:
                if k > 1:
                    rows.setdefault(f"k={k}: K-SEQ", []).append(kseq.acceptance(p, q, k))
                rows.setdefault(f"k={k}: alpha*(iid)", []).append(optimal_acceptance(p, q, k))
                rows.setdefault(f"k={k}: p(draft's top k)", []).append(float(top[k - 1]))
        print(f"  prompt {i + 1}/{len(prompts)}: {len(p_all)} positions", file=sys.stderr, flush=True)
    return {name: np.asarray(v) for name, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts of the lab (default 8)")
    ap.add_argument("--tokens", type=int, default=48, help="target-sampled tokens per prompt (default 48)")
    ap.add_argument("--compile", default="onednn", choices=["none", "onednn", "int4", "int4-compiled"],
                    help="the step (default onednn; int4: the GGUF's 4-bit blocks; int4-compiled: those in the static step "
                         "compiled ahead of time, each tree size a graph, compiled once)")
    ap.add_argument("--ks", default="1,2,4,8", help="the k of the table (default 1,2,4,8)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent / "lab"))
    from draftlab import HELD_OUT_PROMPTS

    from otm.decode.allocator import keep_freed_memory
    from otm.decode.bench import measure_costs, step_line
    from otm.decode.draft_vocab import DEFAULT_DRAFT_VOCAB
    from otm.decode.models import load_pair, resolve_dtype
    from otm.decode.onednn import for_choice
    from otm.machine import machine

    keep_freed_memory()
    dtype = resolve_dtype("auto")
    print(machine().line(step_line(args.compile)))
    target, draft, tokenizer = load_pair(dtype=dtype, draft_vocab=DEFAULT_DRAFT_VOCAB)
    print(f"embedded pair in {dtype}, draft over its {DEFAULT_DRAFT_VOCAB} most frequent tokens; temperature 1")
    ks, lengths = tuple(int(k) for k in args.ks.split(",")), (1, 2, 3, 4)
    start = time.perf_counter()
    acc = acceptances(target, draft, tokenizer, HELD_OUT_PROMPTS[: args.prompts], args.tokens, ks)
    n = len(next(iter(acc.values())))
    print(f"\nexact depth-1 acceptance, mean over {n} positions of {args.prompts} held-out prompts (95% interval of "
          "the mean by bootstrap over positions):")
    rng = np.random.default_rng(0)
    for name, v in acc.items():
        boot = np.sort([v[rng.integers(0, len(v), len(v))].mean() for _ in range(400)])
        print(f"  {name:24s} {v.mean():.4f}  ({boot[10]:.4f} .. {boot[389]:.4f})")
    compiled = args.compile == "int4-compiled"  # measure_costs swaps the models itself for the static step
    undo = (lambda: None) if compiled else for_choice(args.compile, target, draft)
    try:
        context = tokenizer("The quick brown fox jumps over the lazy dog. " * 20)["input_ids"][:66]
        with torch.inference_mode():
            costs = measure_costs(target, draft, context, sorted({1} | {1 + k * L for k in ks for L in lengths}),
                                  list(ks), repeats=7, compile=args.compile if compiled else "none")
    finally:
        undo()
    t1 = costs.target(1)
    print(f"\ncosts (66-token context, fastest of 7 rounds): T(1) {t1:.1f} ms; " + ", ".join(
        f"T({m}) {costs.target(m) / t1:.2f}" for m in sorted(costs.target_ms) if m > 1) + " T(1); " + ", ".join(
        f"d({b}) {costs.draft_ms[b]:.2f} ms" for b in ks))
    print("\nceiling = (1 + a + ... + a^L) / (S / T(1)), a = alpha*(k) at every depth, nothing counted between calls:")
    print("| k | a = alpha*(k) | " + " | ".join(f"L = {L}" for L in lengths) + " |")
    print("|---|---|" + "---|" * len(lengths))
    best = (0.0, None)
    for k in ks:
        a = acc[f"k={k}: alpha*(iid)"].mean()
        cells = []
        for L in lengths:
            c = sum(a ** d for d in range(L + 1)) / (costs.step_ms(k, L) / t1)
            best = max(best, (c, (k, L)))
            cells.append(f"{c:.2f}x")
        print(f"| {k} | {a:.3f} | " + " | ".join(cells) + " |")
    print(f"\nbest: {best[0]:.2f}x at k = {best[1][0]}, L = {best[1][1]} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
