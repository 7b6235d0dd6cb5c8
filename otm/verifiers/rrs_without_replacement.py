r"""Recursive rejection sampling without replacement (RRSw): Multi-Candidate
Speculative Decoding (Yang et al., 2024), Recursive Speculative Decoding (Jeon et
al., 2024), Sequoia's verifier.

For drafts :math:`x_1..x_k` drawn from :math:`q` (``draft``) without replacement
(successive sampling, the law of the Gumbel-top-k order) and target :math:`p`:

.. math::

    p_1 = p,\ q_1 = q; \quad \text{accept } x_i \text{ w.p. }
    \min\!\left(1, \frac{p_i(x_i)}{q_i(x_i)}\right); \quad
    p_{i+1} = \mathrm{norm}\big((p_i - q_i)_+\big),\
    q_{i+1} = \mathrm{norm}\big(q_i \cdot 1[\cdot \ne x_i]\big);

if all k are rejected emit :math:`y \sim p_{k+1}`. ``q_{i+1}`` is the law the
next draft was really drawn from, which is what makes the rule exact.

"Acceptance. The rule has no closed-form acceptance; two ways to get it at any ``V``:

* :func:`acceptance_exact` -- the sum over *rejection paths*, exact, cost about ``V^k``;
* :func:`acceptance_monte_carlo` -- an unbiased, Rao-Blackwellised estimate with its
  standard error, cost ``O(paths * k * V)``.

Derivation. Write :math:`p_i, q_i` for the target residual and the draft law at
step ``i`` (``p_1 = p``, ``q_1 = q``). Step ``i`` drafts ``x ~ q_i`` and rejects
it with probability :math:`1 - \min(1, p_i(x)/q_i(x))`, so

.. math::

    P(\text{draft } x \text{ and reject it at step } i \mid \text{state}) = (q_i(x) - p_i(x))_+ .

After a rejection of ``x`` the state becomes
:math:`p_{i+1} = \mathrm{norm}((p_i - q_i)_+)` (the same for every rejected ``x``)
and :math:`q_{i+1} = \mathrm{norm}(q_i \cdot 1[\cdot \ne x])`. A rejected token
has zero mass in every later residual, so membership acceptance equals loop
acceptance (Jeon et al., 2024; docs/theory.md section 3) and

.. math::

    \alpha_{\mathrm{RRSw}} = 1 - R(p, q, k), \qquad
    R(p_i, q_i, m) = \sum_x (q_i(x) - p_i(x))_+ \; R(p_{i+1}, q_i^{-x}, m - 1), \quad R(\cdot, \cdot, 0) = 1.

:func:`acceptance_exact` evaluates this sum level by level over the live paths (only tokens
with :math:`q_i > p_i` branch). Writing :math:`r_i = \sum_x (q_i - p_i)_+` (the
rejection probability at step ``i``) and drawing the rejected token from
:math:`(q_i - p_i)_+ / r_i`, the product :math:`\prod_i r_i` along one random path
has expectation exactly ``R``: that is :func:`acceptance_monte_carlo` (every factor is a
conditional probability, not a 0/1 indicator, so the variance is far below that of
simulating the verifier).

>>> import numpy as np
>>> round(acceptance_exact([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)  # = otm.exact.evaluate on the same laws
0.9

>>> import numpy as np
>>> law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [2, 0]).round(4)
array([0.6667, 0.    , 0.3333])

Pieces: its scheme ``otm.schemes.WithoutReplacement``; torch twin ``otm.torch.rrs_without_replacement`` and sampler ``otm.torch.sample_without_replacement``; alpha* in ``otm.optimum`` (the exponential race); its acceptance below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..laws import OtmError, check_k, check_law
from .embedding import require_distinct
from .base import Outcome, accept, binder, check_inputs, positive_part, residual_law, residual_sample



def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the ordered drafts."""
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "rrs_without_replacement")
    out = np.zeros_like(target)
    current, proposal = target, draft  # p_i, q_i
    stay = 1.0
    for i, x in enumerate(d):
        a = min(1.0, current[x] / proposal[x])
        out[x] += stay * a
        stay *= 1.0 - a
        if stay == 0.0:
            return out
        current = residual_law(positive_part(current - proposal), current)
        if i == d.size - 1:
            break  # no further draft: the proposal is not needed (and may have no mass left)
        proposal = proposal.copy()
        proposal[x] = 0.0
        proposal = proposal / proposal.sum()
    return out + stay * current


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "rrs_without_replacement")
    current, proposal = target, draft
    for i, x in enumerate(d):
        if accept(rng, current[x], proposal[x]):
            return Outcome(int(x), i)
        nxt = positive_part(current - proposal)
        current = nxt / nxt.sum() if nxt.sum() > 0 else current
        if i == d.size - 1:
            break
        proposal = np.where(np.arange(proposal.size) == x, 0.0, proposal)
        proposal = proposal / proposal.sum()
    return Outcome(residual_sample(rng, current, current), None)


bind = binder(law, sample)


# ---- acceptance (module docstring: rejection-path sum and its Monte Carlo) ----

MAX_STATES = 400_000
"""Default cap on ``live paths x V`` entries held by :func:`acceptance_exact` at one level."""

DEFAULT_PATHS = 2000
"""Default number of Monte Carlo paths."""


@dataclass(frozen=True)
class Estimate:
    """An RRSw acceptance: ``value``, its standard error ``se`` (0 when exact) and ``method``."""

    value: float
    se: float
    method: str  # "exact" or "monte_carlo"
    paths: int = 0


def _check(target, draft, k):
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    k = check_k(k)
    if np.count_nonzero(draft > 0) < k:
        raise OtmError(
            f"rrs_without_replacement needs at least k={k} tokens with positive draft mass, "
            f"the draft has {np.count_nonzero(draft > 0)}: lower k"
        )
    return target, draft, k


def _normalise_rows(m: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    s = m.sum(axis=1, keepdims=True)
    ok = s[:, 0] > 0
    out = fallback.copy()
    out[ok] = m[ok] / s[ok]
    return out


def n_paths_exact(V: int, k: int) -> int:
    """Upper bound on the live paths :func:`acceptance_exact` holds at its deepest level: ``V^(k-1)``."""
    return V ** (k - 1)


def acceptance_exact(target, draft, k: int, *, max_states: int = MAX_STATES) -> float:
    """Exact RRSw acceptance by the rejection-path sum (module docstring).

    Raises :class:`~otm.laws.OtmError` when a level would hold more than
    ``max_states`` entries (live paths times V); use :func:`acceptance_monte_carlo` then.
    """
    target, draft, k = _check(target, draft, k)
    V = target.size
    weight = np.ones(1)  # [n] probability of the path so far (all rejected)
    cur = target[None, :]  # [n, V] p_i
    prop = draft[None, :]  # [n, V] q_i
    for step in range(k):
        rej = np.maximum(prop - cur, 0.0)  # [n, V] (q_i - p_i)_+
        if step == k - 1:
            return float(1.0 - (weight * rej.sum(axis=1)).sum())
        nxt = _normalise_rows(np.maximum(cur - prop, 0.0), cur)  # [n, V] p_{i+1}
        rows, cols = np.nonzero(rej > 0)
        if rows.size * V > max_states:
            raise OtmError(
                f"exact RRSw acceptance needs {rows.size} paths x V={V} > max_states={max_states} at step "
                f"{step + 2} of k={k}: use acceptance_monte_carlo or raise max_states"
            )
        weight = weight[rows] * rej[rows, cols]
        cur = nxt[rows]
        prop = prop[rows].copy()
        prop[np.arange(rows.size), cols] = 0.0
        prop = prop / prop.sum(axis=1, keepdims=True)
        if rows.size == 0:
            return 1.0
    raise AssertionError("unreachable")  # pragma: no cover


def acceptance_monte_carlo(target, draft, k: int, *, paths: int = DEFAULT_PATHS, rng=None, batch: int | None = None) -> Estimate:
    """Unbiased Rao-Blackwellised estimate of the RRSw acceptance, with its standard error.

    Each path draws the rejected token of step ``i`` from :math:`(q_i - p_i)_+ / r_i`
    and scores :math:`\\prod_i r_i`; the estimate is ``1 - mean(score)``, the
    standard error ``std(score) / sqrt(paths)``.
    """
    target, draft, k = _check(target, draft, k)
    if paths < 2:
        raise OtmError(f"acceptance_monte_carlo needs paths >= 2 for a standard error, got {paths}")
    rng = np.random.default_rng(rng)
    V = target.size
    batch = batch or max(2, min(paths, 4_000_000 // max(V, 1)))
    scores = []
    done = 0
    while done < paths:
        n = min(batch, paths - done)
        score = np.ones(n)
        cur = np.broadcast_to(target, (n, V)).copy()
        prop = np.broadcast_to(draft, (n, V)).copy()
        for step in range(k):
            rej = np.maximum(prop - cur, 0.0)  # [n, V]
            r = rej.sum(axis=1)  # [n]
            score *= r
            if step == k - 1:
                break
            cur = _normalise_rows(np.maximum(cur - prop, 0.0), cur)  # p_{i+1}
            live = r > 0
            if not live.any():
                break
            cdf = np.cumsum(rej[live], axis=1)
            u = rng.random(int(live.sum())) * cdf[:, -1]
            x = np.minimum((cdf <= u[:, None]).sum(axis=1), V - 1)  # inverse CDF, side="right"
            idx = np.flatnonzero(live)
            prop[idx, x] = 0.0
            prop[live] = prop[live] / prop[live].sum(axis=1, keepdims=True)
        scores.append(score)
        done += n
    s = np.concatenate(scores)
    return Estimate(float(1.0 - s.mean()), float(s.std(ddof=1) / np.sqrt(s.size)), "monte_carlo", int(s.size))


def acceptance(target, draft, k: int, *, paths: int = DEFAULT_PATHS, rng=None, max_states: int = MAX_STATES) -> Estimate:
    """Exact RRSw acceptance when the path sum fits in ``max_states``, else :func:`acceptance_monte_carlo`."""
    target, draft, k = _check(target, draft, k)
    try:
        return Estimate(acceptance_exact(target, draft, k, max_states=max_states), 0.0, "exact")
    except OtmError:
        return acceptance_monte_carlo(target, draft, k, paths=paths, rng=rng)
