r"""Hierarchical speculative decoding (HSD) of one draft chain: the decision law, in numpy float64.

Zhou, Huang, Li, Wu, Wang, Zhang, Lin & Cheng, "Overcoming Joint Intractability with Lossless
Hierarchical Speculative Decoding", arXiv 2601.05724 (ICLR 2026); code:
github.com/ZhouYuxuanYX/Hierarchical-Speculative-Decoding. The decoder's rules are
:class:`otm.decode.tree_rules_hsd.Hsd` and :class:`otm.decode.tree_rules_hsd.HsdCode`; ``docs/audit.md``
(published tree rules) gives the sources read, the paper-against-code differences and the verdicts;
``tests/test_tree_rules_hsd.py`` the evidence.

**The rule.** A chain :math:`X_1..X_\gamma` drawn from the draft laws :math:`Q_t = q(\cdot \mid c,
X_{<t})`, the target laws :math:`P_t = p(\cdot \mid c, X_{<t})` (:math:`t = 1..\gamma + 1`). Joint
probabilities of the prefixes :math:`p(X_{1:t}) = \prod_{i \le t} P_i(X_i)`, likewise :math:`q`, their
ratio :math:`r_t = p(X_{1:t}) / q(X_{1:t})` (:math:`r_0 = 1`), and the *capped* joint target

.. math::

    M_t = \max(1, r_1, \dots, r_t),\qquad \tilde p(X_{1:t}) = p(X_{1:t}) / M_t .

The *branch* at :math:`X_{1:t}` (:math:`t = 0..\gamma - 1`) compares the joint laws of its children,
:math:`\tilde p(X_{1:t}) P_{t+1}(x)` against :math:`q(X_{1:t}) Q_{t+1}(x)`, by its excess and deficit

.. math::

    D^+_t = \sum_x \big(\tilde p(X_{1:t}) P_{t+1}(x) - q(X_{1:t}) Q_{t+1}(x)\big)_+,\qquad
    D^-_t = \sum_x \big(q(X_{1:t}) Q_{t+1}(x) - \tilde p(X_{1:t}) P_{t+1}(x)\big)_+ .

The verification scans backwards: the whole chain is accepted with probability
:math:`a_\gamma = \min(1, r_\gamma)` (the *uncapped* joint ratio); else, from :math:`t = \gamma - 1`
down to 0, level t is kept with probability :math:`a_t = D^+_t / \max(D^+_t, D^-_t)` and stepped back
from otherwise (:math:`a_0 = 1`). With :math:`\tau` the level kept (the largest t whose independent
coin :math:`B_t \sim \mathrm{Bernoulli}(a_t)` came up), :math:`P(\tau = t) = a_t \prod_{j > t}(1 - a_j)`;
emit :math:`X_1..X_\tau` and one more token, from :math:`P_{\gamma + 1}` if :math:`\tau = \gamma`, else
from :math:`\mathrm{norm}\big((\tilde p(X_{1:\tau}) P_{\tau+1} - q(X_{1:\tau}) Q_{\tau+1})_+\big)`.

**What it is, on one chain.** Divide the branch by :math:`q(X_{1:t})`: :math:`w_t = r_t / M_t` is
exactly block verification's weight :math:`p_t = \min(1, p_{t-1} P_t(X_t) / Q_t(X_t))` (induction on t),
so :math:`D^\pm_t / q(X_{1:t})` are BV's :math:`R_t` and :math:`R_t + 1 - p_t`, :math:`a_t = R_t / (R_t + 1 - p_t)`
is BV's :math:`h_t` and the residual is BV's, for every :math:`t < \gamma`. The one difference is the
top level: BV keeps the whole chain with :math:`h_\gamma = p_\gamma = \min(1, r_\gamma / M_{\gamma-1})`,
HSD with :math:`\min(1, r_\gamma) \ge p_\gamma`, strictly larger when an earlier prefix ratio exceeds 1
and :math:`r_\gamma < M_{\gamma - 1}`. ``top="capped"`` here gives BV exactly (tested); ``top="joint"``
is HSD, whose expected block length then exceeds block verification's, which is the optimum of every
lossless rule on one chain (Sun et al., ICLR 2025; the tree LP at k = 1): HSD is not lossless.

Two arithmetics: :func:`hsd_law` (the rule as above, in ratio form, :math:`a_t = 0` when
:math:`D^+_t = D^-_t = 0`) and :func:`hsd_code_law` (the public code's own arithmetic and conventions:
joint probabilities through ``exp(cumsum(log))``, the running maximum, :math:`0/0` as NaN, a NaN level
kept, and an error where the code would sample from a NaN residual).

>>> import numpy as np
>>> P = np.array([[0.5, 0.5], [0.2, 0.8], [0.5, 0.5]]); Q = np.array([[0.9, 0.1], [0.5, 0.5]])
>>> tau, res = hsd_law(P, Q, np.array([1, 0]))   # r_1 = 5, r_2 = 2: HSD keeps the chain for sure
>>> tau.round(6).tolist()
[0.0, 0.0, 1.0]
>>> hsd_law(P, Q, np.array([1, 0]), top="capped")[0].round(6).tolist()   # block verification: h_2 = 0.4
[0.0, 0.6, 0.4]
"""

from __future__ import annotations

import numpy as np

from ..laws import OtmError

TOPS = ("joint", "capped")
"""How the whole chain is accepted: ``joint`` min(1, r_gamma) (HSD), ``capped`` min(1, r_gamma / M_{gamma-1}) (= BV)."""


def _inputs(targets, drafts, chain) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    P = np.asarray(targets, dtype=np.float64)
    Q = np.asarray(drafts, dtype=np.float64)
    chain = np.asarray(chain, dtype=np.int64).reshape(-1)
    gamma = chain.size
    if P.ndim != 2 or Q.ndim != 2 or gamma < 1 or P.shape[0] != gamma + 1 or Q.shape[0] != gamma:
        raise OtmError(f"HSD needs gamma + 1 target laws and gamma draft laws for a chain of {gamma} tokens, got "
                       f"{P.shape[0] if P.ndim == 2 else P.shape} and {Q.shape[0] if Q.ndim == 2 else Q.shape}")
    if P.shape[1] != Q.shape[1] or not (0 <= chain.min() and chain.max() < P.shape[1]):
        raise OtmError(f"HSD laws must share one vocabulary and the chain's tokens must lie in it (V = {P.shape[1]}, "
                       f"draft V = {Q.shape[1]}, tokens {chain.tolist()})")
    if np.any(Q[np.arange(gamma), chain] <= 0):
        raise OtmError("a chain token has draft probability 0: the chain was not drawn from these draft laws")
    return P, Q, chain, gamma


def _tau_law(a: np.ndarray) -> np.ndarray:
    r""":math:`P(\tau = t) = a_t \prod_{j > t} (1 - a_j)` for the keep probabilities ``a`` (``a[0] = 1``)."""
    after = np.append(np.cumprod((1.0 - a)[::-1])[::-1][1:], 1.0)  # prod_{j > t} (1 - a_j)
    return a * after


def hsd_weights(targets, drafts, chain) -> tuple[np.ndarray, np.ndarray]:
    r"""``(r, w)``: the prefix ratios :math:`r_t` and the capped ratios :math:`w_t = r_t / M_t`, t = 0..gamma."""
    P, Q, chain, gamma = _inputs(targets, drafts, chain)
    idx = np.arange(gamma)
    r = np.concatenate([[1.0], np.cumprod(P[idx, chain] / Q[idx, chain])])  # r_0 = 1
    M = np.maximum.accumulate(np.maximum(r, 1.0))  # M_t = max(1, r_1..r_t)
    return r, r / M


def hsd_law(targets, drafts, chain, *, top: str = "joint") -> tuple[np.ndarray, np.ndarray]:
    r"""HSD's law of the kept level :math:`\tau` and its residuals (module docstring), float64.

    Parameters
    ----------
    targets : ``[gamma + 1, V]`` the target laws :math:`P_1..P_{\gamma+1}` (root, then each chain node).
    drafts : ``[gamma, V]`` the draft laws :math:`Q_1..Q_\gamma` the chain was drawn from.
    chain : ``[gamma]`` the drafted tokens :math:`X_1..X_\gamma`.
    top : ``"joint"`` (HSD: the chain kept with :math:`\min(1, r_\gamma)`) or ``"capped"``
        (:math:`\min(1, r_\gamma / M_{\gamma-1})`: block verification).

    Returns
    -------
    (tau_law ``[gamma + 1]``, residuals ``[gamma + 1, V]``): :math:`P(\tau = t)` and the law of the token
    emitted after :math:`X_{1:t}` (row gamma is :math:`P_{\gamma+1}`), rows normalised; a row whose level
    is never kept may have no mass. A level with :math:`D^+_t = D^-_t = 0` (the branch laws agree) is
    never kept (:math:`a_t = 0`): it has nothing to resample from; the paper's text available to us
    does not settle this 0/0.
    """
    if top not in TOPS:
        raise OtmError(f"unknown top {top!r}: choose one of {', '.join(TOPS)}")
    P, Q, chain, gamma = _inputs(targets, drafts, chain)
    r, w = hsd_weights(P, Q, chain)
    branch = w[:gamma, None] * P[:gamma] - Q  # the branch at X_{1:t} over q(X_{1:t}), t = 0..gamma-1
    excess = np.maximum(branch, 0.0)
    d_plus, d_minus = excess.sum(-1), np.maximum(-branch, 0.0).sum(-1)
    big = np.maximum(d_plus, d_minus)
    a = np.empty(gamma + 1)
    a[:gamma] = np.divide(d_plus, big, out=np.zeros(gamma), where=big > 0)
    a[0] = 1.0
    a[gamma] = min(1.0, r[gamma]) if top == "joint" else w[gamma]
    rows = np.divide(excess, d_plus[:, None], out=excess.copy(), where=d_plus[:, None] > 0)
    return _tau_law(a), np.vstack([rows, P[gamma : gamma + 1]])


def hsd_code_law(targets, drafts, chain) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The public code's HSD on one chain (``transformers/generation/utils.py:_speculative_sampling``,
    ``backward=True``, one draft; same arithmetic as its ``simulation.py:HSD``), replayed in float64.

    Follows the code step by step: joint prefix probabilities as ``exp(cumsum(log))``, the prefix ratio
    capped by its running maximum from 1 (including the prefix itself), ``p_next - q_next`` on the joint
    scale, keep probability ``p_plus.sum / max(p_plus.sum, p_minus.sum)`` per level with independent
    coins, the last kept level (0 when every level steps back), the whole chain accepted when
    ``u <= exp(cumsum(log p_i) - cumsum(log q_i))`` (uncapped), the residual ``p_plus / denominator``
    renormalised. A level where both sums are 0 gives NaN: the code's test ``u < NaN`` is false, so the
    level is kept; if it is then the level to resample from, the code would call
    ``torch.multinomial`` on NaN (an error): the third return value marks those rows.

    Returns
    -------
    (tau_law ``[gamma + 1]``, residuals ``[gamma + 1, V]``, nan_rows ``[gamma + 1]`` bool).
    """
    P, Q, chain, gamma = _inputs(targets, drafts, chain)
    idx = np.arange(gamma)
    q_i, p_i = Q[idx, chain], P[idx, chain]
    with np.errstate(divide="ignore", invalid="ignore"):
        joint_q_prev = np.exp(np.cumsum(np.log(np.concatenate([[1.0], q_i[:-1]]))))  # q(X_{1:k}), k = 0..gamma-1
        joint_p_prev = np.exp(np.cumsum(np.log(np.concatenate([[1.0], p_i[:-1]]))))  # p(X_{1:k})
        ratio = joint_p_prev / joint_q_prev
        previous_max = np.maximum.accumulate(np.maximum(ratio, 1.0))
        p_next = (joint_p_prev / previous_max)[:, None] * P[:gamma]
        q_next = joint_q_prev[:, None] * Q
        diffs = p_next - q_next
        p_plus, p_minus = np.maximum(diffs, 0.0), np.maximum(-diffs, 0.0)
        denominator = np.maximum(p_plus.sum(-1, keepdims=True), p_minus.sum(-1, keepdims=True))
        p_primes = p_plus / denominator  # NaN where 0/0
        step_back = 1.0 - p_primes.sum(-1)
        full = float(np.exp(np.cumsum(np.log(p_i))[-1] - np.cumsum(np.log(q_i))[-1]))
    keep = np.where(np.isnan(step_back), 1.0, 1.0 - step_back)  # u < NaN is False: a NaN level is kept
    keep[0] = 1.0  # every level stepped back: the code stops at 0 ("if step_back.all(): stop_positions = 0")
    a = np.append(keep, min(1.0, full))
    with np.errstate(invalid="ignore"):
        rows = p_primes / p_primes.sum(-1, keepdims=True)
    nan_rows = np.append(np.isnan(rows).any(-1), False)
    rows = np.where(np.isnan(rows), 0.0, rows)
    return _tau_law(a), np.vstack([rows, P[gamma : gamma + 1]]), nan_rows


def chain_block_law(tau_law, residuals, chain) -> dict[tuple, float]:
    """``{emitted block: probability}`` from a chain rule's decision law (tokens X_1..X_tau, then one more)."""
    chain = [int(x) for x in np.asarray(chain).reshape(-1)]
    law: dict[tuple, float] = {}
    for t, pt in enumerate(np.asarray(tau_law, dtype=np.float64).tolist()):
        if pt <= 0:
            continue
        for y in np.flatnonzero(residuals[t] > 0).tolist():
            law[tuple(chain[:t]) + (y,)] = law.get(tuple(chain[:t]) + (y,), 0.0) + pt * float(residuals[t][y])
    return law


__all__ = ["TOPS", "chain_block_law", "hsd_code_law", "hsd_law", "hsd_weights"]
