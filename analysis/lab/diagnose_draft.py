"""Where a draft loses acceptance: fit vs generalisation, the tail, the target's entropy, examples.

Runs on the cached training shards of ``analysis/lab/train_draft.py`` (the target's hidden states give
its full next-token law at every generated position) and prints, for each draft given:

1. exact acceptance ``sum_x min(target, draft)`` on the validation sequences of each data directory
   (the same 48 that ``train_draft.py`` holds back, same seed) and on 48 of its training sequences:
   the train-minus-validation gap says whether more data or more capacity is the limit;
2. on the validation sequences of the last directory: the acceptance split into the target's top-k
   tokens and the rest (the tail), each law's tail mass, and the coarsened acceptance the top-k
   loss sees (top-k cells plus one tail cell, which credits tail mass wherever it lies);
3. the acceptance by the target's entropy (nats) and under draft logits scaled by s (a draft
   temperature 1/s: does a sharper or flatter draft do better?);
4. with ``--examples N``: N positions where the target is sure (max probability > 0.95) and the
   draft accepts less than 0.3, with their context, and the most frequent sure tokens with their
   mean acceptance.

    python analysis/lab/diagnose_draft.py otm/draft_model /tmp/draft_r2 --threads 2 --examples 12

Results: ``docs/models.md`` (fifth round).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import torch

import draftlab as T

from otm.decode.embedded import cache_dir
from otm.decode.models import load_draft

DEFAULT_DIRS = ["39105703299b", "1ab8b8e6f92a"]  # v2 templates, self-written prompts
SCALES = (0.9, 1.0, 1.1, 1.2, 1.5)
ENTROPY_BINS = ((0, 0.2), (0.2, 0.5), (0.5, 1.5), (1.5, 3), (3, 5), (5, 99))


def splits(path: Path, n: int = 48):
    """(validation, first n training) sequences of one directory, as train_draft.py splits it."""
    val, tr = T.split_examples(T.load_examples([path], None)[0], 0)
    return val, tr[:n]


def laws(draft, head, examples, pad_id, batch=8):
    """Per position: target law p [N, V], draft logits [N, V] (fp32), target top-k ids, context."""
    with torch.no_grad():
        for i in range(0, len(examples), batch):
            ids, rows, cols, hidden, _, top_i = T.make_batch(examples[i:i + batch], pad_id)
            logits = T.draft_logits(draft, ids, rows, cols).float()
            yield torch.softmax(hidden.float() @ head.T, -1), logits, top_i, ids, rows, cols


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="+", help="draft directories")
    ap.add_argument("--data-dir", type=Path, nargs="+",
                    default=[cache_dir() / "draft_data" / d for d in DEFAULT_DIRS])
    ap.add_argument("--examples", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tok = T.load_target()
    head = target.lm_head.weight.detach().clone()
    data = {p.name: splits(p) for p in args.data_dir}
    last_val = data[args.data_dir[-1].name][0]
    for path in args.drafts:
        draft = load_draft(path, target).eval()
        start = time.time()
        print(f"== {path}")
        for name, (val, tr) in data.items():
            _, a_val = T.evaluate(draft, head, val, tok.pad_token_id, 8)
            _, a_tr = T.evaluate(draft, head, tr, tok.pad_token_id, 8)
            print(f"  {name}: acceptance on {len(tr)} training sequences {a_tr:.4f}, "
                  f"on {len(val)} validation sequences {a_val:.4f} (gap {a_tr - a_val:+.4f})")
        acc, top_acc, tail_acc, p_tail, q_tail, coarse, ent = ([] for _ in range(7))
        scaled = {s: [] for s in SCALES}
        sure = collections.defaultdict(list)
        shown = 0
        for p, logits, top_i, ids, rows, cols in laws(draft, head, last_val, tok.pad_token_id):
            q = torch.softmax(logits, -1)
            m = torch.minimum(p, q)
            top = torch.zeros_like(p, dtype=torch.bool).scatter_(1, top_i, True)
            acc.append(m.sum(-1))
            top_acc.append((m * top).sum(-1))
            tail_acc.append((m * ~top).sum(-1))
            p_tail.append((p * ~top).sum(-1))
            q_tail.append((q * ~top).sum(-1))
            coarse.append(top_acc[-1] + torch.minimum(p_tail[-1], q_tail[-1]))
            ent.append(-(p * p.clamp_min(1e-30).log()).sum(-1))
            for s in SCALES:
                scaled[s].append(torch.minimum(p, torch.softmax(logits * s, -1)).sum(-1))
            if args.examples:
                p_max, p_arg = p.max(-1)
                for n in (p_max > 0.95).nonzero()[:, 0].tolist():
                    token = tok.decode([int(p_arg[n])])
                    sure[token].append(float(acc[-1][n]))
                    if acc[-1][n] < 0.3 and shown < args.examples:
                        r, c = int(rows[n]), int(cols[n])
                        print(f"    sure, missed: {tok.decode(ids[r, max(0, c - 12):c + 1])!r} -> {token!r} "
                              f"target {float(p_max[n]):.3f}, draft {float(q[n, p_arg[n]]):.3f} "
                              f"(draft's first choice {tok.decode([int(q[n].argmax())])!r} {float(q[n].max()):.3f})")
                        shown += 1
        cat = {k: torch.cat(v) for k, v in dict(acc=acc, top=top_acc, tail=tail_acc, p_tail=p_tail,
                                                 q_tail=q_tail, coarse=coarse, ent=ent).items()}
        k = last_val[0][4].shape[1]
        print(f"  {args.data_dir[-1].name} validation, {len(cat['acc'])} positions: acceptance {cat['acc'].mean():.4f} "
              f"= top-{k} {cat['top'].mean():.4f} + tail {cat['tail'].mean():.4f}; tail mass target "
              f"{cat['p_tail'].mean():.4f}, draft {cat['q_tail'].mean():.4f}; coarsened (top-{k} cells + one tail "
              f"cell) {cat['coarse'].mean():.4f}")
        print("  by the target's entropy (nats): " + "; ".join(
            f"{lo}-{hi}: {float(((cat['ent'] >= lo) & (cat['ent'] < hi)).float().mean()):.3f} of positions, "
            f"acceptance {float(cat['acc'][(cat['ent'] >= lo) & (cat['ent'] < hi)].mean()):.3f}"
            for lo, hi in ENTROPY_BINS))
        print("  draft logits x s: " + ", ".join(f"s={s}: {torch.cat(v).mean():.4f}" for s, v in scaled.items()))
        if args.examples:
            common = sorted(sure.items(), key=lambda kv: -len(kv[1]))[:15]
            print(f"  {sum(len(v) for v in sure.values())} sure positions; most frequent sure tokens "
                  "(count, mean acceptance): " + ", ".join(f"{t!r} {len(v)} {sum(v) / len(v):.2f}" for t, v in common))
        print(f"  ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
