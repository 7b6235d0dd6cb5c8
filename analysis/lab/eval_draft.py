"""Held-out single-draft acceptance of the embedded draft against the embedded target.

For each held-out prompt below (none of them is among the training prompts of
``analysis/lab/train_draft.py``: different wording and topics, checked at start-up) the target
samples a continuation at temperature 1 (no top-k/top-p, up to ``--new-tokens``, stopping at
EOS). At every generated position both models see the same prefix and the acceptance of one
draft token under standard speculative sampling is recorded:

    a_i = sum_x min(target(x | prefix_i), draft(x | prefix_i))

The headline is the mean of a_i over all positions of all prompts, with a 95% confidence interval
from a bootstrap over prompts (positions of one continuation are correlated, so prompts are the
independent units). Conditions (machine, threads, versions, seed, models) are printed first.

    python analysis/lab/eval_draft.py                       # 32 prompts x 128 tokens, about 1 min on 2 cores
    python analysis/lab/eval_draft.py --draft path/to/other_draft --new-tokens 64

Results: ``docs/models.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from scipy.stats import bootstrap

from draftlab import HELD_OUT_PROMPTS, all_training_prompts, chain_length, held_out_acceptance

from otm.decode.feature_draft import FeatureDraft
from otm.decode.models import load_draft, load_pair



def check_held_out() -> None:
    """Refuse to run if a held-out prompt is also a training prompt."""
    training = all_training_prompts()
    overlap = training.intersection(HELD_OUT_PROMPTS)
    if overlap:
        raise SystemExit(f"held-out prompts also used in training: {sorted(overlap)}")


def bootstrap_ci(per_prompt: list[np.ndarray], seed: int, rounds: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of the position-weighted mean, resampling prompts as units
    (scipy's ``bootstrap`` on the paired (sum, count) of each prompt)."""
    sums = np.array([a.sum() for a in per_prompt])
    counts = np.array([len(a) for a in per_prompt], dtype=np.float64)
    ci = bootstrap((sums, counts), lambda s, c, axis=-1: s.sum(axis) / c.sum(axis), paired=True, vectorized=True,
                   n_resamples=rounds, confidence_level=0.95, method="percentile",
                   random_state=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="target model dir (default: embedded SmolLM2-135M)")
    ap.add_argument("--draft", default=None, help="draft model dir (default: otm/draft_model)")
    ap.add_argument("--prompts", type=int, default=len(HELD_OUT_PROMPTS), help="use the first N prompts")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", type=int, default=1,
                    help="feature drafts: also the acceptance at depths 2..N of a drafted chain (the draft "
                         "reading its own guessed features, with the target's tokens), each with its interval")
    ap.add_argument("--baseline", default=None,
                    help="a second draft dir scored on the same target samples: prints the paired "
                         "difference with a bootstrap interval over prompts")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    check_held_out()
    print(
        f"conditions: python {platform.python_version()}, torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}, os.cpu_count {os.cpu_count()}, {platform.machine()}; target "
        f"{args.target or 'embedded'}, draft {args.draft or 'embedded'}; {args.prompts} held-out "
        f"prompts, up to {args.new_tokens} new tokens, temperature 1, seed {args.seed}",
        flush=True,
    )
    target, draft, tokenizer = load_pair(args.target, args.draft)
    n_draft = sum(p.numel() for p in draft.parameters())
    theirs = {id(p) for p in target.parameters()}  # a draft may share the target's own Parameters
    own = sum(p.numel() for p in draft.parameters() if id(p) not in theirs)
    n_layers = sum(all(id(p) in theirs for p in layer.parameters()) for layer in draft.model.layers) \
        if hasattr(getattr(draft, "model", None), "layers") else 0
    shared = ("the embedding/head" + (f" and {n_layers} layers are" if n_layers else " is") + " the target's")
    print(f"draft: {draft.config.num_hidden_layers} layers x {draft.config.hidden_size} hidden, "
          f"{n_draft / 1e6:.2f} M parameters" + (f" ({own / 1e6:.2f} M its own, {shared})" if own < n_draft else ""),
          flush=True)
    if isinstance(draft, FeatureDraft):
        print("draft reads the target's features (EAGLE-style; embedding and head are the target's, not counted "
              "above): each position is scored with the target's features of its prefix, as at depth 1 of the decoder",
              flush=True)
    start = time.time()
    per_prompt = held_out_acceptance(
        target, draft, tokenizer, HELD_OUT_PROMPTS[: args.prompts],
        new_tokens=args.new_tokens, seed=args.seed, depth=args.depths,
    )
    by_depth = per_prompt if args.depths > 1 else None
    per_prompt = [a[0] for a in by_depth] if by_depth else per_prompt
    elapsed = time.time() - start
    all_pos = np.concatenate(per_prompt)
    lo, hi = bootstrap_ci(per_prompt, args.seed)
    per_prompt_means = np.array([a.mean() for a in per_prompt])
    print(f"positions: {len(all_pos)} over {len(per_prompt)} prompts ({elapsed:.0f} s)")
    print(f"per-prompt mean acceptance: min {per_prompt_means.min():.3f}, "
          f"median {np.median(per_prompt_means):.3f}, max {per_prompt_means.max():.3f}")
    print(f"held-out acceptance sum_x min(target, draft), mean over positions: "
          f"{all_pos.mean():.4f}  (95% CI {lo:.4f} .. {hi:.4f}, bootstrap over prompts)")
    if by_depth:
        report_depths(by_depth, args.seed)
    if args.baseline:
        base = load_draft(args.baseline, target)  # next to the target already loaded
        base_pp = held_out_acceptance(
            target, base, tokenizer, HELD_OUT_PROMPTS[: args.prompts],
            new_tokens=args.new_tokens, seed=args.seed, depth=args.depths,
        )
        if by_depth:
            base_by_depth = base_pp
            print(f"baseline {args.baseline}:")
            report_depths(base_pp, args.seed)
            base_pp = [a[0] for a in base_pp]
        if [len(a) for a in base_pp] != [len(a) for a in per_prompt]:
            raise SystemExit("the target's samples differ between the two runs: no paired comparison")
        diff = [a - b for a, b in zip(per_prompt, base_pp)]
        dlo, dhi = bootstrap_ci(diff, args.seed)
        b_all = np.concatenate(base_pp)
        print(f"baseline {args.baseline}: {b_all.mean():.4f}; paired difference draft - baseline "
              f"{all_pos.mean() - b_all.mean():+.4f} (95% CI {dlo:+.4f} .. {dhi:+.4f}, bootstrap over prompts)")
        for d in range(1, args.depths if by_depth else 0):
            diff = [a[d] - b[d] for a, b in zip(by_depth, base_by_depth)]
            dlo, dhi = bootstrap_ci(diff, args.seed)
            delta = np.concatenate(diff).mean()
            print(f"depth {d + 1}: paired difference draft - baseline {delta:+.4f} (95% CI {dlo:+.4f} .. {dhi:+.4f})")


def report_depths(by_depth, seed) -> None:
    """One line per depth: mean acceptance over positions with its bootstrap interval over prompts,
    and the chain proxy 1 + a_1 + a_1 a_2 + ... of those means."""
    means = []
    for d in range(by_depth[0].shape[0]):
        rows = [a[d] for a in by_depth]
        lo, hi = bootstrap_ci(rows, seed)
        means.append(np.concatenate(rows).mean())
        print(f"  depth {d + 1}: acceptance {means[-1]:.4f} (95% CI {lo:.4f} .. {hi:.4f})")
    print(f"  chain proxy 1 + a1 + a1 a2 + ...: {chain_length(means):.4f}")


if __name__ == "__main__":
    main()
