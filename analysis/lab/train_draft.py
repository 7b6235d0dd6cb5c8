"""Distil the embedded drafts (``otm/draft_model/``, ``otm/draft_small/``) from the embedded SmolLM2-135M target.

Two phases, both seeded; run them together (default) or apart:

``data``  The target answers a fixed, seeded set of instruct prompts (templates x topics written
          below, chat template applied), sampling at temperature 1 with no top-k/top-p, the way
          the decoder samples. It runs in bf16 here (``--gen-dtype``; 3.7x faster than fp32 on
          this AVX512-BF16 CPU, logits within bf16 rounding of the fp32 target). At every generated position a forward hook on the target's
          ``lm_head`` records (a) the final normed hidden state (576 floats, stored fp16): the
          target's *full* next-token law is ``softmax(hidden @ E.T)`` with its tied embedding
          ``E``, so 1.1 kB per token stores a 49152-way distribution; (b) the law's top-k
          masses and token ids (k = 128), which make training cheap. Shards go to
          ``cache_dir()/draft_data/<config hash>/`` (never into the repo) and a rerun resumes
          where the last one stopped.

``train`` A small Llama draft (hidden 128, tied embeddings) is initialised with the target's
          embeddings projected on their top-128 principal directions (PCA), then trained to
          minimise KL(target || draft) at every generated position of the cached sequences
          (prompt tokens are context only): by default on the target's top-k cells plus one
          tail cell (``--loss topk``), or over the full vocabulary recomputed from the stored
          hidden state (``--loss full``, about 3x the cost per step). The draft's forward and
          backward run under bf16 autocast (fp32 weights and loss). The best checkpoint on a
          validation split of the generated data (48 sequences; exact full-vocabulary KL and
          acceptance sum_x min(target, draft) from the stored hidden states) is saved in fp16 to
          ``--out`` (required: the lab never writes into the package by itself) as config.json + model.safetensors, the tied
          head stored once; the draft uses the target's tokenizer.

The committed token-only draft ``otm/draft_small/`` is the fourth round of this script, the
committed default ``otm/draft_model/`` the seventh (``--arch features``; ``docs/models.md``, history
in ``docs/results_log.md``): data from the template prompt sets and from ``--prompt-set self`` (user
messages written by the target itself), and the loss ``KL + w (1 - acceptance)``
(``--tv-weight 20``), which puts the quantity speculative sampling pays for into the objective.

Distilling on full next-token laws is far more sample-efficient than on sampled text: every
position carries a whole distribution, not one token, and the acceptance
``sum_x min(target(x), draft(x)) = 1 - TV`` that speculative decoding reaches is what this
loss pulls up. The held-out evaluation is ``analysis/lab/eval_draft.py`` (prompts disjoint from
the ones below).

    python analysis/lab/train_draft.py --out /tmp/draft      # data (cached) + train, ~60 min on 2 cores
    python analysis/lab/train_draft.py --phase data --workers 2 --worker 0 &   # data in two processes
    python analysis/lab/train_draft.py --phase data --workers 2 --worker 1
    python analysis/lab/train_draft.py --phase train --threads 2 --out /tmp/draft

``--arch features`` (sixth and seventh rounds, the committed default ``otm/draft_model/``) trains a draft that
reads the target's features instead (EAGLE-style, ``otm/decode/feature_draft.py``): one Llama layer on
the target's embedding and head, fed (token, the target's feature at the previous position);
the shards' stored hidden states are those features, the prompt positions' are computed once and
cached (``pfeat_XXXX.pt``); loss = the same KL + w (1 - acceptance) + a smooth-L1 term on the
guessed features. The committed token-only draft is ``otm/draft_small/``; a trained draft is
committed by copying ``--out`` over one of the two directories.

Results, timings and the exact commands used: ``docs/models.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from draftlab import (  # noqa: F401 (ttt_mask: imported here too, the tests patch it through draftlab)
    HELD_OUT_PROMPTS,
    PROMPT_SETS,
    SELF_MIN_CHARS,
    SELF_OVERSAMPLE,
    SELF_QUERY_TOKENS,
    chain_length,
    conditions,
    draft_logits,
    evaluate,
    feature_draft_hidden,
    kl_and_acceptance,
    load_examples,
    load_target,
    log,
    make_batch,
    split_examples,
    topk_kl_and_acceptance,
    ttt_mask,
)

from otm.decode.embedded import cache_dir

# ---------------------------------------------------------------------------------------------
# Prompt set "self" (training prompts: draftlab.py, beside the disjoint held-out prompts).



# ---------------------------------------------------------------------------------------------

# Prompt set "v2" (``--prompt-set v2``, added in the second round): other request styles (direct
# "how does it work" questions, how-to and advice, short creative forms, notes, names, reviews,
# plans) on other, everyday topics. Written without looking at per-prompt scores; it shares
# *styles* with the held-out prompts of analysis/lab/eval_draft.py (that was the point: the first
# round's held-out prompts scored 0.06 below its training style) but none of their topics, and
# no training prompt equals a held-out one (checked in training_prompts and by eval_draft.py).




# Prompt set "self" (``--prompt-set self``, fourth round): no templates at all. The target writes
# the user messages itself: given only the chat template up to the start of a user turn (system
# prompt, then "<|im_start|>user\n"), it samples at temperature 1 what a user would ask, the
# requests its instruction tuning taught it to expect (the "Magpie" recipe of Xu et al. 2024,
# "Alignment data synthesis from scratch by prompting aligned LLMs with nothing"). It then
# answers each of them as for the other sets. Both halves are the target's own text, seeded per
# batch; a message must end with the end-of-turn token within SELF_QUERY_TOKENS tokens, have at
# least SELF_MIN_CHARS characters and differ from every held-out prompt, else it is dropped.



# ---------------------------------------------------------------------------------------------

DRAFT_CONFIG = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
"""Draft architecture (LlamaForCausalLM); vocab and special token ids come from the target."""


def self_prompts(model, tokenizer, n: int, seed: int) -> list[str]:
    """Up to ``n`` user messages written by the target itself (prompt set "self", see above)."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False)
    pre = chat[: chat.index("\x00")]  # system turn + "<|im_start|>user\n"
    m = math.ceil(n * SELF_OVERSAMPLE)
    enc = tokenizer([pre] * m, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=SELF_QUERY_TOKENS, pad_token_id=tokenizer.pad_token_id)
    held_out = set(HELD_OUT_PROMPTS)
    prompts = []
    for row in out[:, enc["input_ids"].shape[1]:]:
        ended = (row == tokenizer.eos_token_id).nonzero()
        if len(ended) == 0:
            continue  # no end of turn within the budget: an unfinished message
        text = tokenizer.decode(row[: ended[0, 0]], skip_special_tokens=True).strip()
        if len(text) >= SELF_MIN_CHARS and text not in held_out:
            prompts.append(text)
    return prompts[:n]


def training_prompts(n: int, seed: int, prompt_set: str = "v1") -> list[str]:
    """``n`` distinct user messages: templates x topics of ``prompt_set``, shuffled with ``seed``."""
    templates, topics = PROMPT_SETS[prompt_set]
    pairs = [t.format(topic) for t in templates for topic in topics]
    overlap = set(pairs).intersection(HELD_OUT_PROMPTS)
    if overlap:
        raise SystemExit(f"training prompts equal to held-out ones: {sorted(overlap)}")
    rng = random.Random(seed)
    rng.shuffle(pairs)
    if n > len(pairs):
        raise SystemExit(f"asked for {n} prompts, only {len(pairs)} exist")
    return pairs[:n]








# ---------------------------------------------------------------------------------------------
# Phase 1: target-generated sequences with the target's final hidden states


def data_dir(args) -> Path:
    key = json.dumps(
        dict(seed=args.seed, batch_size=args.batch_size, new_tokens=args.new_tokens, top_k=args.top_k,
             gen_dtype=args.gen_dtype, v=3)
        | ({} if args.prompt_set == "v1" else dict(prompt_set=args.prompt_set)),  # v1 keeps its hash
        sort_keys=True,
    )
    return cache_dir() / "draft_data" / hashlib.sha256(key.encode()).hexdigest()[:12]


def check_meta(path: Path, meta: dict) -> None:
    """Refuse to add shards to a data directory made with other settings (one line, exit).

    A key the existing ``meta.json`` lacks is accepted (files written before that key existed);
    a key present with another value means the cached shards were made differently."""
    if not path.exists():
        return
    old = json.loads(path.read_text())
    differ = sorted(k for k in meta if k in old and old[k] != meta[k])
    if differ:
        raise SystemExit(
            f"{path.parent} holds shards made with other settings ({', '.join(f'{k}: {old[k]} there, {meta[k]} now' for k in differ)}): "
            "use another --seed or move that directory away")


def generate_data(args) -> Path:
    """Generate ``args.batches`` shards (resumable); return the data directory."""
    out = data_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(seed=args.seed, batch_size=args.batch_size, new_tokens=args.new_tokens, top_k=args.top_k,
                gen_dtype=args.gen_dtype, prompt_set=args.prompt_set)
    if args.prompt_set == "self":  # not in the directory's hash (it predates them): checked here
        meta["self"] = dict(query_tokens=SELF_QUERY_TOKENS, min_chars=SELF_MIN_CHARS, oversample=SELF_OVERSAMPLE)
    check_meta(out / "meta.json", meta)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    mine = range(args.worker, args.batches, args.workers)
    todo = [b for b in mine if not (out / f"shard_{b:04d}.pt").exists()]
    log(f"data: {args.batches} batches of {args.batch_size} prompts x {args.new_tokens} new tokens "
        f"into {out}; worker {args.worker} of {args.workers}: {len(mine) - len(todo)} of its {len(mine)} cached, "
        f"{len(todo)} to generate")
    if not todo:
        return out
    model, tokenizer = load_target(getattr(torch, args.gen_dtype))
    tokenizer.padding_side = "left"
    self_written = args.prompt_set == "self"
    prompts = None if self_written else training_prompts(args.batches * args.batch_size, args.seed, args.prompt_set)
    captured: list[torch.Tensor] = []
    top: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(_module, inputs, output):
        captured.append(inputs[0][:, -1, :].to(torch.float16))
        top.append(torch.softmax(output[:, -1, :].float(), dim=-1).topk(args.top_k, dim=-1))

    tokens = 0
    start = time.time()
    bar = tqdm(todo, desc="generate", unit="batch")
    for b in bar:
        if self_written:  # before the hook: the user messages are context, not training positions
            batch = self_prompts(model, tokenizer, args.batch_size, args.seed * 100003 + b + 10**9)
        else:
            batch = prompts[b * args.batch_size:(b + 1) * args.batch_size]
        enc = tokenizer.apply_chat_template(
            [[{"role": "user", "content": p}] for p in batch],
            add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True,
        )
        torch.manual_seed(args.seed * 100003 + b)
        captured.clear()
        top.clear()
        hook = model.lm_head.register_forward_hook(record)  # records the answers' positions only
        try:
            with torch.no_grad():
                seqs = model.generate(
                    **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                    max_new_tokens=args.new_tokens, pad_token_id=tokenizer.pad_token_id,
                )
        finally:
            hook.remove()
        width = enc["input_ids"].shape[1]
        new = seqs[:, width:]  # [B, T]
        hidden = torch.stack(captured, dim=1)  # [B, T, 576]
        top_p = torch.stack([t.values for t in top], dim=1)  # [B, T, K], descending
        top_i = torch.stack([t.indices.to(torch.int32) for t in top], dim=1)  # [B, T, K]
        assert hidden.shape[1] == new.shape[1], (hidden.shape, new.shape)
        eos = new == tokenizer.eos_token_id
        # a step is valid when no EOS came before it (the EOS step itself is valid)
        valid = (eos.cumsum(dim=1) - eos.long()) == 0
        prompt_ids = [ids[m.bool()] for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        if b == todo[0]:  # the stored fp16 hidden state reproduces the target's logits
            with torch.no_grad():
                ref = model(input_ids=prompt_ids[0][None]).logits[0, -1].float()
                rec = hidden[0, 0].float() @ model.lm_head.weight.float().T
            log(f"data: max |logit(stored fp16 hidden) - logit(target)| = {(rec - ref).abs().max().item():.4f}"
                f" (logit range {ref.min().item():.1f}..{ref.max().item():.1f})")
        tmp = out / f".shard_{b:04d}.pt.tmp"
        torch.save(dict(prompts=batch, prompt_ids=prompt_ids, new_ids=new, valid=valid, hidden=hidden,
                        top_p=top_p, top_i=top_i), tmp)
        os.replace(tmp, out / f"shard_{b:04d}.pt")
        tokens += int(valid.sum())
        bar.set_postfix(tokens=tokens, tok_s=f"{tokens / (time.time() - start):.0f}")
    log(f"data: {tokens} valid positions in {time.time() - start:.0f} s")
    return out


# ---------------------------------------------------------------------------------------------
# Phase 2: distillation










def pca_embeddings(embed: torch.Tensor, dim: int) -> torch.Tensor:
    """Project the target's embeddings [V, 576] on their top-``dim`` principal directions.

    Uncentred, so that logits ``h @ E.T`` keep their meaning: with ``P`` [576, dim] the top
    right singular vectors, the draft head ``E P`` gives for ``h' = P.T h`` the logits
    ``h @ P P.T @ E.T``, the best rank-``dim`` approximation of the target's head. The draft
    starts with the target's notion of which tokens are alike instead of random vectors; no
    rescaling is needed because the draft's final RMSNorm weight learns the hidden scale.
    """
    _, _, vh = torch.linalg.svd(embed.double(), full_matrices=False)
    proj = vh[:dim].T  # [576, dim]
    return (embed.double() @ proj).float(), proj.float()


def build_draft(target, tokenizer, seed: int, sample_hidden: torch.Tensor):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tc = target.config
    cfg = dict(DRAFT_CONFIG)
    rope_theta = cfg.pop("rope_theta")
    config = LlamaConfig(
        vocab_size=tc.vocab_size, bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        **cfg,
    )
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        emb, proj = pca_embeddings(target.get_input_embeddings().weight, config.hidden_size)
        draft.get_input_embeddings().weight.copy_(emb)
        # start near-uniform: the final RMSNorm output has norm sqrt(H) x weight; at one tenth of
        # the target's projected hidden norm ||P.T h|| the random initial layers cannot make
        # confident wrong guesses (initial KL ~8 nats instead of ~44)
        scale = (sample_hidden.float() @ proj).norm(dim=-1).mean() / math.sqrt(config.hidden_size)
        draft.model.norm.weight.fill_(0.1 * float(scale))
    if draft.get_output_embeddings().weight.data_ptr() != draft.get_input_embeddings().weight.data_ptr():
        raise SystemExit("draft head is not tied to its embedding")
    return draft






def train(args, paths: list[Path]) -> None:
    if args.arch == "features":
        return train_features(args, paths)
    from safetensors.torch import save_file

    target, tokenizer = load_target()
    head = target.lm_head.weight.detach().clone()  # [V, 576], tied to the target's embedding
    # each data directory is split on its own, the way a single directory always was, so the
    # first round's validation sequences stay held back when its draft is trained further
    val, tr, shards = [], [], 0
    for path in paths:
        examples, n = load_examples([path], args.max_shards)
        shards += n
        v, t = split_examples(examples, args.seed)
        val += v
        tr += t
    rng = random.Random(args.seed)
    positions = sum(e[2].shape[0] for e in tr)
    log(f"train: {shards} shards, {len(tr)} sequences ({positions} generated positions) for training, "
        f"{len(val)} ({sum(e[2].shape[0] for e in val)}) for validation")
    torch.manual_seed(args.seed)
    if args.init_from:
        from otm.decode.models import load_draft

        draft = load_draft(args.init_from, target).train()  # fp32, like the target here
        log(f"train: continuing from the draft in {args.init_from}")
    else:
        draft = build_draft(target, tokenizer, args.seed, torch.cat([e[2] for e in tr[:32]]))
    del target
    n_params = sum(p.numel() for p in draft.parameters())
    n_train = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    init = "from " + str(args.init_from) if args.init_from else "PCA-initialised tied embedding"
    log(f"train: draft {draft.config.num_hidden_layers} layers x {draft.config.hidden_size} hidden, "
        f"{n_params / 1e6:.2f} M parameters ({n_train / 1e6:.2f} M trained), {init}")
    pad_id = tokenizer.pad_token_id
    kl0, acc0 = evaluate(draft, head, val, pad_id, args.batch_seqs)
    log(f"train: before training: val KL {kl0:.3f}, val acceptance {acc0:.4f}")

    trainable = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    state = {"epoch": 0}
    step, best = 0, (-1.0, None)
    start = time.time()
    bar = tqdm(total=args.steps, desc="train", unit="step")
    for batch in time_boxed_batches(tr, args, rng, state):
        lr = set_lr(opt, args, step, start)
        ids, rows, cols, hidden, top_p, top_i = make_batch(batch, pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            logits = draft_logits(draft, ids, rows, cols)
        if args.loss == "full":
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
                target_logits = hidden.float() @ head.T
            kl, acc_g = kl_and_acceptance(logits, target_logits)
        else:
            kl, acc_g = topk_kl_and_acceptance(logits, top_p, top_i)
        acc = acc_g.detach()
        loss = kl if args.tv_weight == 0 else kl + args.tv_weight * (1.0 - acc_g)
        optimizer_step(opt, loss, trainable)
        step += 1
        bar.update(1)
        bar.set_postfix(epoch=state['epoch'], kl=f"{kl.item():.3f}", acc=f"{acc.item():.3f}", lr=f"{lr:.1e}")
        if step % args.eval_every == 0:
            vkl, vacc = evaluate(draft, head, val, pad_id, args.batch_seqs)
            log(f"train: step {step} epoch {state['epoch']} {time.time() - start:.0f} s: "
                f"val KL {vkl:.3f}, val acceptance {vacc:.4f}")
            if vacc > best[0]:
                best = (vacc, trained_state(draft))
                save(draft, args.out, save_file)
    bar.close()
    if step < args.steps:
        log(f"train: stopped by the --minutes limit at step {step} of {args.steps}")
    vkl, vacc = evaluate(draft, head, val, pad_id, args.batch_seqs)
    log(f"train: final step {step} epoch {state['epoch']} {time.time() - start:.0f} s: val KL {vkl:.3f}, "
        f"val acceptance {vacc:.4f}")
    if vacc > best[0]:
        best = (vacc, None)
        save(draft, args.out, save_file)
    else:
        draft.load_state_dict(best[1], strict=False)  # the frozen (shared) embedding never changed
        save(draft, args.out, save_file)
    log(f"train: saved the best draft (val acceptance {best[0]:.4f}) to {args.out}")


# ---------------------------------------------------------------------------------------------
# --arch features: a draft that reads the target's features (EAGLE; otm/decode/feature_draft.py)


def prompt_features(shard: Path, prompts: list[torch.Tensor], target_bf16) -> list[torch.Tensor]:
    """The target's features (fp16 ``[p - 1, H]``) at each prompt's positions 0 .. p-2 of one
    shard (its stored hidden states start at p - 1). Computed once with the bf16 target, the way
    the shards' own features were, and cached next to the shard (``pfeat_XXXX.pt``)."""
    side = shard.with_name("pfeat_" + shard.name.split("_", 1)[1])
    if side.exists():
        return torch.load(side)
    width = max(len(x) for x in prompts)
    ids = torch.full((len(prompts), width), 2, dtype=torch.long)  # right padding: never seen by a real token
    for i, x in enumerate(prompts):
        ids[i, : len(x)] = x
    with torch.no_grad():
        hidden = target_bf16.model(input_ids=ids).last_hidden_state  # [B, width, H], after the final norm
    feats = [hidden[i, : len(x) - 1].to(torch.float16).clone() for i, x in enumerate(prompts)]
    torch.save(feats, side.with_suffix(".tmp"))
    os.replace(side.with_suffix(".tmp"), side)
    return feats


def load_feature_examples(path: Path, target_bf16, max_shards: int | None):
    """:func:`load_examples` with each sequence's prompt features appended (``[p - 1, H]`` fp16)."""
    return load_examples([path], max_shards, extra=lambda shard, d: prompt_features(shard, d["prompt_ids"], target_bf16))


def make_feature_batch(examples, pad_id: int):
    """``make_batch`` plus the true features ``[B, S, H]`` (zeros where none: last position, pads)
    and a mask of the positions that have one: the prompt's (positions 0 .. p-2) then the stored
    hidden states (p-1 .. S-2)."""
    ids, rows, cols, hidden, top_p, top_i = make_batch([e[:5] for e in examples], pad_id)
    B, S = ids.shape
    feats = torch.zeros(B, S, examples[0][2].shape[1])
    has = torch.zeros(B, S, dtype=torch.bool)
    for i, (_, _, h, _, _, pf) in enumerate(examples):
        n = pf.shape[0] + h.shape[0]
        feats[i, :n] = torch.cat([pf, h]).float()
        has[i, :n] = True
    return ids, rows, cols, hidden, top_p, top_i, feats, has


def evaluate_features(draft, head, examples, pad_id, batch_size, depth: int = 1):
    """Validation: exact full-vocabulary KL and acceptance at every generated position for each
    depth 1 .. ``depth`` (depth 1: true features; deeper: the training-time test's guessed
    features), and the depth-1 features' mean squared error. Returns (KLs, acceptances, MSE)."""
    draft.eval()
    accs, kls, n, se, m = [0.0] * depth, [0.0] * depth, 0, 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            ids, rows, cols, hidden, _, _, feats, has = make_feature_batch(examples[i:i + batch_size], pad_id)
            hs = feature_draft_hidden(draft, ids, feats, 0.0, depth=depth)
            target_logits = hidden.float() @ head.T
            for d, h in enumerate(hs):
                kl, acc = kl_and_acceptance(draft.logits(h[rows, cols]), target_logits)
                accs[d] += acc.item() * len(rows)
                kls[d] += kl.item() * len(rows)
            n += len(rows)
            se += (hs[0] - feats)[has].pow(2).sum().item()
            m += int(has.sum()) * hs[0].shape[-1]
    draft.train()
    return [x / n for x in kls], [x / n for x in accs], se / m


def train_features(args, paths: list[Path]) -> None:
    from otm.decode.feature_draft import build_feature_draft, load_feature_draft, save_feature_draft

    target, tokenizer = load_target()
    target_bf16 = load_target(torch.bfloat16)[0]
    val, tr, shards = [], [], 0
    for path in paths:
        examples, n = load_feature_examples(path, target_bf16, args.max_shards)
        shards += n
        v, t = split_examples(examples, args.seed)
        val += v
        tr += t
    del target_bf16
    positions = sum(e[2].shape[0] for e in tr)
    log(f"train: {shards} shards, {len(tr)} sequences ({positions} generated positions) for training, "
        f"{len(val)} ({sum(e[2].shape[0] for e in val)}) for validation")
    # the draft trains on frozen copies of the target's embedding and head (the target is dropped)
    emb = target.get_input_embeddings().weight.detach().clone().requires_grad_(False)
    target.get_input_embeddings().weight = torch.nn.Parameter(emb, requires_grad=False)
    target.lm_head.weight = target.get_input_embeddings().weight
    if args.init_from:
        draft = load_feature_draft(args.init_from, target).train()
        log(f"train: continuing from the feature draft in {args.init_from}")
    else:
        draft = build_feature_draft(target, layers=args.feature_layers, intermediate=args.intermediate_features,
                                    seed=args.seed).train()
    head = emb
    del target
    n_train = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    log(f"train: feature draft, {draft.config.num_hidden_layers} layer(s) x {draft.config.hidden_size} hidden, "
        f"MLP {draft.config.intermediate_size}, {n_train / 1e6:.2f} M trained parameters (embedding and head: "
        f"the target's, frozen, not saved); loss KL + {args.tv_weight} (1 - acceptance) on top-{args.top_k} cells "
        f"+ {args.reg_weight} x feature smooth-L1; input noise {args.feature_noise} RMS"
        + (f"; training-time test over depths 1-{args.ttt_depth}, each weighing the same" if args.ttt_depth > 1 else ""))
    pad_id = tokenizer.pad_token_id
    D = args.ttt_depth

    def report(kls, accs, mse) -> str:
        per = ", ".join(f"{a:.4f}" for a in accs)
        return (f"val KL {kls[0]:.3f}, val acceptance {accs[0]:.4f}" + (f" (depths 1-{D}: {per}; chain proxy "
                f"{chain_length(accs):.4f})" if D > 1 else "") + f", feature MSE {mse:.4f}")
    log(f"train: before training: {report(*evaluate_features(draft, head, val, pad_id, args.batch_seqs, D))}")
    trainable = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    state = {"epoch": 0}
    step, best = 0, -1.0

    def checkpoint(label: str, best: float) -> float:
        """Validate, log, save the draft if it is the best so far; the best validation acceptance."""
        kls, accs, mse = evaluate_features(draft, head, val, pad_id, args.batch_seqs, D)
        log(f"train: {label} epoch {state['epoch']} {time.time() - start:.0f} s: {report(kls, accs, mse)}")
        score = chain_length(accs) - 1.0  # = the depth-1 acceptance when D = 1
        if score > best:
            save_feature_draft(draft, args.out)
            return score
        return best
    start = time.time()
    bar = tqdm(total=args.steps, desc="train", unit="step")
    for batch in time_boxed_batches(tr, args, rng, state):
        lr = set_lr(opt, args, step, start)
        ids, rows, cols, _, top_p, top_i, feats, has = make_feature_batch(batch, pad_id)
        kl = acc_g = reg = 0.0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            hs = feature_draft_hidden(draft, ids, feats, args.feature_noise, gen, depth=D)
            logits = [draft.logits(h[rows, cols]) for h in hs]
        for h, lg in zip(hs, logits):  # every depth weighs the same
            kl_d, acc_d = topk_kl_and_acceptance(lg, top_p, top_i)
            kl, acc_g = kl + kl_d / D, acc_g + acc_d / D
            reg = reg + torch.nn.functional.smooth_l1_loss(h.float()[has], feats[has]) / D
        loss = kl + args.tv_weight * (1.0 - acc_g) + args.reg_weight * reg
        optimizer_step(opt, loss, trainable)
        step += 1
        bar.update(1)
        bar.set_postfix(epoch=state['epoch'], kl=f"{kl.item():.3f}", acc=f"{acc_g.item():.3f}", reg=f"{reg.item():.3f}",
                        lr=f"{lr:.1e}")
        if step % args.eval_every == 0:
            best = checkpoint(f"step {step}", best)
    bar.close()
    if step < args.steps:
        log(f"train: stopped by the --minutes limit at step {step} of {args.steps}")
    best = checkpoint(f"final step {step}", best)
    log(f"train: saved the best feature draft (val {'acceptance' if D == 1 else 'chain proxy - 1'} {best:.4f}) to {args.out}")


def time_boxed_batches(tr: list, args, rng, state: dict):
    """Batches of ``args.batch_seqs`` sequences, reshuffled each epoch, until ``args.steps``
    batches or ``args.minutes`` have passed; ``state["epoch"]`` follows the epochs."""
    deadline = time.time() + args.minutes * 60
    given = 0
    while True:
        rng.shuffle(tr)
        for i in range(0, len(tr), args.batch_seqs):
            if time.time() >= deadline or given >= args.steps:
                return
            yield tr[i:i + args.batch_seqs]
            given += 1
        state["epoch"] += 1


def set_lr(opt, args, step: int, start: float) -> float:
    """Linear warm-up, then cosine from ``args.lr`` to a tenth of it over ``args.steps`` (or over
    ``args.minutes`` with ``--schedule-by-time``, whichever comes first); sets and returns it."""
    progress = step / args.steps
    if args.schedule_by_time:  # the cosine follows whichever limit comes first
        progress = max(progress, (time.time() - start) / (args.minutes * 60))
    lr = args.lr * min(1.0, (step + 1) / args.warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
    for g in opt.param_groups:
        g["lr"] = lr
    return lr


def optimizer_step(opt, loss, trainable) -> None:
    """One AdamW step with gradients clipped at norm 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()


def trained_state(draft) -> dict:
    """A copy of the draft's state without its frozen tensors (the shared embedding/head: 113 MB
    in fp32, stored twice in ``state_dict`` because the head is tied to it)."""
    frozen = {p.data_ptr() for p in draft.parameters() if not p.requires_grad}
    return {k: v.detach().clone() for k, v in draft.state_dict().items() if v.data_ptr() not in frozen}


def save(draft, out: Path, save_file) -> None:
    """Write config.json + fp16 model.safetensors (tied head stored once) atomically enough."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = draft.config.to_dict()
    cfg["dtype"] = "float16"
    cfg["architectures"] = ["LlamaForCausalLM"]
    for noise in ("id2label", "label2id", "_name_or_path", "problem_type", "chunk_size_feed_forward"):
        cfg.pop(noise, None)
    cfg.pop("transformers_version", None)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in draft.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "data", "train"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=60, help="generation batches (shards)")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--new-tokens", type=int, default=192, help="max generated tokens per prompt")
    ap.add_argument("--workers", type=int, default=1,
                    help="data: generate shards b with b %% workers == worker (run one process each)")
    ap.add_argument("--worker", type=int, default=0)
    ap.add_argument("--gen-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="target dtype while generating data (bf16 is ~3.7x faster on AVX512-BF16 CPUs)")
    ap.add_argument("--top-k", type=int, default=128, help="target top-k masses stored per position")
    ap.add_argument("--max-shards", type=int, default=None, help="train on the first N shards only")
    ap.add_argument("--steps", type=int, default=2400, help="training steps (cosine schedule length)")
    ap.add_argument("--minutes", type=float, default=120.0,
                    help="wall-clock safety limit for training; stops early (and says so) if reached")
    ap.add_argument("--batch-seqs", type=int, default=8, help="sequences per training step")
    ap.add_argument("--loss", choices=["topk", "full"], default="topk",
                    help="KL on the stored top-k cells + tail (cheap) or on the full law from the hidden state")
    ap.add_argument("--tv-weight", type=float, default=0.0,
                    help="train: loss = KL + w (1 - acceptance), the acceptance sum min(target, draft) "
                         "on the same cells as the KL (total variation, the quantity speculative "
                         "decoding pays for; DistillSpec, Zhou et al. 2024); 0 = KL only")
    ap.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=True,
                    help="bf16 autocast for the draft's forward/backward in training (fp32 weights, "
                         "fp32 loss; ~3x faster matmuls on AVX512-BF16 CPUs); validation runs in fp32")
    ap.add_argument("--data-dir", type=Path, nargs="+", default=None,
                    help="train on the shards of these directories instead (several: their union)")
    ap.add_argument("--prompt-set", choices=sorted(PROMPT_SETS) + ["self"], default="v1",
                    help="data: which templates x topics the target answers (v2: other styles and "
                         "topics; self: user messages written by the target itself)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="train: start from this draft directory instead of the PCA initialisation")
    ap.add_argument("--schedule-by-time", action="store_true",
                    help="train: the cosine lr schedule ends at --minutes if that comes before --steps")
    ap.add_argument("--arch", choices=["small", "features"], default="small",
                    help="train: 'small' = the 128-wide PCA-initialised token-only draft (otm/draft_small); "
                         "'features' = a draft that reads the target's features (EAGLE, otm/decode/feature_draft.py; "
                         "the committed default otm/draft_model)")
    ap.add_argument("--feature-layers", type=int, default=1, help="train, --arch features: decoder layers")
    ap.add_argument("--intermediate-features", type=int, default=None,
                    help="train, --arch features: MLP width (default: the target's)")
    ap.add_argument("--reg-weight", type=float, default=1.0,
                    help="train, --arch features: weight of the smooth-L1 loss on the guessed features")
    ap.add_argument("--feature-noise", type=float, default=0.05,
                    help="train, --arch features: Gaussian noise on the input features, in feature RMS")
    ap.add_argument("--ttt-depth", type=int, default=1,
                    help="train, --arch features: EAGLE-3's training-time test over depths 1..N (the draft "
                         "reads its own guessed features at depth >= 2, attending as the decoder's chain does); "
                         "1 = teacher forcing on true features only")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 per process is much faster on a shared 2-core machine")
    ap.add_argument("--out", type=Path, default=None,
                    help="train: the directory the trained draft is written to (required for training; "
                         "copy it over otm/draft_model or otm/draft_small by hand to commit it)")
    args = ap.parse_args(argv)
    if args.phase in ("all", "train") and args.out is None:
        ap.error("--out DIR is required for training: the lab never writes into the package by itself")
    if args.ttt_depth < 1:
        ap.error(f"--ttt-depth must be at least 1, got {args.ttt_depth}")
    torch.set_num_threads(args.threads)
    conditions(args)
    paths = args.data_dir or [data_dir(args)]
    if args.phase in ("all", "data"):
        paths = [generate_data(args)]
    if args.phase in ("all", "train"):
        train(args, paths)


if __name__ == "__main__":
    main()
