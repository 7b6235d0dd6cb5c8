r"""Certify a verifier end to end, inside the real decoder (:func:`otm.decode.speculative_decode`).

The verifier (a built-in name, or a callable with the signature of :data:`otm.torch.VERIFIERS`)
runs in the decoder on a small bank of toy language-model pairs (:class:`otm.decode.toy.ToyLM`:
the decoder's interface, table logits) and the law of the first T new tokens is compared with the
target's own law of T tokens (plain enumeration of its processed next-token laws):

* **exact**, when the verifier's exact conditional law is known (a built-in, or a callable with a
  ``.law(target, draft, drafts)`` attribute): :func:`otm.decode.exact_mode.exact_decode` enumerates
  every run of the real decoder code (every draft token, verification outcome and bonus token
  through the decoder's one door of chance); certified when the law error is at most 1e-9 on
  every setting;
* **statistical** otherwise: N decoder runs per setting, Pearson's chi-square on the T-token
  sequences at level :math:`\alpha / B` over the B settings (Bonferroni), N from the noncentral
  chi-square so that every output law at total variation ``tv`` or more from the target (on the
  merged cells) is detected with power at least 0.99: the least favourable alternative has
  noncentrality :math:`4 n\,\mathrm{tv}^2` (Cauchy-Schwarz, :func:`otm.certify.power.draws_for`).

The acceptance reported is the decoder's acceptance at depth 1 (exact, or pooled over the runs with
a 95% Wilson interval); the decoder's trees have no single alpha\*, so ``optimum`` is left empty.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter

import numpy as np
import torch

from ..laws import OtmError
from ..testing import chi2_gof, wilson_interval
from .power import LAW_TOLERANCE, POWER, draws_for
from .report import Case, Report

DEFAULT_DECODER_TV = 0.05
"""Default total variation the statistical decoder run detects with power 0.99."""

SETTINGS = (
    dict(name="top-k 2, gather", V=3, seeds=(11, 12), prompt=(0, 2), T=3, temperature=0.9, top_k=2, top_p=1.0,
         rollback="gather"),
    dict(name="top-k 2, refeed", V=3, seeds=(11, 12), prompt=(0, 2), T=3, temperature=0.9, top_k=2, top_p=1.0,
         rollback="refeed"),
    dict(name="full support V=2", V=2, seeds=(21, 22), prompt=(1, 0), T=3, temperature=1.0, top_k=0, top_p=1.0,
         rollback="gather"),
    dict(name="draft = target", V=3, seeds=(31, 31), prompt=(2, 1), T=3, temperature=1.0, top_k=2, top_p=1.0,
         rollback="gather"),
    dict(name="top-p 0.85", V=3, seeds=(41, 42), prompt=(1, 1), T=3, temperature=1.0, top_k=0, top_p=0.85,
         rollback="refeed"),
)
"""The toy settings: ToyLM target and draft (seeds), prompt, T tokens, sampling, target rollback."""


def _setting(s: dict):
    from ..decode.sampling import Sampling
    from ..decode.toy import ToyLM

    target = ToyLM(s["V"], seed=s["seeds"][0])
    draft = target if s["seeds"][1] == s["seeds"][0] else ToyLM(s["V"], seed=s["seeds"][1])
    return target, draft, list(s["prompt"]), Sampling(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])


def _has_exact_law(verifier) -> bool:
    from ..decode.chance import exact_law_of

    try:
        exact_law_of(verifier)
    except OtmError:
        return False
    return True


def certify_decoder(verifier, *, scheme: str = "iid", k: int = 2, length: int = 2, tv: float = DEFAULT_DECODER_TV,
                    alpha: float = 1e-3, seed: int = 0, exact: bool | None = None, progress: bool = False,
                    name: str | None = None, delay: int = 0, chance=None, settings: tuple | None = None) -> Report:
    """Certify ``verifier`` inside the decoder on the toy settings (module docstring).

    Parameters
    ----------
    verifier : a name of :data:`otm.decode.decoder.VERIFIERS` for the scheme (``"traversal"``, ...), a torch
        verifier callable (optionally with ``.law`` for the exact mode), or an instance of
        :class:`otm.decode.tree_rules.TreeRule` (a whole-tree rule; it must draw every random choice
        through ``dec.chance``, which the exact mode enumerates).
    scheme, k, length : the decoder's draft scheme, drafts per position and draft depth L.
    delay : a delayed tree's shared path (``speculative_decode``'s ``delay``; 0 <= delay < length).
    tv, alpha : statistical mode: total variation detected with power >= 0.99; family-wise level.
    exact : force (True) or forbid (False) the exact mode; default: exact when the law is known.
    chance : statistical mode only: ``generator -> Chance`` (:mod:`otm.decode.chance`), the door of each run's
        random choices in place of the decoder's own draws (e.g. an engine's deterministic top-k drafting,
        :class:`otm.certify.tree_kernels.TopKDrafts`).
    settings : the toy settings (default :data:`SETTINGS`; same keys).
    """
    from ..decode.decoder import check_delay, resolve_verifiers, speculative_decode
    from ..decode.exact_mode import exact_decode, law_error, target_law, total_variation
    from ..decode.toy import model_law

    root, deep, label = resolve_verifiers(verifier, scheme, k)
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise OtmError(f"length must be a whole number >= 1 (draft depth L), got {length!r}")
    delay = check_delay(delay, length, verifier)
    if not 0 < alpha < 1:
        raise OtmError(f"alpha must lie in (0, 1), got {alpha!r}")
    knows_law = all(v is None or _has_exact_law(v) for v in (root, deep))  # None: a whole-tree rule
    if exact is None:
        exact = knows_law and chance is None
    if exact and chance is not None:
        raise OtmError("a drafting door of one's own (chance) runs in the statistical mode only: give exact=False")
    elif exact and not knows_law:
        raise OtmError("exact mode needs the verifier's exact law: give the callable a .law(target, draft, drafts) "
                       "attribute, or certify it statistically")
    name = name or (verifier if isinstance(verifier, str) else label)
    start = time.perf_counter()
    settings = SETTINGS if settings is None else tuple(settings)
    level = alpha / len(settings)
    from ..progress import bar as tqdm  # a live bar on a terminal, plain lines elsewhere

    bar = tqdm(total=len(settings), desc="certify (decoder)", unit="setting", disable=not progress, leave=False,
               file=sys.stderr)
    cases = []
    sizes = []
    for s in settings:
        target, draft, prompt, sampling = _setting(s)
        reference = target_law(model_law(target, prompt, sampling), s["T"])
        options = dict(k=k, length=length, verifier=verifier, scheme=scheme, sampling=sampling,
                       target_rollback=s["rollback"], delay=delay)
        case = Case(s["name"], scheme, k, setting={key: s[key] for key in s if key != "name"} | {"length": length}
                    | ({"delay": delay} if delay else {}))
        try:
            if exact:
                with torch.inference_mode():
                    ex = exact_decode(target, draft, prompt, max_new_tokens=s["T"], **options)
                case.law_error = law_error(ex.law, reference)
                case.tv = total_variation(ex.law, reference)
                a = ex.acceptance_by_depth[0] if len(ex.acceptance_by_depth) else float("nan")
                case.acceptance = None if a != a else a
                case.acceptance_ci = None if case.acceptance is None else (a, a)
                if case.law_error > LAW_TOLERANCE:
                    case.passed = False
                    case.reason = f"law of the first {s['T']} tokens differs from the target's by {case.law_error:.3g} (TV {case.tv:.3g})"
            else:
                cells = sorted(reference)
                n = draws_for(np.array([reference[c] for c in cells]), tv, level)
                sizes.append(n)
                gen = torch.Generator().manual_seed(seed * 1_000_003 + len(cases))
                counts, verified, accepted = Counter(), 0, 0
                for _ in range(n):
                    door = dict(generator=gen) if chance is None else dict(chance=chance(gen))
                    out = speculative_decode(target, draft, prompt, max_new_tokens=s["T"], **door, **options)
                    counts[tuple(out.tokens)] += 1
                    verified += out.stats.verified_by_depth[0]
                    accepted += out.stats.accepted_by_depth[0]
                keys = sorted(set(cells) | set(counts))
                gof = chi2_gof([counts.get(c, 0) for c in keys], [reference.get(c, 0.0) for c in keys], alpha=level)
                case.draws, case.pvalue = n, (0.0 if gof.impossible else gof.pvalue)
                case.tv = total_variation({c: v / n for c, v in counts.items()}, reference)
                if verified:
                    case.acceptance = accepted / verified
                    case.acceptance_ci = wilson_interval(accepted, verified, 0.95)
                if gof.reject:
                    case.passed = False
                    case.reason = (f"{gof.impossible} runs emitted a sequence the target never emits" if gof.impossible
                                   else f"chi-square p = {gof.pvalue:.3g} < {level:.3g} (empirical TV {case.tv:.3g})")
        except OtmError as exc:  # e.g. the verifier's input check refused what the decoder gave it
            case.passed, case.reason = False, f"raised OtmError: {exc}"
            case.law_error = math.inf if exact else None
        cases.append(case)
        bar.update(1)
    bar.close()
    failing = [c for c in cases if not c.passed]
    if exact:
        method = (f"exact: every run of the real decoder enumerated (draft tokens, verification outcomes from the "
                  f"verifier's exact law or a tree rule's own decision laws, bonus tokens) on {len(settings)} toy "
                  f"settings; certified when the law of "
                  f"the first T tokens is within {LAW_TOLERANCE:g} of the target's on every one")
        worst = max(failing or cases, key=lambda c: c.law_error if c.law_error is not None else -1.0)
        report = Report(name, "decoder", scheme, k, not failing, cases, worst, method)
    else:
        method = (f"statistical: {sum(sizes):,} decoder runs over {len(settings)} toy settings; chi-square of the "
                  f"T-token sequences against the target's exact law at level {level:.2g} per setting (alpha "
                  f"{alpha:g} / {len(settings)}, Bonferroni); runs per setting detect every output law at TV >= "
                  f"{tv:g} (merged cells) with power >= {POWER}")
        worst = min(failing or cases, key=lambda c: c.pvalue if c.pvalue is not None else -1.0)
        report = Report(name, "decoder", scheme, k, not failing, cases, worst, method, alpha=alpha, detectable_tv=tv)
    report.seconds = time.perf_counter() - start
    report.command = (f"otm certify {name} --kind decoder --scheme {scheme} -k {k} --length {length}"
                      + (f" --delay {delay}" if delay else "")
                      + ("" if exact else f" --tv {tv:g} --seed {seed}"))
    return report
