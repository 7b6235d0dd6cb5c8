"""The measurement of ``otm profile`` (steps 1-2 of :mod:`otm.decode.profile`): the prompts, both models' laws
at real positions, alpha* and every verifier's acceptance there, the short decode check, and the per-k
summary (:func:`profile`). Functions take loaded models and return results; nothing here prints."""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from ...laws import OtmError
from .results import DECODABLE, METHODS, MODEL, SCHEME_OF, Check, KRow, Profile, VerifierRow
from .statistics import Stat, interval, interval_method, predicted_block_efficiency

PROMPTS = [
    # instruction following (Alpaca / Dolly style)
    "Give three tips for staying healthy.",
    "Explain why the sky is blue in two sentences.",
    "Write a short poem about the sea.",
    "What are the main differences between a cat and a dog as pets?",
    "List four uses of a paperclip.",
    "How do I make a cup of tea?",
    "Describe a typical day of a software engineer.",
    "What is the capital of France, and why is it famous?",
    # summarisation (XSum / CNN-DM style)
    "Summarize in one sentence: The city council voted on Tuesday to expand the bus network, adding "
    "twelve new routes and extending service hours until midnight starting next spring.",
    "Summarize: Researchers found that people who walk for thirty minutes a day sleep better and report "
    "lower stress than those who do not exercise.",
    "Summarize the plot of Cinderella in two sentences.",
    "Summarize: The football club announced a new coach after a season in which the team finished "
    "tenth, its worst result in a decade.",
    # translation (WMT style)
    "Translate to English: Das Wetter ist heute sehr schön.",
    "Translate to English: Ich möchte ein Glas Wasser, bitte.",
    "Translate to French: Where is the train station?",
    "Translate to German: The book is on the table.",
]
"""The built-in prompt set (user messages: instruction, summarisation, translation styles)."""

DEFAULT_NUM_PROMPTS = 8
"""Prompts of the built-in set used by default (the first eight: instruction following)."""

DEFAULT_PATHS = 200
"""Monte Carlo paths per position for ``rrs_without_replacement`` where its exact sum does not fit."""


# -- prompts and laws ---------------------------------------------------------------------------


def read_prompts(path) -> list[str]:
    """Prompts from a text file, one per line (blank lines skipped). One-line OtmError if missing or empty."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise OtmError(f"--prompts file {str(p)!r} does not exist: give a text file with one prompt per line")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OtmError(f"--prompts file {str(p)!r} is unreadable: {str(exc).splitlines()[0]}") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise OtmError(f"--prompts file {str(p)!r} holds no prompt: give one prompt per line")
    return prompts


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of a user message: the chat template with the generation prompt when the tokenizer has
    one, else ``tokenizer.encode(prompt)``."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode(prompt)]


def continuation_laws(target_model, draft_model, ids, *, positions: int, temperature: float, seed: int):
    """The target samples ``positions - 1`` tokens after ``ids`` at ``temperature``; returns both models'
    next-token laws at the ``positions`` positions of the continuation (predicting its tokens 1..positions),
    two float64 arrays ``[positions, V]``, each ``softmax(logits / temperature)``."""
    import torch

    from ..feature_draft import draft_logits

    device = next(target_model.parameters()).device
    ids = torch.tensor([list(ids)], device=device)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    with torch.no_grad():
        for _ in range(positions - 1):  # sample the continuation from the target
            logits = target_model(ids).logits[0, -1].double() / temperature
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
            ids = torch.cat([ids, nxt[None]], dim=1)
        start = ids.shape[1] - positions  # laws predicting continuation tokens 1..positions
        lt = target_model(ids).logits[0, start:].double() / temperature
        ld = draft_logits(draft_model, target_model, ids)[0, start:].double() / temperature
    tl, dl = torch.softmax(lt, -1).cpu().numpy(), torch.softmax(ld, -1).cpu().numpy()
    if tl.shape != dl.shape:
        raise OtmError(f"target laws have {tl.shape[1]} tokens but the draft's have {dl.shape[1]}: "
                       "pick a draft over the target's vocabulary")
    return tl, dl


def position_acceptances(target, draft, k: int, *, paths: int = DEFAULT_PATHS, rng=None) -> dict:
    """alpha* of each scheme and each verifier's acceptance at one position (module docstring, step 2).

    Keys: ``alpha_iid`` and ``speculative`` at k = 1; at k >= 2 ``alpha_iid``, ``kseq``, ``rrs``, ``optimal``,
    ``alpha_without_replacement``, ``rrs_without_replacement`` (with ``rrs_without_replacement_se``,
    ``_method``, ``_paths``), and ``alpha_greedy`` = ``greedy`` when k < V. Every alpha* warning of
    the race quadrature is counted in ``quadrature_warnings``.
    """
    from ...optimum import QuadratureWarning, optimal_acceptance
    from ...verifiers import greedy, kseq, kseq_without_replacement, optimal, rrs, rrs_without_replacement, speculative

    V = len(target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", QuadratureWarning)
        row = {"alpha_iid": optimal_acceptance(target, draft, k, "iid")}
        if k == 1:
            row["speculative"] = speculative.acceptance(target, draft)
        else:
            est = rrs_without_replacement.acceptance(target, draft, k, paths=paths, rng=rng)
            row.update(kseq=kseq.acceptance(target, draft, k), rrs=rrs.acceptance(target, draft, k),
                       optimal=optimal.acceptance(target, draft, k),
                       alpha_without_replacement=optimal_acceptance(target, draft, k, "without_replacement"),
                       rrs_without_replacement=est.value, rrs_without_replacement_se=est.se,
                       kseq_without_replacement=kseq_without_replacement.acceptance(target, draft, k),
                       rrs_without_replacement_method=est.method, rrs_without_replacement_paths=est.paths)
            if k < V:
                row["alpha_greedy"] = optimal_acceptance(target, draft, k, "greedy")
                row["greedy"] = greedy.acceptance(target, draft, k)
    row["quadrature_warnings"] = sum(issubclass(w.category, QuadratureWarning) for w in caught)
    for w in caught:  # anything else is not ours to swallow
        if not issubclass(w.category, QuadratureWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return row



# -- the run -------------------------------------------------------------------------------------


def _vocab(model) -> int | None:
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(v) if v is not None else None


def check_ks(ks, V: int | None = None) -> list[int]:
    ks = [int(k) for k in ks]
    if not ks:
        raise OtmError("-k needs at least one value, e.g. -k 1,2,4,8")
    for k in ks:
        if k < 1:
            raise OtmError(f"k must be >= 1, got {k}")
        if V is not None and k > V:
            raise OtmError(f"k = {k} is more drafts than the vocabulary has tokens (V = {V}): lower k")
    return sorted(set(ks))


def check_settings(*, temperature: float, positions: int, length: int, paths: int, check_prompts: int,
                   check_tokens: int) -> None:
    """One-line OtmError for any setting out of range (before models are loaded)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise OtmError(f"--temperature must be a finite number > 0 (the laws are softmax(logits / T)), got {temperature!r}")
    for value, name in ((positions, "positions"), (length, "length"), (check_prompts, "check-prompts"),
                        (check_tokens, "check-tokens")):
        if value < 1:
            raise OtmError(f"--{name} must be >= 1, got {value}")
    if paths < 2:
        raise OtmError(f"--paths must be >= 2 (a Monte Carlo standard error needs two paths), got {paths}")


def profile(target_model, draft_model, tokenizer, prompts, *, ks=(1, 2, 4, 8), length: int = 4,
            temperature: float = 1.0, positions: int = 8, paths: int = DEFAULT_PATHS, seed: int = 0,
            check: bool = True, check_prompts: int = 2, check_tokens: int = 32, verifier: str = "best",
            progress: bool = False, names: dict | None = None, eos_token_id=None) -> Profile:
    """Profile a (target, draft) pair on ``prompts`` (module docstring). Returns a :class:`Profile`.

    ``verifier``: the verifier of the short decode for k >= 2, ``"best"`` (the decodable verifier with
    the highest mean acceptance at that k) or one of :data:`DECODABLE`; k = 1 decodes with
    ``speculative``. ``check=False`` skips the decode (no measured column). ``names``: how the models
    are named in the conditions. Bad settings raise :class:`~otm.laws.OtmError` (one line).
    """
    from ...progress import bar as tqdm  # a live bar on a terminal, plain lines elsewhere

    check_settings(temperature=temperature, positions=positions, length=length, paths=paths,
                   check_prompts=check_prompts, check_tokens=check_tokens)
    prompts = [str(p) for p in prompts]
    if not prompts or any(not p.strip() for p in prompts):
        raise OtmError("every prompt must hold some text, and at least one prompt is needed")
    if verifier != "best" and verifier not in DECODABLE:
        raise OtmError(f"--verifier must be best or one of {', '.join(DECODABLE)}, got {verifier!r}")
    Vt, Vd = _vocab(target_model), _vocab(draft_model)
    if Vt is not None and Vd is not None and Vt != Vd:
        raise OtmError(f"target vocabulary has {Vt} tokens but draft has {Vd}: pick a draft over the target's vocabulary")
    ks = check_ks(ks, Vt)
    names = names or {}
    t_start = time.perf_counter()

    laws = []
    bar = tqdm(prompts, desc="laws (target continuations)", disable=not progress, file=sys.stderr, leave=False)
    for i, prompt in enumerate(bar):
        ids = prompt_ids(tokenizer, prompt)
        if not ids:
            raise OtmError(f"prompt {i + 1} encodes to no tokens: give some text")
        laws.append(continuation_laws(target_model, draft_model, ids, positions=positions, temperature=temperature,
                                      seed=seed * 1_000_003 + i))
    bar.close()
    V = int(laws[0][0].shape[1])
    ks = check_ks(ks, V)
    t_laws = time.perf_counter() - t_start

    per_k: dict[int, list[list[dict]]] = {k: [] for k in ks}
    bar = tqdm(total=len(prompts) * positions * len(ks), desc="acceptance (alpha*, verifiers)", disable=not progress,
               file=sys.stderr, leave=False)
    for i, (tl, dl) in enumerate(laws):
        rng = np.random.default_rng([seed, i])
        for k in ks:
            rows = []
            for t, d in zip(tl, dl):
                rows.append(position_acceptances(t, d, k, paths=paths, rng=rng))
                bar.update(1)
            per_k[k].append(rows)
    bar.close()
    t_acc = time.perf_counter() - t_start - t_laws

    rows = [_k_row(k, per_k[k], length, seed) for k in ks]

    checks = []
    if check:
        from ..decoder import VERIFIERS, speculative_decode
        from ..sampling import Sampling

        n_check = min(check_prompts, len(prompts))
        bar = tqdm(total=len(ks) * n_check, desc="decode check", disable=not progress, file=sys.stderr, leave=False)
        for j, r in enumerate(rows):
            name = "speculative" if r.k == 1 else (r.best if verifier == "best" else verifier)
            scheme = next(s for s, v in VERIFIERS.items() if name in v)
            c = Check(r.k, length, name, scheme, n_check, 0, 0, [0] * length, [0] * length, 0.0)
            for i in range(n_check):
                g = speculative_decode(target_model, draft_model, prompt_ids(tokenizer, prompts[i]), k=r.k, length=length,
                                       verifier=name, scheme=scheme, sampling=Sampling(temperature=temperature),
                                       max_new_tokens=check_tokens, eos_token_id=eos_token_id,
                                       seed=seed * 1_000_003 + i * 1009 + j)
                s = g.stats
                c.new_tokens += s.new_tokens
                c.target_calls += s.target_calls
                c.seconds += s.wall_seconds
                for d in range(min(length, len(s.verified_by_depth))):
                    c.verified_by_depth[d] += s.verified_by_depth[d]
                    c.accepted_by_depth[d] += s.accepted_by_depth[d]
                bar.update(1)
            checks.append(c)
        bar.close()
    t_check = time.perf_counter() - t_start - t_laws - t_acc

    quad = sum(p["quadrature_warnings"] for k in ks for g in per_k[k] for p in g)
    mc = {k: sum(p.get("rrs_without_replacement_method") == "monte_carlo" for g in per_k[k] for p in g) for k in ks}
    conditions = {
        "target": names.get("target", type(target_model).__name__),
        "draft": names.get("draft", type(draft_model).__name__),
        "V": V,
        "prompts": len(prompts),
        "prompt_source": names.get("prompts", "given"),
        "positions_per_prompt": positions,
        "positions": len(prompts) * positions,
        "positions_how": (f"the first {positions} positions of a continuation the target sampled at temperature "
                          f"{temperature:g} after each prompt (chat template applied when the tokenizer has one)"),
        "laws": f"both models' next-token laws softmax(logits / {temperature:g}) in float64; the draft's at depth 1",
        "temperature": temperature,
        "ks": ks,
        "length": length,
        "seed": seed,
        "paths": paths,
        "monte_carlo_positions": {str(k): v for k, v in mc.items() if k > 1},
        "quadrature_warnings": quad,
        "interval": interval_method(len(prompts)),
        "ratio": "mean acceptance / mean alpha* of the verifier's scheme, over the same positions",
        "methods": METHODS,
        "model": MODEL,
        "check": (f"speculative_decode, L = {length}, the first {min(check_prompts, len(prompts))} prompts, "
                  f"{check_tokens} new tokens each, temperature {temperature:g}, verifier "
                  + ("the best decodable one per k (speculative at k = 1)" if verifier == "best" else verifier))
                 if check else "skipped (--no-check)",
        "seconds": {"laws": round(t_laws, 1), "acceptance": round(t_acc, 1), "check": round(t_check, 1),
                    "total": round(time.perf_counter() - t_start, 1)},
    }
    return Profile(conditions, rows, checks, positions=per_k, laws=laws)


def _k_row(k: int, groups: list[list[dict]], length: int, seed: int) -> KRow:
    def col(name):
        return [[p[name] for p in g] for g in groups]

    first = groups[0][0]
    schemes = ["iid"] if k == 1 else ["iid", "without_replacement"] + (["greedy"] if "alpha_greedy" in first else [])
    alpha = {s: interval(col(f"alpha_{s}"), seed=seed) for s in schemes}
    names = (["speculative"] if k == 1 else ["kseq", "rrs", "optimal", "rrs_without_replacement", "kseq_without_replacement"]
             + (["greedy"] if "greedy" in first else []))
    verifiers = {}
    for n in names:
        scheme = SCHEME_OF[n]
        acc = interval(col(n), seed=seed)
        ratio = interval(col(n), denominator=col(f"alpha_{scheme}"), seed=seed)
        method = METHODS[n]
        mc_se = None
        if n == "rrs_without_replacement":
            ses = np.array([p["rrs_without_replacement_se"] for g in groups for p in g])
            n_mc = sum(p["rrs_without_replacement_method"] == "monte_carlo" for g in groups for p in g)
            n_all = ses.size
            paths = max((p["rrs_without_replacement_paths"] for g in groups for p in g), default=0)
            mc_se = float(np.sqrt(np.sum(ses**2)) / n_all)
            method = ("exact rejection-path sum at every position" if n_mc == 0 else
                      f"unbiased Monte Carlo ({paths} paths) at {n_mc} of {n_all} positions, exact path sum at the rest; "
                      f"standard error of the mean {mc_se:.1e}")
        decodable = n == "speculative" or n in DECODABLE
        pred = None
        if decodable:
            pred = Stat(*(predicted_block_efficiency(x, length) if x == x else float("nan")
                          for x in (acc.mean, acc.lo, acc.hi)))
        verifiers[n] = VerifierRow(n, scheme, acc, ratio, method, mc_se, decodable, pred)
    skipped = {} if k == 1 or "greedy" in first else {"greedy": f"needs k < V (k = {k})"}
    best = "speculative" if k == 1 else max(DECODABLE, key=lambda n: verifiers[n].acceptance.mean)
    ceiling_scheme = max(alpha, key=lambda s: alpha[s].mean)
    return KRow(k, alpha, verifiers, skipped, best, ceiling_scheme,
                predicted_block_efficiency(alpha[ceiling_scheme].mean, length))

