r"""A catalogue of planted, realistic bugs in token-level rules: what certification must catch.

Each *mutant* is a correct rule of :mod:`otm.verifiers` / :mod:`otm.torch` with one realistic
mistake, the kind real engines shipped (``docs/audit.md``): a factor computed for the wrong k, a
residual never updated or never renormalised, a rejected draft left in the proposal, the law of
the wrong draft, ``u <= ratio`` at the boundary, one uniform used twice, a rare wrong branch.
Each comes in the forms it can be written in (exact ``law``, numpy ``sample``, batched ``torch``)
so the test suite can show that ``otm certify`` refutes every form, and
:func:`exact_tv` gives its exact total variation from the target on the certification bank (the
largest over the bank's cases), the size of the bug. Decoder bugs are in
:mod:`otm.certify.decoder_mutants`.

>>> m = MUTANTS["rrs_residual_not_updated"]
>>> round(exact_tv(m), 3) > 0.01
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..laws import categorical
from ..verifiers import kseq, rrs, spechub
from ..verifiers.base import Outcome, accept, check_inputs, positive_part, residual_law


@dataclass(frozen=True)
class Mutant:
    """One planted bug: the rule it breaks, the mistake, and its forms."""

    name: str
    breaks: str  # the correct rule, e.g. "otm.verifiers.kseq"
    mistake: str  # one line: what the code does wrong
    scheme: str
    k: int
    law: Callable | None = None  # law(target, draft, drafts) -> [V]
    sample: Callable | None = None  # sample(target, draft, drafts, rng) -> token
    torch: Callable | None = None  # batched, signature of otm.torch verifiers

    @property
    def forms(self) -> tuple[str, ...]:
        return tuple(f for f in ("law", "sampler", "torch") if getattr(self, "sample" if f == "sampler" else f) is not None)


# -- the mistakes --------------------------------------------------------------------------------------


def kseq_rho_for_k_minus_1_law(target, draft, drafts):
    """K-SEQ with rho* solved for k - 1 drafts (an off-by-one in the count passed to the solver)."""
    return kseq.law(target, draft, drafts, rho=kseq.rho_star(target, draft, len(drafts) - 1))


def kseq_rho_for_k_minus_1_torch(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
    import otm.torch as ot

    rho = ot.rho_star(target, draft, drafts.shape[1] - 1, validate=validate)  # [batch]: the count is off by one
    return ot.kseq(target, draft, drafts, uniforms=uniforms, generator=generator, rho=rho, validate=validate)


def rrs_residual_not_updated_law(target, draft, drafts):
    """RRS that tests every draft against the target itself: the residual p_{i+1} = norm((p_i - q)_+)
    is computed only once, for the final draw (a loop that forgets to carry its state)."""
    target, draft, d = check_inputs(target, draft, drafts)
    out, stay = np.zeros_like(target), 1.0
    for x in d:
        a = min(1.0, target[x] / draft[x])
        out[x] += stay * a
        stay *= 1.0 - a
    return out + stay * residual_law(positive_part(target - draft), target)


def rrs_residual_not_updated_sample(target, draft, drafts, rng):
    target, draft, d = check_inputs(target, draft, drafts)
    for i, x in enumerate(d):
        if accept(rng, target[x], draft[x]):
            return Outcome(int(x), i)
    return Outcome(categorical(rng, positive_part(target - draft) if (target > draft).any() else target), None)


def rrs_without_replacement_keeps_rejected_law(target, draft, drafts):
    """RRS without replacement that never removes a rejected draft from the proposal q (RRS with
    replacement run on distinct drafts)."""
    return rrs.law(target, draft, drafts)


def greedy_full_draft_law_law(target, draft, drafts):
    """Hu et al.'s greedy rule testing its last draft against the full draft law q instead of the law it
    was drawn from, q restricted to the tokens outside the fixed ones (the peers' commonest bug class:
    a q that does not describe how the draft was sampled)."""
    target, draft, d = check_inputs(target, draft, drafts)
    x = d[-1]
    a = min(1.0, target[x] / draft[x])
    out = (1.0 - a) * residual_law(positive_part(target - draft), target)
    out[x] += a
    return out


def speculative_resamples_target_law(target, draft, drafts):
    """Single-draft speculative sampling that, after a rejection, samples the target p instead of the
    residual norm((p - q)_+)."""
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = d[0]
    a = min(1.0, target[x] / draft[x])
    out = (1.0 - a) * target
    out[x] += a
    return out


def speculative_resamples_target_sample(target, draft, drafts, rng):
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = int(d[0])
    if accept(rng, target[x], draft[x]):
        return Outcome(x, 0)
    return Outcome(categorical(rng, target), None)


def speculative_leq_sample(target, draft, drafts, rng):
    """``u * q(x) <= p(x)`` instead of ``<``: with u == 0.0 a draft of zero target mass is accepted
    (SGLang #35771; the same pattern in vLLM, transformers, gpt-fast). Exact in law for continuous u."""
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = int(d[0])
    if rng.random() * draft[x] <= target[x]:
        return Outcome(x, 0)
    return Outcome(categorical(rng, positive_part(target - draft)), None)


def speculative_leq_torch(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
    import torch

    import otm.torch as ot

    out = ot.speculative(target, draft, drafts, uniforms=uniforms, generator=generator, validate=validate)
    if uniforms is None:
        return out
    take = uniforms[:, 0] * draft.gather(1, drafts)[:, 0] <= target.gather(1, drafts)[:, 0]  # [batch]: the bug
    return ot.Verified(torch.where(take, drafts[:, 0], out.token), out.accepted)


def residual_not_renormalised_law(target, draft, drafts):
    """Speculative sampling whose residual draw inverts the CDF of (p - q)_+ without dividing by its mass
    s = TV(p, q) < 1: a uniform above s falls off the end and is clamped to the last token."""
    target, draft, d = check_inputs(target, draft, drafts, k=1)
    x = d[0]
    a = min(1.0, target[x] / draft[x])
    r = positive_part(target - draft)
    s = min(float(r.sum()), 1.0)
    res = r.copy()
    res[-1] += 1.0 - s  # [V]: P(u < cdf) for each cell, the rest clamped to V - 1
    out = (1.0 - a) * res
    out[x] += a
    return out


def residual_not_renormalised_torch(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
    import torch

    import otm.torch as ot

    out = ot.speculative(target, draft, drafts, uniforms=uniforms, generator=generator, validate=validate)
    u = uniforms[:, 1] if uniforms is not None else torch.rand(target.shape[0], dtype=torch.float64, generator=generator)
    cdf = (target.double() - draft.double()).clamp_min(0).cumsum(-1)  # [batch, V]: not divided by its mass
    y = torch.searchsorted(cdf, u[:, None].contiguous(), right=True)[:, 0].clamp_max(target.shape[1] - 1)  # [batch]
    return ot.Verified(torch.where(out.accepted >= 0, out.token, y), out.accepted)


def kseq_shared_uniform_torch(target, draft, drafts, *, uniforms=None, generator=None, validate=True):
    """K-SEQ drawing its residual token with the first draft's accept uniform instead of a fresh one
    (one uniform used twice: given a rejection that uniform is no longer uniform)."""
    import torch

    k = drafts.shape[1]
    u = uniforms if uniforms is not None else torch.rand((target.shape[0], k + 1), dtype=torch.float64,
                                                         generator=generator)
    u = u.clone()
    u[:, k] = u[:, 0]  # the bug
    import otm.torch as ot

    return ot.kseq(target, draft, drafts, uniforms=u, validate=validate)


RARE_BRANCH = 0.05
"""How often :func:`kseq_rare_naive_branch_law` takes its wrong branch."""


def kseq_rare_naive_branch_law(target, draft, drafts):
    """K-SEQ that on 5% of calls (a rarely taken code path, e.g. a fallback for one dtype or a batch
    edge) runs with rho = 1, the naive rule: a small bug (TV well below 0.01 on most laws)."""
    good = kseq.law(target, draft, drafts)
    bad = kseq.law(target, draft, drafts, rho=1.0)
    return (1 - RARE_BRANCH) * good + RARE_BRANCH * bad


def spechub_order_ignored_law(target, draft, drafts):
    """SpecHub verifying the pair as if the hub always came second (the order of the two drafts,
    which decides which test applies, is dropped)."""
    target, draft, d = check_inputs(target, draft, drafts, k=2)
    hub = int(np.argmax(draft))
    pair = d[::-1].copy() if d[0] == hub else d
    return spechub.law(target, draft, pair)


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("kseq_rho_for_k_minus_1", "otm.verifiers.kseq", "rho* solved for k - 1 drafts", "iid", 3,
               law=kseq_rho_for_k_minus_1_law, torch=kseq_rho_for_k_minus_1_torch),
        Mutant("rrs_residual_not_updated", "otm.verifiers.rrs", "every draft tested against p, residual not carried",
               "iid", 2, law=rrs_residual_not_updated_law, sample=rrs_residual_not_updated_sample),
        Mutant("rrs_without_replacement_keeps_rejected", "otm.verifiers.rrs_without_replacement",
               "rejected draft not removed from q", "without_replacement", 3, law=rrs_without_replacement_keeps_rejected_law),
        Mutant("greedy_full_draft_law", "otm.verifiers.greedy", "last draft tested against q, not the q' it was drawn from",
               "greedy", 3, law=greedy_full_draft_law_law),
        Mutant("speculative_resamples_target", "otm.verifiers.speculative", "after a rejection, y ~ p instead of the residual",
               "iid", 1, law=speculative_resamples_target_law, sample=speculative_resamples_target_sample),
        Mutant("speculative_u_leq_ratio", "otm.verifiers.speculative", "u * q <= p accepts zero-mass drafts at u == 0",
               "iid", 1, sample=speculative_leq_sample, torch=speculative_leq_torch),
        Mutant("residual_not_renormalised", "otm.torch.speculative", "residual CDF not divided by its mass, tail clamped",
               "iid", 1, law=residual_not_renormalised_law, torch=residual_not_renormalised_torch),
        Mutant("kseq_shared_uniform", "otm.torch.kseq", "the residual draw reuses the first accept uniform", "iid", 2,
               torch=kseq_shared_uniform_torch),
        Mutant("kseq_rare_naive_branch", "otm.verifiers.kseq", "5% of calls run the naive rule (rho = 1)", "iid", 3,
               law=kseq_rare_naive_branch_law),
        Mutant("spechub_order_ignored", "otm.verifiers.spechub", "the pair verified as if the hub came second",
               "spechub", 2, law=spechub_order_ignored_law),
    )
}
"""The token-level catalogue, by name."""


def exact_tv(mutant: Mutant) -> float | None:
    """The mutant's largest exact total variation from the target over the certification bank (its law
    form, every draft tuple enumerated); None for a mutant without a law form."""
    if mutant.law is None:
        return None
    from .rules import certify

    report = certify(mutant.law, kind="law", scheme=mutant.scheme, k=mutant.k, examples=0)
    return max((c.tv for c in report.cases if c.tv is not None), default=None)
