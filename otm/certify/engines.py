r"""Real engines' verification rules at one node, for the audit (``docs/audit.md``).

Each rule is written here from the engine's published code or issue thread as described in the
project's peer notes (transformers' is imported from the installed package itself), in the forms
:func:`otm.certify.certify` takes: ``law(target, draft, drafts)`` (the exact law of the output given
the drafts) and ``sample(target, draft, drafts, rng)`` (the step-by-step rule, with its own
comparisons, so boundary bugs like ``u <= ratio`` are visible to the boundary probe). ``draft`` is
the law the drafts were drawn from; ``drafts`` the node's children in sibling order.

:data:`ENGINE_RULES` lists each with its engine, source, the schemes its engine draws drafts with,
and our expectation, which ``tests/test_engines.py`` and the audit check.

>>> import numpy as np
>>> sglang = ENGINE_RULES["sglang_target_only"]  # thresholds 1.0: inverse-CDF sampling of the target
>>> law = sglang.law(np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.3, 0.1]), np.array([0, 1]))
>>> law.round(3).tolist()
[0.5, 0.3, 0.2]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
from unittest import mock

import numpy as np

from ..laws import categorical
from ..verifiers import rrs, speculative
from ..verifiers.base import Outcome, check_inputs, positive_part, residual_law


def _children_in_order(drafts: np.ndarray) -> list[int]:
    """The node's children: distinct tokens in first-appearance order (engines merge equal siblings)."""
    seen: list[int] = []
    for x in drafts.tolist():
        if x not in seen:
            seen.append(int(x))
    return seen


# -- transformers -----------------------------------------------------------------------------------


def transformers_law(target, draft, drafts):
    """transformers' ``_speculative_sampling`` for one candidate, in law: accept x w.p. min(1, p(x)/q(x)),
    else y ~ norm((p - q)_+): Leviathan et al.'s rule, exact in law."""
    return speculative.law(target, draft, drafts)


def transformers_sample(target, draft, drafts, rng):
    """Calls the installed ``transformers.generation.utils._speculative_sampling`` on one candidate.

    Its accept test is ``r_i <= p_i / q_i`` with ``r_i = torch.rand_like(...)``; the uniform is fed
    from ``rng.random()`` (so the boundary probe reaches the comparison), the residual draw
    (``torch.multinomial``) from a torch seed taken from ``rng``. Logits are ``log`` of the laws
    (a zero mass is ``-inf``, which ``softmax`` maps back to 0).
    """
    import torch
    from transformers.generation.utils import _speculative_sampling

    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = int(d[0])
    u = float(rng.random())
    torch.manual_seed(int(rng.integers(2**62)))
    with np.errstate(divide="ignore"):
        q_logits = torch.tensor(np.log(draft))[None, None]  # [1, 1, V]
        p_logits = torch.tensor(np.log(target))[None, None].expand(1, 2, -1)  # [1, 2, V]: the candidate's, the bonus
    with mock.patch.object(torch, "rand_like", lambda t: torch.full_like(t, u)):
        tokens, _ = _speculative_sampling(torch.tensor([[x]]), q_logits, 1, p_logits)
    y = int(tokens[0, 0])
    return Outcome(y, 0 if y == x else None)


# -- SGLang -----------------------------------------------------------------------------------------


def sglang_target_only(threshold_single: float = 1.0, threshold_acc: float = 1.0):
    """SGLang's ``TreeSpeculativeSamplingTargetOnly`` at one node, as ``(law, sample)``.

    One coin u ~ U[0, 1); the children x_1..x_m (distinct, in sibling order) are visited with the
    running target mass P_i = p(x_1) + ... + p(x_i); child i is accepted when ``u < P_i / threshold_acc``
    or ``p(x_i) >= threshold_single`` (the half-open test of SGLang PR #35798); a rejected child's
    draft probability is set to its target probability, so the residual ``relu(p - draft_probs)`` is
    p without the tried children, sampled with a second coin. The draft law is not used
    ("target only"). With both thresholds 1 this is inverse-CDF sampling of y ~ p with the children
    first: exact whatever the drafts; below 1 it accepts more often and is lossy by design.
    """

    def law(target, draft, drafts):
        target, draft, d = check_inputs(target, draft, drafts)
        out, reached, running = np.zeros_like(target), 1.0, 0.0  # reached: P(no child accepted yet)
        kids = _children_in_order(d)
        for x in kids:
            running += target[x]
            if target[x] >= threshold_single:
                out[x] += reached
                return out
            accept_to = min(1.0, running / threshold_acc)  # u < accept_to accepts by now
            taken = max(0.0, reached - (1.0 - accept_to))
            out[x] += taken
            reached -= taken
        rest = target.copy()
        rest[kids] = 0.0
        return out + reached * residual_law(rest, target)

    def sample(target, draft, drafts, rng):
        target, draft, d = check_inputs(target, draft, drafts)
        u = rng.random()
        running, tried = 0.0, target.copy()
        for i, x in enumerate(_children_in_order(d)):
            running += target[x]
            if u < running / threshold_acc or target[x] >= threshold_single:
                return Outcome(x, int(np.flatnonzero(d == x)[0]))
            tried[x] = 0.0  # draft_probs[x] := p(x): relu(p - draft_probs) drops x
        return Outcome(categorical(rng, tried if tried.sum() > 0 else target), None)

    return law, sample


# -- llama.cpp ------------------------------------------------------------------------------------------


def llamacpp_law(target, draft, drafts):
    """llama.cpp ``examples/speculative`` with parallel drafts: SpecInfer's recursive rule (accept x_i with
    min(1, p_i(x_i)/q(x_i)), residual p_{i+1} = norm((p_i - q)_+)) applied to the drafts it has, which
    are the draft's top candidates (deterministic), as if they had been sampled from q."""
    return rrs.law(target, draft, drafts)


def llamacpp_sample(target, draft, drafts, rng):
    """The same, step by step, with llama.cpp's ``r <= p / q`` comparison."""
    target, draft, d = check_inputs(target, draft, drafts)
    current = target
    for i, x in enumerate(d.tolist()):
        if rng.random() * draft[x] <= current[x]:
            return Outcome(int(x), i)
        current = residual_law(positive_part(current - draft), current)
    return Outcome(categorical(rng, current), None)


# -- transformers issue 47932 ------------------------------------------------------------------------


RAW_MASS = 0.8
"""Mass the processed (top-k / top-p) draft law keeps of the raw one, in :func:`mismatched_law`."""


def raw_draft_law(draft: np.ndarray, z: float = RAW_MASS) -> np.ndarray:
    """The law a generator returning *raw* logits reports when it sampled from the processed law ``draft``:
    ``z * draft`` on the kept tokens, ``1 - z`` spread over the removed ones (over all tokens if none)."""
    removed = draft == 0
    spread = removed if removed.any() else np.ones_like(removed)
    return z * draft + (1 - z) * spread / spread.sum()


def mismatched_law(target, draft, drafts):
    """Speculative sampling (k = 1) or RRS (k > 1) given the raw draft law while the drafts come from the
    processed one (transformers issue 47932: DFlash, MTP and single-position generators): p/q is inflated
    by 1/z on the kept tokens."""
    target, draft, d = check_inputs(target, draft, drafts)
    raw = raw_draft_law(draft)
    return speculative.law(target, raw, d) if d.size == 1 else rrs.law(target, raw, d)


def mismatched_sample(target, draft, drafts, rng):
    target, draft, d = check_inputs(target, draft, drafts)
    raw = raw_draft_law(draft)
    return speculative.sample(target, raw, d, rng) if d.size == 1 else rrs.sample(target, raw, d, rng)


# -- EAGLE ----------------------------------------------------------------------------------------------


def eagle_law(target, draft, drafts):
    """EAGLE's (SafeAILab) ``evaluate_posterior`` sampling path: q := 1 for every candidate; accept
    candidate x with probability p'(x) under the current adjusted target p'; on a reject set
    p'(x) = 0 and renormalise; after the last candidate, y ~ p'. This is sequential sampling of
    y ~ p (is it x_1? else x_2? ...): exact for any drafts, with acceptance p(set of drafts)."""
    target, draft, d = check_inputs(target, draft, drafts)
    out, stay, current = np.zeros_like(target), 1.0, target.copy()
    for x in d.tolist():
        a = current[x]
        out[x] += stay * a
        stay *= 1.0 - a
        if stay <= 0.0:
            return out
        current[x] = 0.0
        current = current / current.sum()
    return out + stay * current


def eagle_sample(target, draft, drafts, rng):
    target, draft, d = check_inputs(target, draft, drafts)
    current = target.copy()
    for i, x in enumerate(d.tolist()):
        if rng.random() < current[x]:
            return Outcome(int(x), i)
        current[x] = 0.0
        current = current / current.sum()
    return Outcome(categorical(rng, current), None)


# -- vLLM --------------------------------------------------------------------------------------------------


def vllm_probabilistic_sample(target, draft, drafts, rng):
    """vLLM v1 ``rejection_random_sample_kernel`` (one draft): accept iff ``q(x) > 0 and p(x) / q(x) >= u``;
    the recovered token is ``argmax_y (p - q)_+(y) / E_y`` with E_y ~ Exp(1) (an exponential race, the
    law norm((p - q)_+))."""
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = int(d[0])
    u = rng.random()
    if draft[x] > 0 and target[x] / draft[x] >= u:
        return Outcome(x, 0)
    residual = positive_part(target - draft)
    if not residual.sum() > 0:
        residual = target
    e = rng.exponential(size=target.size)
    with np.errstate(divide="ignore"):
        return Outcome(int(np.argmax(residual / e)), None)


def vllm_probabilistic_torch(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
    """The same, batched (k = 1): ``uniforms [n, 2]`` column 0 is u (the exponentials come from ``generator``)."""
    import torch

    import otm.torch as ot

    p, q = target.double(), draft.double()  # [n, V]
    n = p.shape[0]
    u = uniforms[:, 0] if uniforms is not None else torch.rand(n, dtype=torch.float64, generator=generator)
    x = drafts[:, 0]  # [n]
    px, qx = p.gather(1, drafts)[:, 0], q.gather(1, drafts)[:, 0]  # [n]
    accept = (qx > 0) & (px / qx >= u)
    residual = (p - q).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
    e = torch.empty_like(p).exponential_(generator=generator)  # [n, V]
    recovered = (residual / e).argmax(-1)
    return ot.Verified(torch.where(accept, x, recovered), torch.where(accept, 0, ot.NOT_ACCEPTED))


def vllm_strict_law(target, draft, drafts):
    """vLLM's strict (exact-match) mode: y ~ p drawn independently of the drafts, a draft accepted iff it
    equals y (MCSD's _MCNS). The output is the target's own draw: exact, acceptance sum_x p(x) over the set."""
    target, draft, d = check_inputs(target, draft, drafts)
    return target.copy()


def vllm_strict_sample(target, draft, drafts, rng):
    target, draft, d = check_inputs(target, draft, drafts)
    y = categorical(rng, target)
    hit = np.flatnonzero(d == y)
    return Outcome(y, int(hit[0]) if hit.size else None)


# -- the registry ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRule:
    """One engine's rule: its forms, where it comes from, and what the audit runs it under."""

    name: str
    engine: str
    source: str
    law: Callable
    sample: Callable
    torch: Callable | None
    schemes: tuple[tuple[str, int], ...]  # (scheme, k) its engine draws drafts with, audited in this order
    expected_exact: tuple[bool, ...]  # our expectation per scheme, in law (boundary bugs aside)
    note: str


sglang_law, sglang_sample = sglang_target_only(1.0, 1.0)
sglang_law.__name__, sglang_sample.__name__ = "sglang_law", "sglang_sample"  # importable by these names
sglang_law.__qualname__, sglang_sample.__qualname__ = "sglang_law", "sglang_sample"
sglang_lossy_law, sglang_lossy_sample = sglang_target_only(0.9, 0.9)
sglang_lossy_law.__name__, sglang_lossy_sample.__name__ = "sglang_lossy_law", "sglang_lossy_sample"
sglang_lossy_law.__qualname__, sglang_lossy_sample.__qualname__ = "sglang_lossy_law", "sglang_lossy_sample"

ENGINE_RULES: dict[str, EngineRule] = {
    r.name: r
    for r in (
        EngineRule("transformers_speculative_sampling", "transformers 5.23",
                   "src/transformers/generation/utils.py::_speculative_sampling (imported and called)",
                   transformers_law, transformers_sample, None, (("iid", 1),), (True,),
                   "accept test r <= p/q with r = torch.rand_like (float32: r == 0 has probability 2^-24)"),
        EngineRule("sglang_target_only", "SGLang", "sgl-kernel speculative_sampling.cuh, "
                   "TreeSpeculativeSamplingTargetOnly, thresholds 1.0 (the defaults)",
                   sglang_law, sglang_sample, None, (("top", 2), ("top", 4), ("iid", 2)), (True, True, True),
                   "inverse-CDF sampling of y ~ p with the children first; the draft law is unused"),
        EngineRule("sglang_target_only_thresholds_0.9", "SGLang",
                   "the same kernel with speculative_accept_threshold_single/acc = 0.9",
                   sglang_lossy_law, sglang_lossy_sample, None, (("top", 2),), (False,),
                   "thresholds below 1 accept more often: lossy by design"),
        EngineRule("llamacpp_multibranch", "llama.cpp", "examples/speculative (parallel drafts, PR 5625): "
                   "drafts are the draft's top candidates, verified by SpecInfer's rule r <= p/q",
                   llamacpp_law, llamacpp_sample, None, (("top", 2), ("top", 3)), (False, False),
                   "a rule for sampled drafts applied to deterministic ones"),
        EngineRule("mismatched_draft_law", "transformers (issue 47932)",
                   "DFlash / MTP / single-position candidate generators return raw logits while sampling from "
                   "processed (top-k) ones; modelled with the raw law z q + (1 - z) spread, z = 0.8",
                   mismatched_law, mismatched_sample, None, (("iid", 1), ("iid", 2)), (False, False),
                   "p/q inflated by 1/z on the kept tokens"),
        EngineRule("eagle_ignores_draft_law", "EAGLE (SafeAILab)",
                   "eagle/model/utils.py::evaluate_posterior, sampling path (issue 329: q := 1)",
                   eagle_law, eagle_sample, None, (("top", 2), ("iid", 2)), (True, True),
                   "sequential sampling of y ~ p: exact for any drafts, acceptance only p(set)"),
        EngineRule("vllm_probabilistic", "vLLM v1", "vllm/v1/sample/rejection_sampler.py::"
                   "rejection_random_sample_kernel + sample_recovered_tokens_kernel",
                   speculative.law, vllm_probabilistic_sample, vllm_probabilistic_torch, (("iid", 1),), (True,),
                   "accept test p/q >= u with u = torch.rand: u == 0 accepts a zero-mass draft"),
        EngineRule("vllm_strict", "vLLM (PR 38496, strict mode)", "exact-match verification: a draft is "
                   "accepted iff it equals the target's own sample", vllm_strict_law, vllm_strict_sample, None,
                   (("iid", 1), ("iid", 2)), (True, True), "exact; acceptance sum p(x) q(x) for one draft"),
    )
}
"""The audited rules, by name."""
