r"""``otm profile``: how much would k drafts, and which verifier, buy on *your* target and draft?

The library behind ``otm profile`` (and behind ``analysis/paper_table.py`` where the two overlap).
Functions take loaded models and return results; nothing here prints.

What is measured, and how
-------------------------

1. **Laws at real positions** (:func:`continuation_laws`). For each prompt (chat template applied
   when the tokenizer has one: :func:`prompt_ids`) the target samples a continuation at temperature
   T; at the first N positions of that continuation both models' next-token laws are taken,
   ``softmax(logits / T)`` in float64 (the draft's at depth 1: a feature draft reads the target's
   features of the same prefix, :func:`otm.decode.feature_draft.draft_logits`).
2. **Per position, per k** (:func:`position_acceptances`): alpha* of each draft scheme in closed
   form (:func:`otm.optimum.optimal_acceptance`: iid, without_replacement, greedy when k < V) and
   each verifier's acceptance: ``kseq``, ``rrs``, ``greedy`` and (k = 1) ``speculative`` by their
   exact closed forms, ``kseq_without_replacement`` by its race quadrature (exact; 25-85 ms a position
   at V = 49152), ``rrs_without_replacement`` by its exact rejection-path sum where that fits,
   else its unbiased Monte Carlo estimate with a standard error
   (:func:`otm.verifiers.rrs_without_replacement.acceptance`). At k = 1 the schemes coincide and
   alpha* = speculative sampling's acceptance = sum min(target, draft).
3. **Means and intervals** (:func:`interval`): mean over all positions; 95% interval by a
   percentile bootstrap over prompts (prompts resampled with their positions, since positions of
   one continuation are not independent) when there are at least :data:`MIN_BOOTSTRAP_PROMPTS`
   prompts, else the normal interval mean +- 1.96 sd / sqrt(n) over positions (which treats them
   as independent). A verifier's ratio is (mean acceptance) / (mean alpha* of its scheme), with the
   same kind of interval. The method is in every result.
4. **Block efficiency** (new tokens per target call) at depth L. *Predicted*
   (:func:`predicted_block_efficiency`): the expected tokens of one step of a level-by-level tree,
   ``1 + sum_{d=1..L} prod_{j<=d} a_j``, with a_j the acceptance at depth j; the optimistic model
   puts the depth-1 mean acceptance a of step 2 at every depth: ``1 + a + a^2 + ... + a^L``.
   *Measured*: a short real decode (:func:`otm.decode.decoder.speculative_decode`, each k, depth L,
   one verifier, a few prompts, a few tokens) gives the block efficiency and the acceptance by
   depth; the same formula fed with the *measured* per-depth acceptances is printed beside it.
   Prediction and measurement differ where the draft's quality drops with depth: deeper in the
   tree the draft conditions on its own drafted tokens (and a feature draft on its own guessed
   features), fewer rows pass through an accepted node than k (iid), and with
   ``rrs_without_replacement`` each row below the root is a single chain verified by speculative
   sampling (docs/decode.md). The measured figure also counts the first call (a feature draft
   drafts nothing on it), the depth cut near the token budget and EOS; the formula with measured
   depths does not.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..laws import OtmError
from ..verifiers import VERIFIERS

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

BOOTSTRAP_RESAMPLES = 2000
MIN_BOOTSTRAP_PROMPTS = 4
"""With fewer prompts the interval is the normal one over positions (a bootstrap over 2-3 prompts says little)."""

SCHEME_OF = {v.name: v.optimum_scheme for v in VERIFIERS.values()}
"""The draft scheme each verifier is exact for (its ratio is to alpha* of that scheme): the registry's."""

DECODABLE = ("kseq", "rrs", "rrs_without_replacement", "kseq_without_replacement")
"""Verifiers for k >= 2 that ``otm profile``'s decode check offers (a subset of the decoder's,
:func:`otm.verifiers.decodable`; checked by tests/test_verifiers.py); k = 1 runs ``speculative``."""

METHODS = {
    "alpha*": "closed form, otm.optimum.optimal_acceptance (sorted-prefix min cut; exponential-race quadrature "
              "for without_replacement at k >= 3; greedy: Hu et al.'s closed form)",
    "speculative": "closed form sum min(target, draft)",
    "kseq": "closed form at rho* (SpecTr)",
    "rrs": "closed form 1 - prod(1 - sum min(p_i, q))",
    "greedy": "closed form (Hu et al.; equals alpha* of the greedy scheme)",
    "optimal": "its own closed form sum min(x*, target) (otm.verifiers.optimal: alpha* less its reported gap)",
    "rrs_without_replacement": "exact rejection-path sum where it fits, else unbiased Monte Carlo with its standard error",
    "kseq_without_replacement": "beta E[N_rho] at the root of E[N_rho] = rho (exponential-race quadrature; exact)",
}
"""How each number is computed (printed with the results)."""

MODEL = ("1 + sum_{d=1..L} prod_{j<=d} a_j (expected tokens of one step: accepted prefix + 1 correction or bonus "
         "token); predicted: a_j = the verifier's mean depth-1 acceptance at every depth (optimistic)")
"""The block-efficiency model, stated in every output."""


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

    from .feature_draft import draft_logits

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
    from ..optimum import QuadratureWarning, optimal_acceptance
    from ..verifiers import greedy, kseq, kseq_without_replacement, optimal, rrs, rrs_without_replacement, speculative

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


# -- statistics ----------------------------------------------------------------------------------


@dataclass
class Stat:
    """A mean with its 95% interval ``[lo, hi]`` (NaN where it cannot be formed, e.g. one position)."""

    mean: float
    lo: float
    hi: float


def interval_method(n_prompts: int) -> str:
    if n_prompts >= MIN_BOOTSTRAP_PROMPTS:
        return (f"95% percentile bootstrap over the {n_prompts} prompts ({BOOTSTRAP_RESAMPLES} resamples, "
                "each prompt with all its positions)")
    return (f"95% normal interval over positions, mean +- 1.96 sd/sqrt(n) (fewer than {MIN_BOOTSTRAP_PROMPTS} "
            "prompts for a bootstrap; it treats positions of one continuation as independent, which they are not)")


def interval(values, *, denominator=None, seed: int = 0) -> Stat:
    """Mean over all positions of ``values`` (a list per prompt of per-position numbers), or the ratio of
    means ``sum(values) / sum(denominator)``, with its 95% interval (:func:`interval_method`)."""
    groups = [np.asarray(v, dtype=np.float64) for v in values]
    dens = None if denominator is None else [np.asarray(v, dtype=np.float64) for v in denominator]
    num_all = np.concatenate(groups)
    den_all = np.ones_like(num_all) if dens is None else np.concatenate(dens)
    mean = float(num_all.sum() / den_all.sum())
    n_prompts = len(groups)
    if n_prompts >= MIN_BOOTSTRAP_PROMPTS:
        sums = np.array([g.sum() for g in groups])
        weights = np.array([len(g) for g in groups], dtype=np.float64) if dens is None else np.array([d.sum() for d in dens])
        rng = np.random.default_rng([seed, 19])
        pick = rng.integers(0, n_prompts, size=(BOOTSTRAP_RESAMPLES, n_prompts))
        stats = sums[pick].sum(1) / weights[pick].sum(1)
        lo, hi = np.percentile(stats, [2.5, 97.5])
        return Stat(mean, float(lo), float(hi))
    n = num_all.size
    if n < 2:
        return Stat(mean, float("nan"), float("nan"))
    if dens is None:
        half = 1.96 * num_all.std(ddof=1) / math.sqrt(n)
    else:  # delta method for a ratio of means
        a, o = num_all, den_all
        r = mean
        cov = np.cov(a, o, ddof=1)
        var = (cov[0, 0] - 2 * r * cov[0, 1] + r * r * cov[1, 1]) / (o.mean() ** 2 * n)
        half = 1.96 * math.sqrt(max(var, 0.0))
    return Stat(mean, mean - half, mean + half)


def predicted_block_efficiency(acceptance, length: int) -> float:
    """``1 + sum_{d=1..L} prod_{j<=d} a_j``: a number ``a`` is used at every depth (``1 + a + ... + a^L``),
    a sequence gives ``a_1 .. a_L`` (depths never reached, NaN, end the sum: nothing got there)."""
    rates = [float(acceptance)] * length if np.isscalar(acceptance) else [float(a) for a in acceptance][:length]
    total, prod = 1.0, 1.0
    for a in rates:
        if a != a:  # NaN: a depth no verification reached
            break
        prod *= a
        total += prod
    return total


# -- results -------------------------------------------------------------------------------------


@dataclass
class VerifierRow:
    name: str
    scheme: str
    acceptance: Stat
    ratio: Stat
    method: str
    mc_se: float | None = None  # standard error of the mean from Monte Carlo (rrs_without_replacement)
    decodable: bool = False
    predicted_block_efficiency: Stat | None = None


@dataclass
class KRow:
    k: int
    alpha: dict[str, Stat]  # scheme -> alpha*
    verifiers: dict[str, VerifierRow]
    skipped: dict[str, str]
    best: str  # the decodable verifier with the highest mean acceptance
    ceiling_scheme: str
    ceiling_block_efficiency: float  # the optimistic model at the best scheme's mean alpha*


@dataclass
class Check:
    """The short real decode of one k (all check prompts together)."""

    k: int
    length: int
    verifier: str
    scheme: str
    prompts: int
    new_tokens: int
    target_calls: int
    accepted_by_depth: list[int]
    verified_by_depth: list[int]
    seconds: float

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    @property
    def acceptance_by_depth(self) -> list[float]:
        return [a / v if v else float("nan") for a, v in zip(self.accepted_by_depth, self.verified_by_depth)]

    @property
    def depth_formula(self) -> float:
        """The block-efficiency formula fed with the measured per-depth acceptances."""
        return predicted_block_efficiency(self.acceptance_by_depth, self.length)


@dataclass
class Profile:
    conditions: dict
    rows: list[KRow]
    checks: list[Check]
    positions: dict = field(default_factory=dict, repr=False)  # k -> per prompt -> per position dicts
    laws: list = field(default_factory=list, repr=False)  # per prompt: (target [N, V], draft [N, V]) float64

    def row(self, k: int) -> KRow:
        return next(r for r in self.rows if r.k == k)

    def check(self, k: int) -> Check | None:
        return next((c for c in self.checks if c.k == k), None)

    def to_json(self) -> dict:
        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {str(a): clean(b) for a, b in x.items()}
            if isinstance(x, (list, tuple)):
                return [clean(b) for b in x]
            return x

        rows = []
        for r in self.rows:
            rows.append({
                "k": r.k, "alpha_star": {s: asdict(v) for s, v in r.alpha.items()},
                "verifiers": {n: {**asdict(v), "acceptance": asdict(v.acceptance), "ratio": asdict(v.ratio)}
                              for n, v in r.verifiers.items()},
                "skipped": r.skipped, "best_verifier": r.best,
                "ceiling": {"scheme": r.ceiling_scheme, "block_efficiency": r.ceiling_block_efficiency},
            })
        L = self.conditions["length"]
        block = []
        for r in self.rows:
            c = self.check(r.k)
            best = r.verifiers[r.best]
            block.append({
                "k": r.k, "length": L, "verifier": r.best,
                "predicted": asdict(best.predicted_block_efficiency),
                "ceiling": r.ceiling_block_efficiency,
                "measured": None if c is None else c.block_efficiency,
                "depth_formula_with_measured": None if c is None else c.depth_formula,
            })
        by_depth = [{"k": c.k, "length": c.length, "verifier": c.verifier, "scheme": c.scheme,
                     "acceptance": c.acceptance_by_depth, "accepted": c.accepted_by_depth,
                     "verified": c.verified_by_depth, "new_tokens": c.new_tokens, "target_calls": c.target_calls,
                     "block_efficiency": c.block_efficiency, "seconds": c.seconds} for c in self.checks]
        return clean({"conditions": self.conditions, "rows": rows, "by_depth": by_depth, "block_efficiency": block})


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
    from tqdm import tqdm

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
        from .decoder import VERIFIERS, speculative_decode
        from .sampling import Sampling

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


# -- text and figures ----------------------------------------------------------------------------


def _f(x: float, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def _ci(s: Stat, digits: int = 3) -> str:
    if s.lo != s.lo:
        return f"{_f(s.mean, digits)}"
    return f"{_f(s.mean, digits)} [{_f(s.lo, digits)}, {_f(s.hi, digits)}]"


def format_profile(p: Profile, command: str = "") -> str:
    """The text report of ``otm profile``."""
    c = p.conditions
    L = c["length"]
    out = ["otm profile: what k drafts and each verifier buy on this pair, and the ceiling alpha*"]
    if command:
        out.append(f"  command: {command}")
    out += [
        f"  target: {c['target']}",
        f"  draft:  {c['draft']}",
        f"  V = {c['V']}; {c['prompts']} prompts ({c['prompt_source']}) x {c['positions_per_prompt']} positions = "
        f"{c['positions']} positions: {c['positions_how']}; {c['laws']}; seed {c['seed']}",
        f"  alpha*: {METHODS['alpha*']}" + (f"; {c['quadrature_warnings']} quadrature warnings"
                                            if c["quadrature_warnings"] else ""),
        f"  verifiers: speculative, kseq, rrs, greedy exact closed forms; rrs_without_replacement "
        f"{METHODS['rrs_without_replacement']} ({c['paths']} paths per position); kseq_without_replacement "
        f"{METHODS['kseq_without_replacement']}",
        f"  intervals: {c['interval']}; ratio = {c['ratio']}",
        "",
        f"per-token acceptance, mean over {c['positions']} positions [95% interval]",
        f"  {'k':>3}  {'scheme':<21}{'alpha*':<23}{'verifier':<25}{'acceptance':<23}/ alpha* of its scheme",
    ]
    for r in p.rows:
        first = True
        for s, a in r.alpha.items():
            label = "iid (= every scheme)" if r.k == 1 else s
            names = [n for n, v in r.verifiers.items() if v.scheme == s]
            for j, n in enumerate(names or [None]):
                head = f"  {r.k:>3}  " if first else " " * 7
                first = False
                left = f"{label:<21}{_ci(a):<23}" if j == 0 else " " * 44
                if n is None:
                    out.append(head + left.rstrip())
                    continue
                v = r.verifiers[n]
                acc = _ci(v.acceptance)
                extra = f" (MC se {v.mc_se:.1e})" if v.mc_se else ""
                out.append(f"{head}{left}{n:<25}{acc:<23}{_ci(v.ratio, 4)}{extra}")
        for n, why in r.skipped.items():
            out.append(" " * 7 + f"{'':<44}{n:<25}skipped: {why}")
    out += ["", f"block efficiency (new tokens per target call) at L = {L}",
            f"  model: {MODEL}",
            "  ceiling: the same model at the highest mean alpha* over the schemes (no verifier of that scheme does better "
            "at depth 1; the decoder runs iid and without_replacement drafts, not greedy)"]
    if p.checks:
        out.append(f"  measured: {c['check']}; 'depth formula' = the model fed with the measured acceptance by depth")
    else:
        out.append(f"  measured: {c['check']}")
    out.append(f"  {'k':>3}  {'verifier':<25}{'predicted':<23}{'ceiling':<29}{'measured':<10}{'depth formula':<15}"
               "measured acceptance by depth (accepted/verified)")
    for r in p.rows:
        chk = p.check(r.k)
        name = r.best if chk is None else chk.verifier
        pred = r.verifiers[name].predicted_block_efficiency
        ceiling = f"{r.ceiling_block_efficiency:.2f} ({r.ceiling_scheme})"
        if chk is None:
            out.append(f"  {r.k:>3}  {name:<25}{_ci(pred, 2):<23}{ceiling:<29}{'-':<10}{'-':<15}-")
            continue
        depths = " ".join(f"{_f(a, 2)} ({acc}/{ver})" for a, acc, ver in
                          zip(chk.acceptance_by_depth, chk.accepted_by_depth, chk.verified_by_depth))
        out.append(f"  {r.k:>3}  {name:<25}{_ci(pred, 2):<23}{ceiling:<29}{_f(chk.block_efficiency, 2):<10}"
                   f"{_f(chk.depth_formula, 2):<15}{depths}")
    if p.checks:
        tokens = sum(x.new_tokens for x in p.checks)
        out += [
            f"  (measured on {tokens} tokens in all: a few, so read it as a check, not a benchmark; "
            "otm bench-decode measures at length)",
            "  Prediction and measurement differ where the draft's quality drops with depth: deeper in the tree the draft",
            "  conditions on its own drafted tokens (a feature draft also on its own guessed features), fewer than k rows",
            "  pass through an accepted node, and drafts without replacement are k distinct tokens at the root only (each",
            "  row below is a single chain verified by speculative sampling). The measured figure also counts the first call",
            "  (a feature draft drafts nothing on it), the depth cut near the token budget and EOS; the depth formula does not.",
        ]
    s = c["seconds"]
    load = f"loading the models {s['load']:.1f} s, " if "load" in s else ""
    out.append(f"\ntime: {load}laws {s['laws']:.1f} s, acceptance {s['acceptance']:.1f} s, decode check {s['check']:.1f} s; "
               f"{s['total']:.1f} s after loading")
    return "\n".join(out)


def caption(p: Profile) -> str:
    c = p.conditions
    return (f"target {c['target']}; draft {c['draft']}; V = {c['V']}; {c['prompts']} prompts x {c['positions_per_prompt']} "
            f"positions of target-sampled continuations at T = {c['temperature']:g}, float64 laws; alpha* and kseq/rrs/greedy "
            f"closed forms, rrs w/o replacement exact or Monte Carlo ({c['paths']} paths); intervals: "
            f"{c['interval'].split(' (')[0]}; block efficiency model 1 + a + ... + a^L at L = {c['length']}; "
            f"measured: {c['check']}; seed {c['seed']}.")


def plot_profile(p: Profile, out_dir) -> list[Path]:
    """``profile.png`` and ``profile.svg`` in ``out_dir``: acceptance and alpha* against k, acceptance / alpha*
    against k, and predicted vs measured block efficiency against k; the conditions in the caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..analysis.io import save_figure, wrap

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OtmError(f"--plot directory {str(out_dir)!r} cannot be created: {str(exc).splitlines()[0]}") from None
    ks = [r.k for r in p.rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colors = {"speculative": "k", "kseq": "C0", "rrs": "C1", "rrs_without_replacement": "C2", "greedy": "C3", "optimal": "C4",
              "kseq_without_replacement": "C5"}
    scheme_colors = {"iid": "C0", "without_replacement": "C2", "greedy": "C3"}

    def err(stats):
        m = np.array([s.mean for s in stats])
        lo = np.array([s.lo if s.lo == s.lo else s.mean for s in stats])
        hi = np.array([s.hi if s.hi == s.hi else s.mean for s in stats])
        return m, np.vstack([m - lo, hi - m])

    ax = axes[0]
    for s, color in scheme_colors.items():
        sel = [r for r in p.rows if s in r.alpha]
        if sel:
            m, e = err([r.alpha[s] for r in sel])
            ax.errorbar([r.k for r in sel], m, yerr=e, fmt="--", color=color, alpha=0.6, capsize=3, label=f"α* {s}")
    for n, color in colors.items():
        sel = [r for r in p.rows if n in r.verifiers]
        if sel:
            m, e = err([r.verifiers[n].acceptance for r in sel])
            ax.errorbar([r.k for r in sel], m, yerr=e, fmt="o-", color=color, capsize=3, label=n)
    ax.set_xlabel("k (drafts per position)")
    ax.set_ylabel("mean per-token acceptance (95% interval)")
    ax.set_title("acceptance and optimum α* per scheme")
    ax.legend(fontsize=7)
    ax = axes[1]
    for n, color in colors.items():
        sel = [r for r in p.rows if n in r.verifiers]
        if sel:
            m, e = err([r.verifiers[n].ratio for r in sel])
            ax.errorbar([r.k for r in sel], m, yerr=e, fmt="o-", color=color, capsize=3,
                        label=f"{n} / α* {SCHEME_OF[n]}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("k (drafts per position)")
    ax.set_ylabel("acceptance / α* of the verifier's scheme")
    ax.set_title("how close each verifier gets to its optimum")
    ax.legend(fontsize=7)
    ax = axes[2]
    m, e = err([r.verifiers[p.check(r.k).verifier if p.check(r.k) else r.best].predicted_block_efficiency for r in p.rows])
    ax.errorbar(ks, m, yerr=e, fmt="o--", color="C0", capsize=3, label="predicted: 1 + a + ... + a^L (a at depth 1)")
    ax.plot(ks, [r.ceiling_block_efficiency for r in p.rows], "^:", color="C3", label="ceiling: same model at best α*")
    if p.checks:
        ax.plot([c.k for c in p.checks], [c.block_efficiency for c in p.checks], "s-", color="k",
                label="measured (short decode)")
        ax.plot([c.k for c in p.checks], [c.depth_formula for c in p.checks], "x-", color="grey",
                label="model with measured acceptance by depth")
    ax.set_xlabel("k (drafts per position)")
    ax.set_ylabel(f"block efficiency (tokens per target call), L = {p.conditions['length']}")
    ax.set_title("predicted vs measured block efficiency")
    ax.legend(fontsize=7)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.grid(alpha=0.3)
    fig.text(0.01, -0.02, wrap(caption(p), 190), fontsize=8, va="top", ha="left")
    fig.tight_layout()
    paths = save_figure(fig, out_dir / "profile")
    plt.close(fig)
    return paths


__all__ = ["PROMPTS", "Profile", "KRow", "VerifierRow", "Check", "Stat", "profile", "position_acceptances",
           "continuation_laws", "prompt_ids", "read_prompts", "interval", "predicted_block_efficiency",
           "format_profile", "plot_profile"]
