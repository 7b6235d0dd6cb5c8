"""The draft lab's library: prompt sets, target loading, training data, losses, evaluation.

Shared by ``train_draft.py``, ``eval_draft.py`` and ``diagnose_draft.py`` in this folder (each
imports it as a sibling module; run them as ``python analysis/lab/<script>.py``). Nothing in the
``otm`` package imports the lab: the package only loads what the lab wrote
(:mod:`otm.decode.models`, :mod:`otm.decode.feature_draft`).
"""

from __future__ import annotations

import os
import platform
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from otm.decode.embedded import default_target_path
from otm.decode.feature_draft import draft_logits as feature_draft_logits, target_features
from otm.laws import OtmError

# ---------------------------------------------------------------------------------------------
# Training prompts (train_draft.py) and the disjoint held-out prompts (eval_draft.py)

TEMPLATES = [
    "Write a short story about {}.",
    "Explain {} to a ten-year-old.",
    "What is {}? Answer in a few sentences.",
    "Give me three practical tips about {}.",
    "Write a poem about {}.",
    "Describe the history of {} briefly.",
    "What are the pros and cons of {}?",
    "Write a friendly email to a colleague about {}.",
    "List five interesting facts about {}.",
    "How would you teach a beginner about {}?",
    "Write a dialogue between two friends discussing {}.",
    "Summarize the main ideas behind {}.",
    "Why do people care about {}?",
    "Write a product description inspired by {}.",
    "Compare {} with something from everyday life.",
    "Write a short blog post introduction about {}.",
]


TOPICS = [
    "the ocean", "volcanoes", "honeybees", "the moon", "black holes", "rainforests", "deserts",
    "glaciers", "earthquakes", "thunderstorms", "photosynthesis", "the water cycle", "dinosaurs",
    "whales", "octopuses", "migratory birds", "ants", "mushrooms", "coral reefs", "wolves",
    "the human heart", "sleep", "memory", "vitamins", "exercise", "meditation", "vaccines",
    "the immune system", "nutrition", "breakfast", "coffee", "tea", "bread baking", "pizza",
    "chocolate", "spices", "gardening", "composting", "recycling", "solar energy", "wind power",
    "electric cars", "trains", "bicycles", "airplanes", "rockets", "the internet", "smartphones",
    "computer programming", "Python", "databases", "machine learning", "robots", "video games",
    "chess", "football", "basketball", "swimming", "running a marathon", "mountain climbing",
    "camping", "photography", "painting", "music theory", "the piano", "jazz", "opera",
    "poetry", "novels", "libraries", "museums", "ancient Egypt", "the Roman Empire",
    "the Renaissance", "the printing press", "the industrial revolution", "castles", "pirates",
    "knights", "the Silk Road", "maps", "money", "banks", "saving money", "budgeting",
    "starting a small business", "job interviews", "teamwork", "leadership", "public speaking",
    "learning a language", "grammar", "mathematics", "prime numbers", "geometry", "probability",
    "statistics", "physics", "gravity", "magnets", "electricity", "light", "sound", "atoms",
    "chemistry", "the periodic table", "DNA", "evolution", "cells", "bacteria", "friendship",
    "kindness", "happiness", "time management", "moving to a new city", "weddings", "birthdays",
    "holidays", "winter", "summer", "autumn leaves", "spring flowers", "rain", "snow",
    "cats", "dogs", "horses", "parrots", "goldfish", "zoos", "farms", "cities", "villages",
    "bridges", "skyscrapers", "architecture", "furniture design", "fashion", "knitting",
    "cooking pasta", "vegetarian food", "street food", "restaurants", "travel", "Japan",
    "Brazil", "Italy", "Kenya", "Canada", "islands", "lighthouses", "clocks", "calendars",
]


TEMPLATES_2 = [
    "How does {} work?",
    "Write a haiku about {}.",
    "Write a limerick about {}.",
    "What should I know before trying {}?",
    "Tell me a bedtime story about {}.",
    "Write a thank-you note to someone who taught me about {}.",
    "Can you suggest a name for a shop that is all about {}?",
    "What is the difference between {} and something similar to it?",
    "Describe a typical day for someone whose job involves {}.",
    "What are some common mistakes people make with {}?",
    "Write the opening paragraph of a novel that involves {}.",
    "Give advice to someone who is new to {}.",
    "Write a short speech about {}.",
    "Plan a weekend activity around {}.",
    "Explain {} in simple terms.",
    "Write a short review of a book about {}.",
    "How can I get better at understanding {}?",
    "Write a motivational message that mentions {}.",
    "Describe {} to someone who has never seen it.",
    "Answer briefly: what is the most important thing to know about {}?",
    "I am curious about {}. Where should I start?",
    "Write a short news report about {}.",
    "What questions would a child ask about {}, and how would you answer them?",
    "Tell me a joke about {}, then explain why it is funny.",
]


TOPICS_2 = [
    "a leaky faucet", "umbrellas", "kites", "the post office", "elevators", "microwave ovens",
    "washing machines", "candles", "sourdough starter", "tomato plants", "houseplants",
    "a school science fair", "fireflies", "hedgehogs", "owls", "foxes", "elephants", "giraffes",
    "sea turtles", "jellyfish", "sharks", "frogs", "butterflies", "squirrels", "rabbits",
    "the stock market", "taxes", "credit cards", "renting an apartment", "buying a used car",
    "writing a resume", "volunteering", "board games", "card tricks", "magic shows", "the circus",
    "yoga", "cycling to work", "hiking boots", "sunscreen", "headaches", "drinking water",
    "brushing teeth", "allergies", "first aid", "the dentist", "hospitals", "firefighters",
    "teachers", "nurses", "farmers", "carpenters", "space stations", "Mars", "satellites",
    "telescopes", "comets", "the northern lights", "rainbows", "fog", "hurricanes", "tornadoes",
    "rivers", "lakes", "caves", "waterfalls", "the Great Wall of China", "the Vikings", "samurai",
    "the Olympic Games", "democracy", "elections", "newspapers", "radio", "television",
    "podcasts", "passwords", "cybersecurity", "spreadsheets", "3D printing", "virtual reality",
    "social media", "online shopping", "family dinners", "grandparents", "siblings",
    "the first day at a new school", "graduation", "ice cream", "sandwiches", "rice",
    "apples", "cheese", "soup", "pancakes", "salad", "coffee shops", "train journeys",
    "road trips", "sailing", "skiing", "tennis", "dancing", "singing", "drawing", "origami",
    "pottery", "woodworking", "sewing", "hats", "shoes", "bicycles repair", "batteries",
    "light bulbs", "printers", "keyboards", "the alphabet", "handwriting", "dictionaries",
]


PROMPT_SETS = {"v1": (TEMPLATES, TOPICS), "v2": (TEMPLATES_2, TOPICS_2)}


SELF_QUERY_TOKENS = 96


SELF_MIN_CHARS = 12


SELF_OVERSAMPLE = 1.5


def all_training_prompts() -> set[str]:
    """Every prompt any prompt set can produce (eval_draft.py checks its held-out set against it)."""
    return {t.format(topic) for templates, topics in PROMPT_SETS.values()
            for t in templates for topic in topics}


HELD_OUT_PROMPTS = [
    "How do I fix a flat tire on a wheelbarrow?",
    "Tell me a bedtime story about a lost penguin.",
    "What should I pack for a weekend trip to the mountains?",
    "Explain how a refrigerator keeps food cold.",
    "Write a haiku about a quiet train station at night.",
    "Can you suggest a name for a bakery that sells only croissants?",
    "What is the difference between weather and climate?",
    "Write a thank-you note to a neighbour who watered my plants.",
    "How does a compass work?",
    "Give me a simple recipe for lentil soup.",
    "Why is the sky blue during the day and red at sunset?",
    "Describe a typical day in the life of a lighthouse keeper in 1900.",
    "What are some good habits for studying for exams?",
    "Write a limerick about a forgetful wizard.",
    "How do submarines dive and surface?",
    "Explain what inflation means for someone who just got their first job.",
    "Write the opening paragraph of a mystery novel set in a snowy hotel.",
    "What are the rules of tic-tac-toe?",
    "How can I make my small apartment feel bigger?",
    "Explain how vaccines are tested before they are approved.",
    "Write a short speech for a friend's retirement party.",
    "What causes the tides?",
    "Give advice to someone adopting their first kitten.",
    "Describe the taste of a mango to someone who has never eaten one.",
    "How do noise-cancelling headphones work?",
    "Write a motivational message for a student who failed a test.",
    "What is a sonnet, and how is it structured?",
    "Plan a three-course dinner for a rainy autumn evening.",
    "Explain how a bill becomes a law in simple terms.",
    "What are the main parts of a flower and what do they do?",
    "Write a short review of an imaginary science-fiction film.",
    "How do I politely decline an invitation to a party?",
]


# ---------------------------------------------------------------------------------------------
# Target, data and losses

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def conditions(args) -> None:
    log(
        f"conditions: python {platform.python_version()}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, cpu {platform.processor() or platform.machine()}, "
        f"os.cpu_count {os.cpu_count()}, args {vars(args)}"
    )


def load_target(dtype=torch.float32):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_target_path()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).eval()
    return model, tokenizer


def load_examples(paths: list[Path], max_shards: int | None, extra=None):
    """Per sequence: (ids [L] long, first generated position p, hidden [T, 576] fp16,
    top-k masses [T, K] and their token ids [T, K]), from the shards of every directory.

    ``extra(shard_path, shard)``, if given, returns one more item per sequence of the shard
    (in its order), appended to each tuple."""
    shards = []
    for path in paths:
        found = sorted(path.glob("shard_*.pt"))[:max_shards]
        if not found:
            raise SystemExit(f"no data shards in {path}: run --phase data first")
        shards += found
    examples = []
    for shard in tqdm(shards, desc="load shards", unit="shard"):
        d = torch.load(shard)
        more = extra(shard, d) if extra is not None else [None] * len(d["prompt_ids"])
        for prompt, new, valid, hidden, top_p, top_i, x in zip(
                d["prompt_ids"], d["new_ids"], d["valid"], d["hidden"], d["top_p"], d["top_i"], more):
            t = int(valid.sum())
            if t < 2:
                continue
            examples.append((torch.cat([prompt, new[:t]]).long(), len(prompt), hidden[:t].clone(),
                             top_p[:t].clone(), top_i[:t].long()) + ((x,) if extra is not None else ()))
    return examples, len(shards)


def split_examples(examples, seed: int):
    """(validation, training) sequences of one data directory: shuffled with ``seed``, 5% (8 to
    48 sequences) held back. The split depends on every shard present, so adding shards moves it."""
    examples = list(examples)
    random.Random(seed).shuffle(examples)
    n_val = min(48, max(8, len(examples) // 20))
    return examples[:n_val], examples[n_val:]


def make_batch(examples, pad_id: int):
    """Right-padded ids [B, L]; for each generated position its (row, logit index), the target's
    hidden state, top-k masses and top-k ids (concatenated over the batch: [N, ...]).

    Right padding needs no attention mask: causal attention never lets a real token see the
    pads that follow it."""
    length = max(len(e[0]) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    rows, cols, hidden, top_p, top_i = [], [], [], [], []
    for i, (seq, p, h, tp, ti) in enumerate(examples):
        ids[i, : len(seq)] = seq
        t = h.shape[0]
        rows.append(torch.full((t,), i, dtype=torch.long))
        cols.append(torch.arange(p - 1, p - 1 + t))  # logits at p-1+j predict generated token j
        hidden.append(h)
        top_p.append(tp)
        top_i.append(ti)
    return (ids, torch.cat(rows), torch.cat(cols), torch.cat(hidden), torch.cat(top_p),
            torch.cat(top_i))


def draft_logits(draft, ids, rows, cols):
    """Draft logits [N, V] at the selected positions only (the head is most of the cost)."""
    hidden = draft.model(input_ids=ids).last_hidden_state[rows, cols]  # [N, H]
    return draft.lm_head(hidden)


def topk_kl_and_acceptance(logits, top_p, top_i):
    """KL(target || draft) on the partition {top-k tokens of the target, everything else}.

    A proper KL between the two laws coarsened to k + 1 cells, so its minimum matches the
    target's top-k masses and its tail mass exactly; how the draft spreads the tail is left
    free. Also returns sum over cells of min(target, draft), an upper bound on the acceptance.
    """
    log_d = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    log_dk = log_d.gather(1, top_i)  # [N, K]
    tail_t = (1.0 - top_p.sum(-1)).clamp_min(0.0)  # [N]
    tail_d = (1.0 - log_dk.exp().sum(-1)).clamp_min(1e-8)
    kl = (top_p * (top_p.clamp_min(1e-12).log() - log_dk)).sum(-1) + tail_t * (
        tail_t.clamp_min(1e-12).log() - tail_d.log())
    acc = torch.minimum(top_p, log_dk.exp()).sum(-1) + torch.minimum(tail_t, tail_d)
    return kl.mean(), acc.mean()


def kl_and_acceptance(draft_logits, target_logits):
    """Mean KL(target || draft) and mean sum_x min(target, draft) over rows of [N, V] logits."""
    log_t = torch.log_softmax(target_logits, dim=-1)
    log_d = torch.log_softmax(draft_logits.float(), dim=-1)
    t = log_t.exp()
    kl = (t * (log_t - log_d)).sum(-1)
    acc = torch.minimum(t, log_d.exp()).sum(-1)
    return kl.mean(), acc.mean()


def evaluate(draft, head, examples, pad_id, batch_size):
    draft.eval()
    accs, kls, n = 0.0, 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            ids, rows, cols, hidden, _, _ = make_batch(examples[i:i + batch_size], pad_id)
            logits = draft_logits(draft, ids, rows, cols)
            kl, acc = kl_and_acceptance(logits, hidden.float() @ head.T)
            accs += acc.item() * len(rows)
            kls += kl.item() * len(rows)
            n += len(rows)
    draft.train()
    return kls / n, accs / n


# ---------------------------------------------------------------------------------------------
# Feature drafts: depth >= 2 by EAGLE-3's training-time test (train_draft.py --ttt-depth, eval_draft.py --depths)

def ttt_mask(S: int, depth: int) -> torch.Tensor:
    """Training-time test's attention mask ``[S, depth * S]`` (True = attends) of pass ``depth``.

    The keys are those of passes 1 .. depth, S each, in that order (the draft's KV cache after
    them). Query j of pass d stands for the draft's element at depth d of a chain that starts
    after the accepted context ``x_{<= t}``, t = j - d + 1, as the decoder drafts it
    (:meth:`otm.decode.decoder.Decoder.draft_rows`): it attends to pass 1's keys at positions
    ``<= t`` (the context, read with the target's true features) and to pass e's key at position
    ``t + e - 1`` for e = 2 .. d (the chain's drafted elements, read with guessed features),
    itself last. Pass 1 is the plain causal mask."""
    j = torch.arange(S)[:, None]
    i = torch.arange(S)[None, :]
    blocks = [i <= j - depth + 1] + [i == j - depth + e for e in range(2, depth + 1)]
    return torch.cat(blocks, dim=1)


def feature_draft_hidden(draft, ids, feats, noise: float, generator=None, depth: int = 1) -> list[torch.Tensor]:
    """Draft hidden states ``[B, S, H]`` for right-padded ``ids``, one per depth 1 .. ``depth``.

    Depth 1 reads the true features shifted by one (the input of element j is f_{j-1});
    ``noise`` > 0 adds Gaussian noise of that many feature RMS to them (EAGLE's augmentation).
    Depth d >= 2 is EAGLE-3's training-time test: element j reads the draft's own depth-(d-1)
    guess h_{j-1} instead of f_{j-1} and attends as :func:`ttt_mask` says, so pass d computes, at
    every position at once, exactly what the decoder computes at depth d of a drafted chain
    (``tests/test_train_draft.py`` checks it against the decoder's own incremental drafting)."""
    from otm.decode.feature_draft import shifted_features

    inp = shifted_features(feats)
    if noise > 0:
        scale = noise * feats.pow(2).mean().sqrt()
        inp = inp + scale * torch.randn(inp.shape, generator=generator)
    if depth == 1:
        return [draft(ids, inp).hidden]
    B, S = ids.shape
    positions = torch.arange(S)[None].expand(B, S)
    cache, out = None, []
    for d in range(1, depth + 1):
        mask = ttt_mask(S, d).to(ids.device)[None, None].expand(B, 1, S, d * S)
        step = draft(ids, inp, position_ids=positions, past_key_values=cache, use_cache=True, attention_mask=mask)
        cache = step.past_key_values
        out.append(step.hidden)
        inp = shifted_features(step.hidden)
    return out


def chain_length(acceptances: list[float]) -> float:
    """1 + a_1 + a_1 a_2 + ...: the block efficiency of one chain if its depths' acceptances were
    independent (a proxy that picks the checkpoint; equals 1 + a_1 at depth 1)."""
    total, run = 1.0, 1.0
    for a in acceptances:
        run *= a
        total += run
    return total


# ---------------------------------------------------------------------------------------------
# Held-out acceptance (eval_draft.py, the heavy test in tests/test_models.py)

def held_out_acceptance(target_model, draft_model, tokenizer, prompts, *, new_tokens=128,
                        seed=0, batch_size=16, depth=1):
    """Single-draft acceptance of a draft on target-sampled continuations of ``prompts``.

    Each prompt (a user message; the tokenizer's chat template is applied) is continued by the
    target sampling at temperature 1 (no top-k/top-p) for up to ``new_tokens`` tokens, stopping
    at EOS. At every generated position ``i`` both models are run on the same prefix and the
    acceptance of one draft token under standard speculative sampling,

        a_i = sum_x min(target(x | prefix_i), draft(x | prefix_i)) = 1 - TV,

    is recorded. Returns one float64 numpy array of ``a_i`` per prompt, in prompt order; the
    headline number is the mean over all positions.

    A feature draft (:class:`otm.decode.feature_draft.FeatureDraft`) is given the target's features of
    the same prefix, as the decoder gives them at the first draft position of each step (its
    depth-1 acceptance). ``depth`` > 1 (feature drafts only): each array is ``[depth, t]``, row
    d - 1 the acceptance at depth d, the draft reading its own guessed features for the d - 1
    positions before (:func:`feature_draft_hidden`, the decoder's chain with the target's tokens).
    """

    if not prompts:
        raise OtmError("held_out_acceptance needs at least one prompt")
    if new_tokens < 1:
        raise OtmError(f"new_tokens must be >= 1, got {new_tokens}")
    from otm.decode.feature_draft import FeatureDraft

    if depth < 1 or (depth > 1 and not isinstance(draft_model, FeatureDraft)):
        raise OtmError(f"depth {depth}: acceptance by depth needs depth >= 1 and, beyond 1, a feature draft "
                       "(a token-only draft reads the same prefix at every depth)")
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    results = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start:start + batch_size]
            enc = tokenizer.apply_chat_template(
                [[{"role": "user", "content": p}] for p in batch],
                add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True,
            ).to(target_model.device)
            torch.manual_seed(seed * 7919 + start)
            with torch.no_grad():
                seqs = target_model.generate(
                    **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                    max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id,
                )
            width = enc["input_ids"].shape[1]
            for row in range(len(batch)):
                prompt = enc["input_ids"][row][enc["attention_mask"][row].bool()]
                new = seqs[row, width:]
                eos = (new == tokenizer.eos_token_id).nonzero()
                t = int(eos[0, 0]) + 1 if len(eos) else len(new)
                ids = torch.cat([prompt, new[:t]])[None]  # [1, L]
                positions = slice(len(prompt) - 1, len(prompt) - 1 + t)
                with torch.no_grad():
                    logits, feats = target_features(target_model, ids)
                    p_target = torch.softmax(logits[0, positions].float(), -1)
                    if depth == 1:
                        d_logits = [feature_draft_logits(draft_model, target_model, ids, feats)]
                    else:
                        d_logits = [draft_model.logits(h) for h in feature_draft_hidden(draft_model, ids, feats, 0.0,
                                                                                        depth=depth)]
                    acc = [torch.minimum(p_target, torch.softmax(lg[0, positions].float(), -1)).sum(-1)
                           for lg in d_logits]
                results.append((acc[0] if depth == 1 else torch.stack(acc)).double().cpu().numpy())
    finally:
        tokenizer.padding_side = side
    return [np.asarray(r) for r in results]
