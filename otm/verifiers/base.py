"""What every verifier shares: the outcome type, input checks, residual helpers.

A verifier (draft-selection rule) maps ``(target, draft, drafts)`` to one output
token whose law, averaged over the drafts' scheme, is exactly ``target``.
Each verifier module offers

* ``law(target, draft, drafts)``: the exact conditional law of the output given
  the realised drafts (the verifier's uniforms integrated out), shape ``(V,)``;
* ``sample(target, draft, drafts, rng)``: the step-by-step rule as a decoder runs
  it (uniforms, accept / reject, residual), returning an :class:`Outcome`;
* ``bind(target, scheme)``: both, with per-position work (rho*, plans) done once.

Conventions (all modules):

* a draft is accepted with probability ``min(1, a / b)`` by testing ``u * b < a``
  with ``u`` uniform on [0, 1): a token of zero target mass is never accepted,
  even for ``u == 0`` (the boundary bug of SGLang #35771, also in vLLM/HF);
* residuals are positive parts ``(v)_+`` renormalised, never clamped to a tiny
  positive value (vLLM v0's drift). A residual with no mass is reached only with
  probability 0 in exact arithmetic (every draft is then accepted surely); if
  rounding ever reaches it, the rule draws from the current target law, which
  changes the output law by at most the rounding-level probability of getting
  there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..laws import OtmError, categorical, check_law, inverse_cdf, normalise, positive_part

NOT_ACCEPTED = None
"""``Outcome.accepted`` when the token came from the residual, not from a draft."""


@dataclass(frozen=True)
class Outcome:
    """One verification: the output ``token`` and ``accepted``, the index (into
    ``drafts``) of the draft it matched: the draft the rule accepted, or, when a
    residual draw lands on a draft token (greedy, lp_optimal), the first draft equal
    to it; ``NOT_ACCEPTED`` (None) when the token is not one of the drafts."""

    token: int
    accepted: int | None


@dataclass(frozen=True)
class BoundVerifier:
    """A verifier bound to one position's ``target`` and scheme."""

    law: Callable[[np.ndarray], np.ndarray]
    sample: Callable[[np.ndarray, np.random.Generator], Outcome]


def binder(law: Callable, sample: Callable) -> Callable:
    """``bind(target, scheme)`` of a rule with no per-position set-up: its ``law(target, draft, drafts)`` and
    ``sample(target, draft, drafts, rng)`` with the scheme's draft (the one bind the simple rules share)."""

    def bind(target, scheme) -> BoundVerifier:
        return BoundVerifier(lambda d: law(target, scheme.draft, d), lambda d, rng: sample(target, scheme.draft, d, rng))

    bind.__doc__ = "Bind the rule to one position's ``target`` and scheme (:func:`otm.verifiers.base.binder`)."
    return bind


def check_inputs(target, draft, drafts, k: int | None = None):
    """Validate and convert; returns ``(target, draft, drafts)`` as float64/float64/int64."""
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    d = np.asarray(drafts)
    if d.ndim != 1 or d.size == 0:
        raise OtmError(f"drafts must be a non-empty 1-D list of token ids, got shape {d.shape}")
    if not np.issubdtype(d.dtype, np.integer):
        raise OtmError("drafts must be integer token ids")
    if k is not None and d.size != k:
        raise OtmError(f"this verifier takes exactly {k} drafts, got {d.size}")
    if d.min() < 0 or d.max() >= target.size:
        raise OtmError(f"draft tokens must lie in 0..{target.size - 1}, got {d.min()}..{d.max()}")
    zero = d[draft[d] == 0]
    if zero.size:
        raise OtmError(
            f"draft token {int(zero[0])} has zero draft probability: drafts must be drawn from the draft law"
        )
    return target, draft, d.astype(np.int64)


def residual_law(residual: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """``norm(residual)``; ``fallback`` when it has no mass (a probability-0 branch, see module doc)."""
    r = normalise(residual)
    return fallback if r is None else r


def residual_sample(rng: np.random.Generator, residual: np.ndarray, fallback: np.ndarray) -> int:
    """One draw from ``norm(residual)`` (``fallback`` when it has no mass)."""
    return categorical(rng, residual if residual.sum() > 0 else fallback)


def accept(rng: np.random.Generator, numerator: float, denominator: float) -> bool:
    """True with probability ``min(1, numerator / denominator)``: ``u * den < num``, u in [0, 1)."""
    return rng.random() * denominator < numerator


def require_scheme(scheme, name: str, verifier: str, hint: str) -> None:
    """Refuse, in one line, to bind ``verifier`` to a scheme other than ``name`` (``hint``: what to use)."""
    if getattr(scheme, "name", None) != name:
        raise OtmError(f"{verifier} is for the {name} scheme only, not {getattr(scheme, 'name', scheme)!r}: {hint}")


def inverse_cdf_draw(residual):
    """``draw(u)`` for :func:`serve_selected`: the inverse CDF over ``residual()`` (an O(V) array,
    built only when a draw is asked), None when it has no mass."""

    def draw(u: float):
        r = residual()
        return inverse_cdf(r, u) if r.sum() > 0 else None

    return draw


def serve_selected(rng: np.random.Generator, d: np.ndarray, i: int, p_y: float, x_y: float, draw,
                   fallback: np.ndarray) -> Outcome:
    """Single-draft speculative sampling after selecting draft ``d[i]`` with selection law ``x``
    (the canonical form of the ``optimal`` verifiers): accept it w.p. ``min(1, p_y / x_y)``, else
    draw from ``norm((target - x)_+)`` with one uniform ``u`` and name the first draft equal to the
    draw, if any.

    ``draw(u) -> token | None`` draws from the residual with the uniform ``u`` (only called after a
    rejection): :func:`inverse_cdf_draw` over the whole residual, or a rule's own draw
    (:meth:`otm.verifiers.optimal.GroupedRule.draw_residual`, group first). None means the residual has no
    mass (probability 0 in exact arithmetic): then the inverse CDF of ``fallback`` at the same ``u``,
    as :func:`residual_sample` does."""
    y = int(d[i])
    if accept(rng, p_y, x_y):
        return Outcome(y, i)
    return draw_and_name(d, rng.random(), draw, fallback)


def draw_and_name(d: np.ndarray, u: float, draw, fallback: np.ndarray) -> Outcome:
    """After every draft is rejected: ``draw(u)`` from the residual (None: no mass, probability 0 in
    exact arithmetic, then the inverse CDF of ``fallback`` at the same ``u``, as :func:`residual_sample`
    does), naming the first draft equal to the token, if any."""
    z = draw(u)
    if z is None:
        z = inverse_cdf(fallback, u)
    hit = np.flatnonzero(d == z)
    return Outcome(int(z), int(hit[0]) if hit.size else None)


__all__ = [
    "NOT_ACCEPTED",
    "Outcome",
    "BoundVerifier",
    "check_inputs",
    "residual_law",
    "serve_selected",
    "draw_and_name",
    "inverse_cdf_draw",
    "require_scheme",
    "residual_sample",
    "accept",
    "positive_part",
    "OtmError",
]
