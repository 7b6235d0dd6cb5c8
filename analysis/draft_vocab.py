"""The embedded target's token ranking for FR-Spec drafts, and the table that chose S.

``rank``: the target (SmolLM2-135M-Instruct, the embedded fp32 copy run in ``--dtype``) continues
``--prompts`` of the lab's training prompts (``analysis/lab/draftlab.py``: every template x topic
of both prompt sets, shuffled with ``--seed``; the lab's held-out prompts and the bench's prompts
are not among them) by ``--tokens`` tokens at temperature 1 through transformers' ``generate``
(batches of ``--batch``, left padding), and adds up, at every generated position before EOS, the
target's whole next-token law (a Rao-Blackwellised token count: each position counts every token by
its probability, not only the one drawn). Token ids sorted by that mass, most first, are written as
int32 to ``otm/token_ranking/smollm2-135m-instruct.npy`` (ties by id). No download: the prompts are
templates in the repository and the target is the embedded one.

``table``: for each S in ``--sizes``, on the lab's held-out prompts (disjoint from the ranking's):
the target mass inside the subset, the depth-1 acceptance of k = 1 speculative sampling with the
embedded feature draft restricted to S (sum min(p, q_S) at real positions of the target's own
continuations, ``otm.decode.profile.continuation_laws``; q_S is q renormalised on the subset, which
is exactly what the restricted head computes) and the draft's milliseconds per call in the decoder's
own path (feature forward of one element at batch 1 and batch 4 after a 200-token context, head,
float64 laws), median of ``--repeats``. Prints a markdown table.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/draft_vocab.py rank     # ~2 min on 1 core
    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python analysis/draft_vocab.py table    # ~2 min
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "analysis" / "lab"))

from otm.decode.draft_vocab import RANKING_FILE  # noqa: E402


def load(dtype: str, draft_vocab=None):
    from otm.decode.models import load_pair

    return load_pair(None, None, dtype=dtype, draft_vocab=draft_vocab)


def rank(args) -> None:
    from draftlab import HELD_OUT_PROMPTS, all_training_prompts

    from otm.decode.bench import PROMPTS as BENCH_PROMPTS, encode_prompt

    target, _, tok = load(args.dtype)
    prompts = sorted(all_training_prompts() - set(HELD_OUT_PROMPTS) - set(BENCH_PROMPTS))
    random.Random(args.seed).shuffle(prompts)
    prompts = prompts[: args.prompts]
    V = target.config.vocab_size
    mass = torch.zeros(V, dtype=torch.float64)
    positions = 0
    tok.padding_side = "left"
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    for b in range(0, len(prompts), args.batch):
        rows = [encode_prompt(tok, p) for p in prompts[b : b + args.batch]]
        width = max(map(len, rows))
        ids = torch.tensor([[tok.pad_token_id or 0] * (width - len(r)) + r for r in rows])
        attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.inference_mode():
            out = target.generate(ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=args.tokens, output_logits=True, return_dict_in_generate=True,
                                  pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
        alive = torch.ones(len(rows), dtype=torch.bool)
        for t, logits in enumerate(out.logits):  # [B, V] per generated position
            law = torch.softmax(logits.double(), -1)
            mass += law[alive].sum(0)
            positions += int(alive.sum())
            alive &= out.sequences[:, width + t] != tok.eos_token_id  # positions after EOS do not count
        print(f"{b + len(rows)}/{len(prompts)} prompts, {positions} positions, {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
    order = np.lexsort((np.arange(V), -mass.numpy()))  # by mass, most first; ties by id
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.save(out_path, order.astype(np.int32))
    cum = np.cumsum(mass.numpy()[order]) / mass.sum().item()
    print(f"wrote {out_path}: {V} ids; {len(prompts)} prompts, {positions} positions, dtype {next(target.parameters()).dtype}, seed {args.seed}")
    for s in (512, 1024, 2048, 4096, 8192, 16384, 32768):
        print(f"  mean target mass inside the top {s}: {cum[s - 1]:.4f}")


def _ms_per_call(draft, dtype, k: int, repeats: int) -> float:
    """Median ms of one decoder draft call: feature forward of one element per row, head, float64 laws."""
    from otm.decode.sampling import Sampling, next_token_laws

    H = draft.config.hidden_size
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        ctx = torch.randint(0, draft.config.vocab_size, (1, 200), generator=g)
        cache = draft(ctx, torch.randn(1, 200, H, generator=g).to(dtype), use_cache=True).past_key_values
        if k > 1:
            cache.batch_repeat_interleave(k)
        ids = torch.randint(0, draft.config.vocab_size, (k, 1), generator=g)
        feats = torch.randn(k, 1, H, generator=g).to(dtype)
        times = []
        for _ in range(repeats + 2):
            t0 = time.perf_counter()
            h = draft(ids, feats, position_ids=torch.full((k, 1), 200), past_key_values=cache, use_cache=True).hidden
            next_token_laws(draft.logits(h[:, -1]), Sampling(), dtype=torch.float64)
            times.append(time.perf_counter() - t0)
            cache.crop(-1)
    return 1000 * float(np.median(times[2:]))


def table(args) -> None:
    from draftlab import HELD_OUT_PROMPTS

    from otm.decode.draft_vocab import restrict_draft, token_ranking
    from otm.decode.profile import continuation_laws, prompt_ids

    target, draft, tok = load(args.dtype)
    dtype = next(target.parameters()).dtype
    V = target.config.vocab_size
    ranking = token_ranking(V).numpy()
    sizes = [int(s) for s in args.sizes.split(",")]
    laws = [continuation_laws(target, draft, prompt_ids(tok, p), positions=args.positions, temperature=1.0, seed=i)
            for i, p in enumerate(HELD_OUT_PROMPTS[: args.held_out])]
    tl = np.concatenate([t for t, _ in laws])  # [n, V]
    dl = np.concatenate([d for _, d in laws])
    print(f"conditions: dtype {dtype}, {torch.get_num_threads()} thread(s), {len(laws)} held-out prompts x "
          f"{args.positions} positions = {len(tl)} positions, temperature 1; load average {os.getloadavg()[0]:.2f} at start")
    print("| S | target mass inside | acceptance at depth 1 (k = 1) | draft ms / call, batch 1 | batch 4 |")
    print("|---|---|---|---|---|")
    for s in sizes:
        inside = np.zeros(V, dtype=bool)
        inside[ranking[:s]] = True
        q = dl * inside
        q = q / q.sum(1, keepdims=True)
        acc = np.minimum(tl, q).sum(1).mean()
        mass = tl[:, inside].sum(1).mean()
        restricted = restrict_draft(_fresh_draft(target), s) if s < V else _fresh_draft(target)
        ms1, ms4 = (_ms_per_call(restricted, dtype, k, args.repeats) for k in (1, 4))
        print(f"| {s if s < V else f'{V} (full)'} | {mass:.4f} | {acc:.4f} | {ms1:.2f} | {ms4:.2f} |", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


def _fresh_draft(target):
    from otm.decode.embedded import default_draft_path
    from otm.decode.models import load_draft

    return load_draft(default_draft_path(), target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rank")
    r.add_argument("--prompts", type=int, default=256)
    r.add_argument("--tokens", type=int, default=64)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--dtype", default="auto")
    r.add_argument("--out", default=str(RANKING_FILE))
    t = sub.add_parser("table")
    t.add_argument("--sizes", default="1024,2048,4096,8192,16384,49152")
    t.add_argument("--held-out", type=int, default=16)
    t.add_argument("--positions", type=int, default=16)
    t.add_argument("--repeats", type=int, default=15)
    t.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank(args) if args.cmd == "rank" else table(args)


if __name__ == "__main__":
    main()
