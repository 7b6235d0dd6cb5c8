r"""The exponential race's trapezoid rule in :math:`y = \log t`: the grid, the sums and their error estimate.

Three computations integrate over the race's time t (:mod:`otm.optimum`, docstring):

* :math:`Q(H) = \int c\, e^{-ct} F_H(t)\, dt` at every prefix (the reference scan,
  :func:`otm.optimum.prefix_membership`) and at a few prefixes (:mod:`otm.race_window`):
  :func:`race_grid` (cut where each end's part is below :data:`TRUNCATION`),
  :func:`weights` (:math:`c t e^{-ct}`) and :func:`trapezoid`;
* :math:`E[N_\rho] = \int e^{-\beta s} P(N_c(s) < k)\, ds`
  (:func:`otm.verifiers.kseq_without_replacement.expected_trials`): :func:`nodes` from
  :math:`s_0` with the part left of it in closed form, :func:`trapezoid_from_zero`.

All of them substitute :math:`t = e^y`, so the integrand gains a factor t and decays
exponentially at both ends; the trapezoid rule with step h then converges like
:math:`e^{-\pi^2/h}` (Trefethen & Weideman 2014, see :mod:`otm.optimum`). The grid has an even
number of steps, so its every other node is the step-2h rule, and :math:`|T_h - T_{2h}|` is the
error estimate each caller compares with its tolerance (it estimates the error of the coarser
rule; the returned step-h sum is more accurate still). Where each grid is cut, and why the part
cut off is negligible, is the caller's integrand's business: :func:`race_grid` for Q, the
docstring of :mod:`otm.verifiers.kseq_without_replacement` for :math:`E[N_\rho]`.
"""

from __future__ import annotations

import math

import numpy as np

QUADRATURE_STEP_SCALE = 0.19
"""Default trapezoid step in ``y = log t`` is ``0.19 / k**0.25`` (0.144 at k = 3, 0.113 at k = 8).

The Poisson-binomial tail sharpens in ``y`` like ``1/sqrt(k)``; this step keeps the
check rule (step ``2h``) within about 1e-12 on peaked, Dirichlet(1) and uniform laws
up to k = 16, so the finer rule that is returned sits at the rounding level.
"""

TRUNCATION = 1e-17
"""Bound on the part of the race integral cut off at each end of the ``y`` grid."""

_UPPER = 45.0  # c_min * t_max: e^-45 = 3e-20 cut off, 45 e^-45 = 1e-18 first neglected node


def default_step(k: int) -> float:
    """The default race-quadrature step for ``k`` drafts: ``0.19 / k**0.25``."""
    return QUADRATURE_STEP_SCALE / k**0.25


def nodes(y0: float, y1: float, h: float) -> np.ndarray:
    """``y0 + h * arange(m + 1)``: the grid of step ``h`` from ``y0`` to at least ``y1``, ``m`` even and >= 2
    (so the nodes ``0, 2, 4, ...`` are the step-``2h`` rule)."""
    m = max(2 * math.ceil((y1 - y0) / (2 * h)), 2)
    return y0 + h * np.arange(m + 1)


def race_grid(k: int, c_min: float, step: float | None = None, ce_max: float | None = None) -> np.ndarray:
    r"""The ``y = log t`` nodes of the race quadrature of :math:`Q(H)`.

    The line is cut at :math:`t_\min` and :math:`t_\max` such that each cut-off
    part of :math:`Q(H) = \int c e^{-ct} F_H(t) dt` is at most
    :math:`T` = :data:`TRUNCATION` for every prefix whose complement mass is
    at least ``c_min``:

    * below: :math:`F_H(t) \le (q(H) t)^k / k!`, so the part below
      :math:`t_\min` is at most :math:`c\, q(H)^k t_\min^{k+1} / (k+1)! \le
      t_\min^{k+1} / (k+1)! = T`;
    * above: :math:`\int_{t_\max}^\infty c e^{-ct} dt = e^{-c t_\max} \le
      e^{-c_\min t_\max}`, with :math:`c_\min t_\max = 45`
      (:math:`e^{-45} < 3 \cdot 10^{-20}`).

    With ``ce_max``, an upper bound on :math:`c\, e_k(q_H)` over the prefixes evaluated
    (:math:`e_k` the elementary symmetric polynomial of H's masses), the lower cut rises to
    :math:`t_\min = ((k+1) T / \mathrm{ce}_{\max})^{1/(k+1)}` when that is larger: since
    :math:`F_H(t) \le e_k(1 - e^{-q t}) \le e_k(q)\, t^k`, the part below is at most
    :math:`c\, e_k(q_H)\, t_\min^{k+1}/(k+1) \le T` (the bound above is the case
    :math:`e_k(q_H) \le q(H)^k/k! \le 1/k!`). A dominant draft token with the rest of H
    of mass r has :math:`e_k(q_H) \approx r^{k-1}/(k-1)!`, tiny: the grid then starts far higher.
    The trapezoid's own neglected nodes are bounded alike: below by
    :math:`h\,(k+1)\,T / (e^{(k+1)h} - 1) \le T` (the integrand is at most
    :math:`t^{k+1}/k!`), above by about :math:`h \cdot 45 e^{-45} < 10^{-18}`.
    The node count is even plus one (:func:`nodes`), so every other node is the step-``2h``
    rule that checks the step-``h`` rule.

    Parameters
    ----------
    k : int
        Number of drafts.
    c_min : float
        Smallest positive complement mass among the prefixes evaluated.
    ce_max : float, optional
        Upper bound on :math:`c\, e_k(q_H)` over the prefixes evaluated (default: no bound, i.e. 1/k!).
    step : float, optional
        Trapezoid step ``h`` (default :func:`default_step`).

    Returns
    -------
    y : ndarray, shape (G,)

    Examples
    --------
    >>> y = race_grid(3, 1e-6)
    >>> round(float(y[0]), 3), round(float(y[-1]), 3), y.size
    (-8.991, 17.861, 187)
    """
    step = default_step(k) if step is None else float(step)
    t_min = (math.factorial(k + 1) * TRUNCATION) ** (1.0 / (k + 1))
    if ce_max is not None and 0.0 < ce_max < 1.0 / math.factorial(k):
        t_min = max(t_min, math.exp((math.log((k + 1) * TRUNCATION) - math.log(ce_max)) / (k + 1)))
    # t_min above t_max: m = 2, and every evaluated Q is below 2T
    return nodes(math.log(t_min), math.log(_UPPER) - math.log(c_min), step)


def weights(c: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""``w[i, g]`` = :math:`c_i t e^{-c_i t}` at :math:`t = e^{y_g}` (the density of the first ring
    outside H, times the Jacobian t), formed in logs; 0 on the rows where ``c[i]`` is 0."""
    live = c > 0
    log_ct = np.log(np.where(live, c, 1.0))[:, None] + y[None, :]
    w = np.exp(log_ct - np.exp(log_ct))
    w[~live] = 0.0
    return w


def trapezoid(w: np.ndarray, F: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray]:
    r"""Row by row, the step-``h`` trapezoid sum of ``w F`` (nodes of one grid, shape (B, G)) and its
    error estimate :math:`|T_h - T_{2h}|`, :math:`T_{2h}` the rule on every other node.

    The end nodes carry the full weight h: the integrands vanish at both cuts (below the
    truncation bound), so the rule is the one over the whole line, cut."""
    fine = h * np.einsum("bg,bg->b", w, F)
    coarse = 2 * h * np.einsum("bg,bg->b", w[:, ::2], F[:, ::2])
    return fine, np.abs(fine - coarse)


def left_tail(h: float) -> float:
    """``h/(1 - e^-h)``: the trapezoid rule's nodes at and left of ``y0`` for an integrand ``e^y``,
    per ``e^y0``; summed over the whole line the rule is exact to ~1e-16 here."""
    return h / -math.expm1(-h)


def trapezoid_from_zero(f: np.ndarray, h: float):
    r"""The step-``h`` trapezoid sum over the whole line of an integrand sampled as ``f`` on
    :func:`nodes` from ``y0``, which left of ``y0`` is :math:`f_0 e^{y - y_0}` (to the caller's
    accuracy), and its error estimate :math:`|T_h - T_{2h}|`: ``(fine, error)``.

    The nodes at and left of ``y0`` sum to :math:`f_0` :func:`left_tail`\ (h); the right end is cut
    where the integrand is negligible (the caller's bound)."""
    fine = h * f[1:].sum() + f[0] * left_tail(h)
    coarse = 2 * h * f[2::2].sum() + f[0] * left_tail(2 * h)
    return fine, abs(fine - coarse)


__all__ = ["QUADRATURE_STEP_SCALE", "TRUNCATION", "default_step", "nodes", "race_grid", "weights", "trapezoid",
           "left_tail", "trapezoid_from_zero"]
