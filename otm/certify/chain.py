r"""Certify an engine's chain verifier in the engine's own layout.

A *chain kernel* verifies one draft chain per row: L draft tokens :math:`x_1..x_L` drawn one after
another from the draft's laws :math:`q_i = q(\cdot \mid c, x_{<i})`, the target's laws
:math:`p_i = p(\cdot \mid c, x_{<i})` at the L + 1 positions, and emits the accepted drafts, then
one recovered (after a rejection) or bonus (all accepted) token. Three layouts (:data:`LAYOUTS`):

``flashinfer``
    ``kernel(draft_probs [B, L, V], draft_token_ids [B, L], target_probs [B, L + 1, V], *,
    generator=None) -> output [B, L + 1] int32`` (accepted drafts, the recovered or bonus token,
    then -1; a tuple whose first item is that tensor is accepted too): FlashInfer's
    ``chain_speculative_sampling``; the kernel draws its own uniforms from ``generator``.
``transformers``
    ``_speculative_sampling(candidate_input_ids [1, n + L], candidate_logits [1, L, V],
    candidate_length, new_logits [1, L + 1, V], ...) -> (valid_tokens [1, m + 1], m)`` (batch 1,
    logits; the 4.x/5.x signatures are inspected: ``is_done_candidate`` is passed False,
    ``assistant_ensemble_weight`` left at its default). The harness passes the logits ``log p``
    and ``log q`` in float64 (a zero mass is ``-inf``).
``vllm``
    vLLM V1's ``rejection_sample(draft_token_ids [N], num_draft_tokens, max_spec_len,
    cu_num_draft_tokens [B], draft_probs [N, V], target_probs [N, V], bonus_token_ids [B, 1],
    sampling_metadata) -> output [B, L + 1] int32`` padded with -1 (the parameters are matched by
    name; the bonus tokens are drawn by the harness from the last position's target law; the
    sampling metadata is a stand-in with the attributes the function reads: all random,
    temperature 1, no top-k / top-p, no per-request generators).

**The criterion.** Repeated calls, each continuing from the context the previous one emitted, are
lossless when every call's emission :math:`Y_1..Y_M` is a *stopped target stream*: for every
prefix :math:`a` of length m and token b,

.. math::

    P(Y_{1..m+1} = a\,b,\ M \ge m + 1) = P(Y_{1..m} = a,\ M \ge m + 1)\; p(b \mid c, a),

i.e. whether the call goes on past a is independent of the next token, which has the target's law
(M >= 1 always). Sufficient: by induction over the emitted tokens, the concatenated calls emit each
token with the target's law given everything before it, so the first T tokens have the target's
law for every T. Necessary too, given the first token is right at every context (the T = m + 1
law of the repeated calls differs otherwise). The engines also claim Leviathan et al.'s standard
rule (accept :math:`x_i` with :math:`\min(1, p_i(x_i)/q_i(x_i))`, else draw
:math:`(p_i - q_i)_+`), whose per-call law (which tokens, how many accepted, the bonus) is known
exactly: it is checked as a second claim, which also fixes the law of the number accepted.

* **exact** (transformers' code, the installed function or one whose source has the same accept
  test): the kernel's randomness is fed. ``torch.multinomial`` is answered by every token of the
  law the kernel asked for, weighted by it; ``torch.rand_like(probability_ratio)`` by one
  representative vector per first rejection j, weighted :math:`\prod_{i<j} \min(1, r_i)\,(1 -
  \min(1, r_j))` from the kernel's own ratios. This is exact only because the code's output
  depends on the uniforms only through ``r_i <= probability_ratio`` and the count of leading
  accepts (checked on its source: ``r_i`` is used in that one comparison): constant between the
  breakpoints enumerated. Certified when both per-call laws agree within 1e-9.
* **statistical** otherwise (the kernel's uniforms are its own): N rows per setting, batched; (a)
  the first T tokens of repeated calls against the target's law of T tokens (the lossless
  criterion itself), (b) the first call's emission against the standard rule's exact per-call law;
  Pearson's chi-square on each at level :math:`\alpha / (2B)` over the B settings (Bonferroni),
  N from :func:`otm.certify.power.draws_for` so every law at total variation ``tv`` or more from
  the reference (merged cells) is detected with power >= 0.99 in both.

**Probes** (every layout): every output row must be well formed (ids in [0, V) or -1, nothing but
-1 after the first -1, at least one token, the first M - 1 equal to the drafts); a uniform of
exactly 0 (``torch.rand`` / ``rand_like`` answered by zeros) with a drafted token of zero target
mass must not accept it nor draw a token of zero residual mass (the ``u <= ratio`` bug); a drafted
token of zero *draft* mass (q = 0, which sampled drafts never produce) is reported (notes) and
refutes only when a zero-target-mass token is emitted; vocabularies at tile edges (33 to 151937)
with real uniforms and with uniforms at the largest float32 below 1 must emit ids in [0, V).
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy.special import softmax

from ..laws import OtmError
from ..testing import chi2_gof
from .chain_exact import exact_call_law, exact_capable
from .chain_layouts import (BUILTIN_KERNELS, CALLERS, LAYOUTS, Malformed, builtin_kernel, draw_chains, emitted_rows,
                            reference_chain_kernel)
from .chain_probes import boundary_probe, tile_probe, zero_draft_probe
from .power import LAW_TOLERANCE, POWER, draws_for
from .report import Case, Report

DEFAULT_CHAIN_TV = 0.05
"""Default total variation the statistical chain run detects with power 0.99 (both tests)."""
MAX_LENGTH = 8
TILE_VOCABS = (33, 1025, 32000, 128256, 151936, 151937)
"""Vocabulary sizes of the out-of-range probe: small, one past a 1024 tile, Llama 2/3, Qwen (padded and not)."""

# -- toy language models: per-position laws that depend on the prefix -----------------------------------


class ChainToy:
    """Table laws ``p(. | seq)`` from the last two tokens and the parity of the length, float64.

    ``zeros`` smallest logits of each law are removed (zero mass, as top-k would), so drafts of zero
    target mass and residuals that must cover the draft's zeros occur.
    """

    def __init__(self, V: int, seed: int, zeros: int = 0, scale: float = 1.5):
        rng = np.random.default_rng(seed)
        self.table = rng.standard_normal((V + 1, V + 1, 2, V)) * scale
        self.V, self.zeros = V, zeros
        self._memo: dict[tuple, np.ndarray] = {}

    def __call__(self, seq: tuple) -> np.ndarray:
        law = self._memo.get(seq)
        if law is None:
            V = self.V
            a = seq[-2] if len(seq) >= 2 else V
            b = seq[-1] if len(seq) >= 1 else V
            logits = self.table[a, b, len(seq) % 2].copy()
            if self.zeros:
                logits[np.argsort(logits, kind="stable")[: self.zeros]] = -np.inf
            law = softmax(logits)  # [V] float64; a removed logit (-inf) gets mass 0.0
            self._memo[seq] = law
        return law


SETTINGS = (
    dict(name="target zeros V=3", V=3, target=(11, 1), draft=(12, 0), prompt=(0,)),
    dict(name="full support V=2", V=2, target=(21, 0), draft=(22, 0), prompt=(1,)),
    dict(name="draft = target V=3", V=3, target=(31, 0), draft=None, prompt=(2,)),
    dict(name="draft zeros V=4", V=4, target=(41, 0), draft=(42, 2), prompt=(3,)),
)
"""Toy settings: vocabulary, (seed, zero masses) of the target and the draft (None: the target), prompt."""


def _models(s: dict):
    target = ChainToy(s["V"], *s["target"])
    draft = target if s["draft"] is None else ChainToy(s["V"], *s["draft"])
    return target, draft


def standard_call_law(target, draft, context: tuple, L: int) -> dict[tuple, float]:
    """Exact law of one call of the standard chain rule (Leviathan et al.) at ``context``: emitted tuple -> prob."""
    out: dict[tuple, float] = {}

    def add(seq, w):
        out[seq] = out.get(seq, 0.0) + w

    def rec(prefix: tuple, w: float):
        p = target(context + prefix)
        if len(prefix) == L:
            for y in np.flatnonzero(p > 0):
                add(prefix + (int(y),), w * p[y])
            return
        q = draft(context + prefix)
        res = np.maximum(p - q, 0.0)
        for y in np.flatnonzero(res > 0):
            add(prefix + (int(y),), w * res[y])
        for x in np.flatnonzero(q > 0):
            a = min(1.0, p[x] / q[x])
            if a > 0:
                rec(prefix + (int(x),), w * q[x] * a)

    rec((), 1.0)
    return out


def stopped_stream_error(law: dict[tuple, float], target, context: tuple) -> float:
    """Largest |P(Y_{1..m+1} = a b, M > m) - P(Y_{1..m} = a, M > m) p(b | c, a)| over prefixes a and tokens b."""
    reach: dict[tuple, float] = {}  # P(Y_{1..m} = a, M >= m)
    for seq, w in law.items():
        for m in range(len(seq) + 1):
            reach[seq[:m]] = reach.get(seq[:m], 0.0) + w
    go_on: dict[tuple, float] = {}  # P(Y_{1..m} = a, M >= m + 1)
    for a, w in reach.items():
        if a:
            go_on[a[:-1]] = go_on.get(a[:-1], 0.0) + w
    err = abs(go_on.get((), 0.0) - 1.0)  # at least one token
    for a, c in go_on.items():
        p = target(context + a)
        for b in range(p.size):
            err = max(err, abs(reach.get(a + (b,), 0.0) - c * p[b]))
    return err


def _target_law_T(target, context: tuple, T: int) -> dict[tuple, float]:
    out = {(): 1.0}
    for _ in range(T):
        nxt = {}
        for a, w in out.items():
            p = target(context + a)
            for b in np.flatnonzero(p > 0):
                nxt[a + (int(b),)] = w * p[b]
        out = nxt
    return out


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))

# -- the certification --------------------------------------------------------------------------------


def _kernel_label(kernel) -> str:
    """MODULE:QUALNAME when the kernel is importable by it (the report's reproduce line then runs), else its name."""
    module, qualname = getattr(kernel, "__module__", None), getattr(kernel, "__qualname__", None)
    if module and qualname and module != "__main__" and "<" not in qualname and not module.startswith("_otm_certify_"):
        return f"{module}:{qualname}"
    return qualname or type(kernel).__name__


def _check_args(kernel, layout, length, tv, alpha):
    if layout not in LAYOUTS:
        raise OtmError(f"unknown chain layout {layout!r}: name one of {', '.join(LAYOUTS)}")
    if not callable(kernel):
        raise OtmError(f"the chain kernel must be a callable, got {type(kernel).__name__}")
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_LENGTH:
        raise OtmError(f"length must be a whole number from 1 to {MAX_LENGTH} (draft chain length L), got {length!r}")
    if not 0 < tv < 1:
        raise OtmError(f"tv must lie in (0, 1) (total variation to detect), got {tv!r}")
    if not 0 < alpha < 1:
        raise OtmError(f"alpha must lie in (0, 1), got {alpha!r}")


def _mean_accepted(law: dict[tuple, float]) -> float:
    return sum(w * (len(s) - 1) for s, w in law.items())


def _exact_case(kernel, s, L) -> Case:
    target, draft = _models(s)
    ctx = tuple(s["prompt"])
    case = Case(s["name"], "chain", 1, setting={"V": s["V"], "length": L, "prompt": list(ctx)})
    ref = standard_call_law(target, draft, ctx, L)
    try:
        law = exact_call_law(kernel, target, draft, ctx, L)
    except Malformed as exc:
        case.passed, case.reason, case.law_error = False, f"malformed output: {exc}", math.inf
        return case
    except OtmError:
        raise
    except Exception as exc:  # noqa: BLE001 - a crash on a legal input is a finding
        case.passed, case.law_error = False, math.inf
        case.reason = f"the kernel raised {type(exc).__name__}: {str(exc)[:120]}"
        return case
    stop_err = stopped_stream_error(law, target, ctx)
    std_err = max(abs(law.get(k, 0.0) - ref.get(k, 0.0)) for k in set(law) | set(ref))
    case.law_error = max(stop_err, std_err)
    case.tv = _tv(law, ref)
    case.acceptance = _mean_accepted(law) / L
    case.acceptance_ci = (case.acceptance, case.acceptance)
    case.optimum = _mean_accepted(ref) / L
    if stop_err > LAW_TOLERANCE:
        case.passed, case.reason = False, f"not a stopped target stream: law error {stop_err:.3g} (lossy)"
    elif std_err > LAW_TOLERANCE:
        case.passed, case.reason = False, (f"lossless, but the per-call law differs from the standard rule's by "
                                           f"{std_err:.3g} (accepted count / bonus)")
    return case


def _T_for(V: int, L: int) -> int:
    return max(1, min(L + 1, int(math.floor(math.log(81) / math.log(V) + 1e-9))))


def _statistical_case(call, kernel, s, L, tv, level, seed) -> tuple[Case, int]:
    import torch

    target, draft = _models(s)
    ctx = tuple(s["prompt"])
    T = _T_for(s["V"], L)
    case = Case(s["name"], "chain", 1, setting={"V": s["V"], "length": L, "prompt": list(ctx), "T": T})
    ref_T = _target_law_T(target, ctx, T)
    ref_call = standard_call_law(target, draft, ctx, L)
    n = max(draws_for(np.array(list(ref_T.values())), tv, level),
            draws_for(np.array(list(ref_call.values())), tv, level))
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    emitted = [()] * n
    first: list[tuple] = []
    try:
        while True:
            active = [b for b in range(n) if len(emitted[b]) < T]
            if not active:
                break
            contexts = [ctx + emitted[b] for b in active]
            dp, ids, tp = draw_chains(target, draft, contexts, L, rng)
            rows = emitted_rows(call(kernel, contexts, dp, ids, tp, gen, rng), ids, s["V"])
            if not first:
                first = rows
            for b, r in zip(active, rows):
                emitted[b] = emitted[b] + r
    except Malformed as exc:
        case.passed, case.reason, case.draws = False, f"malformed output: {exc}", n
        return case, n
    counts_T: dict[tuple, int] = {}
    for e in emitted:
        counts_T[e[:T]] = counts_T.get(e[:T], 0) + 1
    counts_call: dict[tuple, int] = {}
    for r in first:
        counts_call[r] = counts_call.get(r, 0) + 1
    keys = sorted(set(ref_T) | set(counts_T))
    gof_T = chi2_gof([counts_T.get(k, 0) for k in keys], [ref_T.get(k, 0.0) for k in keys], alpha=level)
    keys = sorted(set(ref_call) | set(counts_call))
    gof_c = chi2_gof([counts_call.get(k, 0) for k in keys], [ref_call.get(k, 0.0) for k in keys], alpha=level)
    case.draws = n
    case.pvalue = min(0.0 if gof_T.impossible else gof_T.pvalue, 0.0 if gof_c.impossible else gof_c.pvalue)
    case.tv = _tv({k: v / n for k, v in counts_T.items()}, ref_T)
    acc = sum(len(r) - 1 for r in first) / (n * L)
    case.acceptance, case.optimum = acc, _mean_accepted(ref_call) / L
    from ..testing import wilson_interval

    case.acceptance_ci = wilson_interval(sum(len(r) - 1 for r in first), n * L, 0.95)
    if gof_T.reject:
        case.passed = False
        case.reason = (f"{gof_T.impossible} runs emitted {T} tokens the target never emits" if gof_T.impossible else
                       f"lossy: first {T} tokens of repeated calls, chi-square p = {gof_T.pvalue:.3g} < {level:.3g} "
                       f"(empirical TV {case.tv:.3g})")
    elif gof_c.reject:
        case.passed = False
        case.reason = (f"{gof_c.impossible} calls emitted what the standard rule never emits" if gof_c.impossible else
                       f"one call's emission (accepted count, recovered, bonus) differs from the standard rule's: "
                       f"chi-square p = {gof_c.pvalue:.3g} < {level:.3g} (empirical TV "
                       f"{_tv({k: v / n for k, v in counts_call.items()}, ref_call):.3g})")
    return case, n


def certify_chain(kernel, *, layout: str, length: int = 2, tv: float = DEFAULT_CHAIN_TV, alpha: float = 0.001,
                  seed: int = 0, exact: bool | None = None, name: str | None = None,
                  vocabs: tuple = TILE_VOCABS, boundary: str = "refute") -> Report:
    """Certify a chain kernel in its engine's layout (module docstring): a :class:`Report`.

    Parameters
    ----------
    kernel : the callable, in the form ``layout`` names (:data:`LAYOUTS`).
    length : the draft chain length L (1..8).
    tv, alpha : statistical mode: total variation detected with power >= 0.99 by each test; family-wise level.
    exact : force (True) or forbid (False) the exact mode; default exact when the kernel allows it
        (transformers' code, :func:`exact_capable`).
    vocabs : vocabulary sizes of the out-of-range probe (default :data:`TILE_VOCABS`).
    boundary : ``"refute"`` (a failed u = 0 probe refutes) or ``"note"`` (it is reported in the notes
        only: the u = 0 event has probability 2^-24 per float32 test, for an engine that tracks it apart).
    """
    import torch

    _check_args(kernel, layout, length, tv, alpha)
    if boundary not in ("refute", "note"):
        raise OtmError(f"boundary must be 'refute' or 'note', got {boundary!r}")
    can_exact = layout == "transformers" and exact_capable(kernel)
    if exact is None:
        exact = can_exact
    elif exact and not can_exact:
        raise OtmError("the exact chain mode needs transformers' code (uniforms only in r_i <= probability_ratio): "
                       "certify this kernel statistically (exact=False)")
    call = CALLERS[layout]
    L = length
    label = name or _kernel_label(kernel)
    start = time.perf_counter()
    notes: list[str] = []
    cases: list[Case] = []
    sizes: list[int] = []
    level = alpha / (2 * len(SETTINGS))
    with torch.inference_mode():
        for i, s in enumerate(SETTINGS):
            if exact:
                cases.append(_exact_case(kernel, s, L))
            else:
                try:
                    case, n = _statistical_case(call, kernel, s, L, tv, level, seed * 1_000_003 + i)
                except OtmError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a crash on legal input is a finding
                    case, n = Case(s["name"], "chain", 1), 0
                    case.passed, case.reason = False, f"the kernel raised {type(exc).__name__}: {str(exc)[:120]}"
                cases.append(case)
                sizes.append(n)
        probe = boundary_probe(call, kernel, L, notes)
        if boundary == "note" and not probe.passed:
            notes.append(f"boundary probe (not refuting, boundary='note'): {probe.reason}")
            probe.reason = "(noted) " + probe.reason
            probe.passed = True
        cases.append(probe)
        cases.append(zero_draft_probe(call, kernel, L, notes))
        cases.append(tile_probe(call, kernel, L, tuple(vocabs), seed))
    failing = [c for c in cases if not c.passed]
    layout_text = f"layout {layout}, L = {L}"
    if exact:
        method = (f"exact ({layout_text}): every draft chain, first rejection (uniforms fed to r_i <= "
                  f"probability_ratio) and multinomial token enumerated on {len(SETTINGS)} toy settings; certified "
                  f"when one call's law is a stopped target stream and the standard rule's, within {LAW_TOLERANCE:g}; "
                  f"then the boundary (u = 0, q = 0) and tile-edge (V up to {max(vocabs) if vocabs else '-'}) probes")
        law_cases = [c for c in cases if c.law_error is not None]
        worst = failing[0] if failing else max(law_cases, key=lambda c: c.law_error, default=None)
        report = Report(label, "chain", f"{layout} layout, L = {L}", 1, not failing, cases, worst, method)
    else:
        method = (f"statistical ({layout_text}): {sum(sizes):,} chains per test over {len(SETTINGS)} toy settings; "
                  f"chi-square of the first T tokens of repeated calls against the target's law and of one call's "
                  f"emission against the standard rule's, each at level {level:.2g} (alpha {alpha:g} / "
                  f"{2 * len(SETTINGS)}, Bonferroni), power >= {POWER} against every law at TV >= {tv:g} (merged "
                  f"cells); then the boundary (u = 0, q = 0) and tile-edge (V up to "
                  f"{max(vocabs) if vocabs else '-'}) probes")
        stat_cases = [c for c in cases if c.pvalue is not None]
        worst = failing[0] if failing else min(stat_cases, key=lambda c: c.pvalue, default=None)
        report = Report(label, "chain", f"{layout} layout, L = {L}", 1, not failing, cases, worst, method, alpha=alpha,
                        detectable_tv=tv)
    report.notes = notes
    report.seconds = time.perf_counter() - start
    report.command = (f"otm certify {label} --kind chain --layout {layout} --length {L}"
                      + ("" if exact else f" --tv {tv:g} --seed {seed}"))
    return report


def assert_lossless(kernel, *, layout: str, length: int = 2, tv: float = DEFAULT_CHAIN_TV, **options) -> Report:
    """:func:`certify_chain`, raising ``AssertionError(report text)`` when the kernel is refuted (for an engine's
    pytest); the report when it is certified."""
    report = certify_chain(kernel, layout=layout, length=length, tv=tv, **options)
    if not report.certified:
        raise AssertionError(str(report))
    return report


__all__ = ["BUILTIN_KERNELS", "DEFAULT_CHAIN_TV", "LAYOUTS", "SETTINGS", "TILE_VOCABS", "ChainToy", "assert_lossless",
           "builtin_kernel", "certify_chain", "exact_capable", "reference_chain_kernel", "standard_call_law",
           "stopped_stream_error"]
