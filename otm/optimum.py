r"""The exact optimum :math:`\alpha^*` of the OTM problem in closed form, at real vocabulary sizes.

The optimal membership acceptance of a draft scheme with tuple law :math:`P`
against a target law :math:`p` is, by LP duality and total unimodularity
(Hu et al., ICLR 2025; docs/theory.md section 2), a minimum cut:

.. math::

    \alpha^*(p, P) = \min_{H \subseteq \Sigma} \; p(H) + 1 - Q(H),
    \qquad Q(H) = P(\text{all } k \text{ drafts lie in } H).

For ``iid`` and ``without_replacement`` drafts the minimum is attained on a
prefix :math:`H_j` of the tokens sorted by the ratio ``target / draft``
ascending (Hu et al. [1]_; proved below), so

.. math::

    \alpha^* = \min_{0 \le j \le V} \; p(H_j) + 1 - Q(H_j),

an :math:`O(V \log V)` sort and one scan, given :math:`Q(H_j)` for every prefix.

**Why a prefix.** With :math:`\Delta_x(S) = Q(S + x) - Q(S)`, the *exchange inequality*
:math:`(E)\; \Delta_a(S + b) / q_a \ge \Delta_b(S) / q_b` (every set S, tokens :math:`a \ne b` outside S
with positive draft mass) holds for iid drafts and drafts without replacement; it gives that a prefix of
the ratio order is a minimiser (the float order costs at most :math:`2 \epsilon\, p \le 2.3 \cdot 10^{-16}`),
and that Q is *convex in the draft mass* along any order (used by :mod:`otm.race_window`). Proof:
``docs/theory.md``, section 2, "The prefix property".

Evidence beyond the proof: the brute-force search ``analysis/research/prefix_property_search.py``
(random families and Nelder-Mead attacks, V = 3..8, k = 2..5) found no prefix gap above
rounding and no violation of (E); the tests check (E) on every (S, a, b) of hypothesis
laws, with greedy drafts (for which both fail) as negative control.

Q(H_j) by scheme:

* ``iid``: :math:`Q(H) = q(H)^k`, with the complement mass taken from suffix
  sums (no ``1 - prefix`` cancellation);
* ``without_replacement``, k = 1, 2: exact running sums,
  :math:`Q(H) = \sum_{a \in H} q_a\, q(H \setminus a) / (1 - q_a)` for k = 2;
* ``without_replacement``, k >= 3: the exponential race. Successive sampling
  is the order of independent clocks :math:`E_x \sim \mathrm{Exp}(q_x)`, so
  with :math:`c = q(\Sigma \setminus H)` and :math:`F_H(t)` the probability
  that at least k of the clocks of :math:`H` have rung by time t,

  .. math::

      Q(H) = \int_0^\infty c\, e^{-ct} F_H(t)\, dt
           = \int_{-\infty}^{\infty} c\, e^{y - c e^y} F_H(e^y)\, dy .

  The integrand is analytic and bounded in the strip
  :math:`|\operatorname{Im} y| < \pi/2` and decays exponentially at both ends,
  so the trapezoidal rule with step ``h`` converges like
  :math:`e^{-\pi^2 / h}` (Trefethen & Weideman 2014). One grid of
  ``y`` nodes serves every prefix: the truncated Poisson-binomial law of the
  number of rung clocks is updated token by token in sorted order, and each
  prefix is a dot product. The truncation of the line costs at most
  :math:`10^{-17}` on each side (bounds in :func:`otm.race_quadrature.race_grid`); the
  discretisation error is estimated by the rule with every other node
  (step ``2h``) and reported as ``error_estimate``.

For k >= 3 without replacement the default (``method="auto"``) evaluates this
quadrature only at the prefixes that can hold the minimum (:mod:`otm.race_window`:
bounds on Q, convexity and monotonicity exclude the rest, with the same grid and
rule), 14-23 ms instead of 0.4-3.4 s at V = 49152 (docs/closed_form.md);
``method="reference"`` scans every prefix.

``greedy`` and ``spechub`` have their own closed forms (docs/theory.md section 2;
Hu et al. and SpecHub); the prefix property can fail for them (they break (E)).

:func:`brute_force_optimum` (:mod:`otm.brute_force`) is the reference: the minimum over all
:math:`2^V` subsets with :math:`Q` from the scheme's enumeration (V <= 20), for any scheme.

References
----------
.. [1] Z. Hu et al., "Towards Optimal Multi-draft Speculative Decoding",
   ICLR 2025, arXiv:2502.18779.
.. [2] Z. Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
   Transport", NeurIPS 2023, arXiv:2310.15141.
.. [3] R. Sun et al., "SpecHub: Provable Acceleration to Multi-Draft
   Speculative Decoding", EMNLP 2024, arXiv:2411.05289.
.. [4] L. N. Trefethen and J. A. C. Weideman, "The exponentially convergent
   trapezoidal rule", SIAM Review 56(3), 2014.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .brute_force import BRUTE_FORCE_MAX_V, brute_force_cut, brute_force_optimum  # noqa: F401  (re-exported)
from .laws import OtmError, check_k, check_law
from .race_quadrature import default_step, race_grid, trapezoid, weights
from .race_window import MARGIN, TIE, add_clocks, window_inside
from .schemes import Greedy, Scheme, SpecHub, Top, check_target, make_scheme

QUADRATURE_TOLERANCE = 1e-10
"""Largest accepted quadrature error estimate; above it the step is halved (twice at most), then a warning."""

CHECK_TOLERANCE = 1e-10
"""Largest accepted difference between the two fast computations of Q at the minimiser (otherwise the reference scan runs)."""

_BLOCK = 256  # tokens per block in the race scan (bounds the [block, grid] buffers)


def _warn_quadrature(err: float, step: float, stacklevel: int) -> None:
    """The race quadrature's error estimate stayed above its tolerance at the finest step tried."""
    warnings.warn(
        f"race quadrature error estimate {err:.2e} above {QUADRATURE_TOLERANCE:g} "
        f"even with step {step:g}: the value may be off by about that much",
        QuadratureWarning,
        stacklevel=stacklevel,
    )


class QuadratureWarning(RuntimeWarning):
    """The race quadrature's error estimate is above :data:`QUADRATURE_TOLERANCE`."""


@dataclass(frozen=True)
class Optimum:
    """The optimum :math:`\\alpha^*` of one (scheme, target) pair and a set attaining it.

    Attributes
    ----------
    value : float
        :math:`\\alpha^* = p(H) + 1 - Q(H)` at the minimising ``H``.
    scheme : str
        Scheme name (``iid``, ``without_replacement``, ``greedy``, ``spechub``, ``table``).
    k : int
        Number of drafts.
    H : ndarray, shape (V,), bool
        A minimising set of the cut form (the dual variable ``v = 1_H``).
    method : str
        ``"prefix"`` (exact running sums), ``"prefix+race"`` (the k >= 3 race
        quadrature at every prefix, the reference), ``"prefix+race-window"``
        (the same quadrature at the prefixes that can hold the minimum, the others
        excluded by certified bounds: :mod:`otm.race_window`), ``"closed_form"``
        (greedy, spechub) or ``"brute_force"``.
    error_estimate : float
        0 for exact forms; for the race quadrature the largest
        ``|T_h - T_2h|`` over the prefixes computed, an estimate of the error of the
        coarser rule (the returned finer rule is more accurate still).
    order : ndarray, shape (V,), int64, or None
        The ratio order scanned (prefix methods only).
    prefix_values : ndarray, shape (V + 1,), or None
        :math:`p(H_j) + 1 - Q(H_j)` for every prefix ``j`` (prefix methods only);
        with ``"prefix+race-window"``, NaN at the prefixes proved not to beat the
        returned value by more than 1e-13 (their value was not computed).
    note : str
        How the value was found when that is not said by ``method``: for
        ``"prefix+race-window"`` how many prefixes were computed, and why the fast
        path was declined when the reference scan was used in its place.
    """

    value: float
    scheme: str
    k: int
    H: np.ndarray
    method: str
    error_estimate: float = 0.0
    order: np.ndarray | None = None
    prefix_values: np.ndarray | None = None
    note: str = ""

    @property
    def prefix(self) -> int | None:
        """``|H|`` when ``H`` is a prefix of ``order``, else ``None``."""
        return None if self.order is None else int(self.H.sum())


@dataclass(frozen=True)
class PrefixMembership:
    """:math:`Q(H_j)` for the prefixes ``H_j`` of an order, ``j = 0..V``.

    ``inside[j] = Q(H_j)``; ``outside[j] = 1 - Q(H_j)`` (computed without
    cancellation where the method allows: iid); ``error[j]`` the quadrature
    error estimate (0 for exact forms); ``method`` ``"exact"`` or ``"race"``.
    """

    inside: np.ndarray
    outside: np.ndarray
    error: np.ndarray
    method: str


# -----------------------------------------------------------------------------
# the ratio order
# -----------------------------------------------------------------------------
def ratio_order(target, draft) -> np.ndarray:
    r"""Tokens sorted by :math:`\mathrm{target}(x) / \mathrm{draft}(x)` ascending.

    ``draft = 0`` counts as ratio :math:`+\infty` and comes after every token of
    positive draft mass, ``target = 0 < draft`` as 0; ties keep the lower index
    first (a stable sort). A ratio that overflows (``draft`` subnormal, below
    ``target / 1.8e308``) is compared as ``target / (draft * 2**600)`` (exact
    scaling), after every finite ratio: it is never tied with ``draft = 0`` nor
    with another overflowed ratio by accident (that tie put a zero-draft token
    before a needed one and gave a wrong alpha*).

    Parameters
    ----------
    target : array_like, shape (V,)
    draft : array_like, shape (V,)

    Returns
    -------
    order : ndarray, shape (V,), int64

    Examples
    --------
    >>> ratio_order([0.5, 0.3, 0.2], [0.2, 0.2, 0.6]).tolist()
    [2, 1, 0]
    """
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    positive = draft > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(positive, target / np.where(positive, draft, 1.0), np.inf)
    order = np.argsort(ratio, kind="stable").astype(np.int64)
    n_inf = int(np.count_nonzero(np.isinf(ratio)))  # draft = 0 or an overflowed ratio, at the end
    if n_inf:
        tail = order[order.size - n_inf :]  # in index order (stable sort)
        pos = positive[tail]
        scaled = np.zeros(n_inf)
        scaled[pos] = target[tail[pos]] / (draft[tail[pos]] * 2.0**600)  # exact scaling, finite
        order[order.size - n_inf :] = tail[np.lexsort((scaled, ~pos))]  # positive draft first, by ratio
    return order


# -----------------------------------------------------------------------------
# Q(H_j) along an order
# -----------------------------------------------------------------------------
def _suffix_sums(x: np.ndarray) -> np.ndarray:
    """``s[j] = sum(x[j:])`` for ``j = 0..n`` (``s[n] = 0``), summed from the small end."""
    s = np.zeros(x.size + 1)
    s[: x.size] = np.cumsum(x[::-1])[::-1]
    return s


def _prefix_sums(x: np.ndarray) -> np.ndarray:
    """``a[j] = sum(x[:j])`` for ``j = 0..n``."""
    a = np.zeros(x.size + 1)
    np.cumsum(x, out=a[1:])
    return a


def _iid_membership(qs: np.ndarray, k: int) -> PrefixMembership:
    inside_mass = _prefix_sums(qs)  # q(H_j)
    outside_mass = _suffix_sums(qs)  # c_j = q(complement), from the small end
    small = outside_mass <= 0.5
    with np.errstate(divide="ignore"):
        log_in = k * np.log1p(-np.minimum(outside_mass, 0.5))
    inside = np.where(small, np.exp(log_in), inside_mass**k)
    outside = np.where(small, -np.expm1(log_in), 1.0 - inside_mass**k)
    return PrefixMembership(inside, outside, np.zeros_like(inside), "exact")


def _wo2_inside(qp: np.ndarray) -> np.ndarray:
    """k = 2 without replacement over the positive masses ``qp`` (in scan order), prefixes 0..n."""
    n = qp.size
    star = int(np.argmax(qp))
    rest = qp.copy()
    rest[star] = 0.0
    comp = 1.0 - qp  # 1 - q_a, exact enough when q_a <= 1/2 ...
    comp[star] = float(np.sum(rest))  # ... and the big one's complement summed directly
    a = _prefix_sums(qp)  # q(H_j)
    r = _prefix_sums(rest)  # q(H_j minus the big token)
    s1 = _prefix_sums(rest / comp)  # sum over a in H_j, a != star, of q_a / (1 - q_a)
    s2 = _prefix_sums(rest * rest / comp)
    inside = a * s1 - s2  # sum_{a != star} q_a (q(H) - q_a) / (1 - q_a)
    has_star = np.arange(n + 1) > star
    if comp[star] > 0:
        inside = inside + np.where(has_star, qp[star] * r / comp[star], 0.0)
    inside[:2] = 0.0
    return np.clip(inside, 0.0, 1.0)


def _race_inside(qp: np.ndarray, k: int, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Race quadrature for prefixes 0..n of the positive masses ``qp``: (inside, error)."""
    n = qp.size
    c = _suffix_sums(qp)  # complement mass of each prefix
    inside = np.zeros(n + 1)
    error = np.zeros(n + 1)
    inside[n] = 1.0  # the whole support: the drafts surely lie in it
    if n <= k:  # the only prefix with >= k tokens is the whole support
        return inside, error
    y = race_grid(k, float(c[n - 1]), step)
    G = y.size
    t = np.exp(np.minimum(y, 700.0))
    huge = y[-1] > 700.0  # c_min below ~1e-302: form q_x t as exp(log q_x + y), t itself would overflow
    pmf = np.zeros((k, G))  # P(N_H(t) = m), m < k, for the current prefix
    pmf[0] = 1.0
    tail = np.zeros(G)  # F_H(t) = P(N_H(t) >= k), accumulated directly
    tmp = np.empty((k - 1, G))
    F = np.empty((_BLOCK, G))
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, n, _BLOCK):
            qb = qp[s : s + _BLOCK]
            B = qb.size
            x = np.exp(np.add.outer(np.log(qb), y)) if huge else np.multiply.outer(qb, t)  # q_x t, [B, G]
            stay = np.exp(-x)  # clock not yet rung
            rung = -np.expm1(-x)  # clock rung (no cancellation when q_x t is small)
            tail = add_clocks(pmf, tail, rung, stay, F, tmp).copy()
            j = np.arange(s + 1, s + B + 1)  # prefixes ending in this block
            cj = c[j]
            live = cj > 0
            fine, err = trapezoid(weights(cj, y), F[:B], step)
            inside[j] = np.where(live, fine, 1.0)
            error[j] = np.where(live, err, 0.0)
    inside[:k] = 0.0  # fewer than k tokens: exactly 0 (the scan gives 0 too)
    return np.clip(inside, 0.0, 1.0), error


def prefix_membership(
    draft, k: int, order, scheme: str = "without_replacement", *, step: float | None = None, method: str = "auto"
) -> PrefixMembership:
    r""":math:`Q(H_j) = P(\text{all } k \text{ drafts} \in H_j)` for every prefix :math:`H_j` of ``order``.

    .. math::

        Q_{\mathrm{iid}}(H) = q(H)^k, \qquad
        Q_{\mathrm{wo}}(H) = P(\text{first } k \text{ successive draws} \in H)
        = \int_0^\infty c\, e^{-ct}\, P\big(N_H(t) \ge k\big)\, dt,

    with :math:`c = q(\Sigma \setminus H)` and :math:`N_H(t)` the number of
    independent :math:`\mathrm{Exp}(q_x)` clocks of :math:`H` rung by time
    :math:`t` (a Poisson-binomial count). For k = 2 without replacement the
    exact form :math:`\sum_{a \in H} q_a q(H \setminus a)/(1 - q_a)` is used
    unless ``method="race"``.

    Parameters
    ----------
    draft : array_like, shape (V,)
        Draft law.
    k : int
        Number of drafts.
    order : array_like, shape (V,), int
        A permutation of the tokens; ``H_j = order[:j]``.
    scheme : {"iid", "without_replacement"}
    step : float, optional
        Trapezoid step of the race quadrature in ``y = log t`` (default :func:`default_step`).
    method : {"auto", "exact", "race"}
        ``"race"`` forces the quadrature (k >= 2, without replacement; for
        tests); ``"exact"`` refuses k >= 3 without replacement.

    Returns
    -------
    PrefixMembership
        ``inside``, ``outside``, ``error``, each of shape (V + 1,).

    Examples
    --------
    >>> m = prefix_membership([0.5, 0.3, 0.2], 2, [0, 1, 2], "without_replacement")
    >>> np.round(m.inside, 6).tolist()
    [0.0, 0.0, 0.514286, 1.0]
    >>> m = prefix_membership([0.4, 0.3, 0.2, 0.1], 3, [0, 1, 2, 3])
    >>> np.round(m.inside, 9).tolist(), m.method, bool(m.error.max() < 1e-10)
    ([0.0, 0.0, 0.0, 0.551190476, 1.0], 'race', True)
    """
    draft = check_law(draft, "draft")
    k = check_k(k)
    order = np.asarray(order)
    if order.shape != draft.shape or not np.array_equal(np.sort(order), np.arange(draft.size)):
        raise OtmError(f"order must be a permutation of 0..{draft.size - 1}")
    if scheme not in ("iid", "without_replacement"):
        raise OtmError(f"prefix_membership covers the iid and without_replacement schemes, not {scheme!r}")
    if method not in ("auto", "exact", "race"):
        raise OtmError(f"unknown method {method!r}: choose auto, exact or race")
    qs = draft[order]
    if scheme == "iid" or k == 1:
        if method == "race" and scheme == "iid":
            raise OtmError("the race quadrature is for the without_replacement scheme")
        return _iid_membership(qs, k)
    positive = qs > 0
    qp = qs[positive]
    if qp.size < k:
        raise OtmError(
            f"without_replacement needs at least k={k} tokens with positive draft mass, "
            f"the draft has {qp.size}: lower k or use the iid scheme"
        )
    if method == "exact" and k >= 3:
        raise OtmError(f"no exact finite form for without_replacement with k={k} >= 3: use method='race'")
    if k == 2 and method != "race":
        inside_p, err_p, how = _wo2_inside(qp), np.zeros(qp.size + 1), "exact"
    else:
        inside_p, err_p = _race_inside(qp, k, default_step(k) if step is None else float(step))
        how = "race"
    count = _prefix_sums(positive.astype(np.float64)).astype(np.int64)  # positive tokens in H_j
    inside = inside_p[count]
    return PrefixMembership(inside, 1.0 - inside, err_p[count], how)


# -----------------------------------------------------------------------------
# alpha*
# -----------------------------------------------------------------------------
def _window_optimum(scheme: Scheme, target: np.ndarray, order: np.ndarray, step: float | None):
    """The fast path (:mod:`otm.race_window`); ``(Optimum, None)`` or ``(None, reason)`` when it declines."""
    k = scheme.k
    qs = scheme.draft[order]
    n = int(np.count_nonzero(qs))  # ratio_order puts the zero-draft tokens last
    if n < k:
        raise OtmError(
            f"without_replacement needs at least k={k} tokens with positive draft mass, "
            f"the draft has {n}: lower k or use the iid scheme"
        )
    ts = target[order]
    step_now = default_step(k) if step is None else float(step)
    for attempt in range(3):
        h = step_now
        res = window_inside(qs[:n], ts[:n], k, h)
        if res is None:
            return None, "its race grid would need t above e^700 (a complement mass below ~1e-303)"
        inside, error, info = res
        if info.check > CHECK_TOLERANCE:
            return None, (
                f"its window scan and its direct evaluation of Q differ by {info.check:.1e} at a shared "
                f"prefix (above {CHECK_TOLERANCE:g})"
            )
        err = float(error.max())
        if err <= QUADRATURE_TOLERANCE:
            break
        step_now /= 2
    else:
        _warn_quadrature(err, step_now * 2, stacklevel=5)
    P = _prefix_sums(ts)
    values = P.copy()  # beyond the positive tokens Q = 1
    values[: n + 1] = P[: n + 1] + (1.0 - inside)
    j = int(np.nanargmin(values))
    H = np.zeros(scheme.V, dtype=bool)
    H[order[:j]] = True
    computed = int(np.count_nonzero(~np.isnan(inside)))
    note = (
        f"Q computed at {computed} of {n + 1} prefixes ({len(info.points)} evaluated directly, G = {info.nodes} nodes, "
        f"{len(info.windows)} windows scanned, {info.rounds} rounds); every other prefix has a lower "
        f"bound above an upper bound on alpha* by more than {MARGIN:g} or at least the minimum found "
        f"minus {TIE:g}; window scans vs direct evaluation "
        f"({max(info.checked, 1)} prefixes) {info.check:.1e}"
    )
    opt = Optimum(
        value=float(values[j]),
        scheme=scheme.name,
        k=k,
        H=H,
        method="prefix+race-window",
        error_estimate=err,
        order=order,
        prefix_values=values,
        note=note,
    )
    return opt, None


def _prefix_optimum(scheme: Scheme, target: np.ndarray, step: float | None, method: str = "auto") -> Optimum:
    k = scheme.k
    order = ratio_order(target, scheme.draft)
    note = ""
    if scheme.name == "without_replacement" and k >= 3 and method in ("auto", "window"):
        opt, reason = _window_optimum(scheme, target, order, step)
        if opt is not None:
            return opt
        if method == "window":
            raise OtmError(f"the window method declined this input: {reason}; use method='reference'")
        note = f"the window method declined: {reason}; the reference scan was used"
    step_now = default_step(k) if step is None else float(step)
    for attempt in range(3):
        m = prefix_membership(scheme.draft, k, order, scheme.name, step=step_now)
        err = float(m.error.max())
        if m.method != "race" or err <= QUADRATURE_TOLERANCE:
            break
        step_now /= 2
    else:
        _warn_quadrature(err, step_now * 2, stacklevel=4)
    values = _prefix_sums(target[order]) + m.outside
    j = int(np.argmin(values))
    H = np.zeros(scheme.V, dtype=bool)
    H[order[:j]] = True
    return Optimum(
        value=float(values[j]),
        scheme=scheme.name,
        k=k,
        H=H,
        method="prefix+race" if m.method == "race" else "prefix",
        error_estimate=err,
        order=order,
        prefix_values=values,
        note=note,
    )


def _fixed_plus_one(name: str, k: int, target: np.ndarray, fixed: np.ndarray, last: np.ndarray) -> Optimum:
    """``target(D) + sum_{x not in D} min(target(x), last(x))`` and its cut ``D + {target < last}``."""
    H = np.zeros(target.size, dtype=bool)
    H[fixed] = True
    rest = ~H
    value = float(target[fixed].sum() + np.minimum(target[rest], last[rest]).sum())
    H |= rest & (target < last)
    return Optimum(value=value, scheme=name, k=k, H=H, method="closed_form")


def optimal_acceptance_of(scheme: Scheme, target, *, step: float | None = None, method: str = "auto") -> Optimum:
    r"""The optimum :math:`\alpha^*` of a draft scheme against ``target``, with a minimising set.

    .. math::

        \alpha^* = \min_{H \subseteq \Sigma}\; p(H) + 1 - Q(H)

    evaluated by scheme:

    * ``iid``, ``without_replacement``: prefix scan in the ratio order
      (module docstring); for k >= 3 without replacement the race quadrature,
      by default only at the prefixes that certified bounds cannot exclude
      (:mod:`otm.race_window`, ``method="window"``), else at all V + 1 prefixes
      (``method="reference"``, :math:`O(V k G)` with ``G`` race nodes);
    * ``greedy``: :math:`p(D) + \sum_{x \notin D} \min(p(x), q(x)/(1 - q(D)))`,
      ``D`` the fixed top-(k-1) tokens of :class:`otm.schemes.Greedy`;
    * ``spechub``: :math:`p(a) + \sum_{i \ne a} \min(p(i), q(i)/(1 - q(a)))`,
      ``a`` the hub of :class:`otm.schemes.SpecHub`;
    * ``top``: :math:`p(D)`, ``D`` the fixed drafts of :class:`otm.schemes.Top`;
    * ``table``: :func:`brute_force_optimum` (V <= 20).

    Parameters
    ----------
    scheme : Scheme
        A draft scheme from :mod:`otm.schemes`.
    target : array_like, shape (V,)
        Target law over the scheme's vocabulary.
    step : float, optional
        Trapezoid step of the race quadrature (default :func:`default_step`); halved up to twice while the
        error estimate exceeds :data:`QUADRATURE_TOLERANCE` (then a
        :class:`QuadratureWarning`).
    method : {"auto", "window", "reference"}
        Without replacement, k >= 3 only (elsewhere ignored): ``"window"`` the fast path
        (an :class:`OtmError` if it declines), ``"reference"`` the scan of every prefix,
        ``"auto"`` (default) the fast path, or the reference with the reason in
        ``Optimum.note`` when the fast path declines (a complement mass below ~1e-303).

    Returns
    -------
    Optimum
        ``value`` (:math:`\alpha^*`), ``H`` (bool mask, shape (V,)),
        ``method``, ``error_estimate`` and, for prefix scans, ``order`` and
        ``prefix_values`` (shape (V + 1,)).

    References
    ----------
    .. [1] Z. Hu et al., "Towards Optimal Multi-draft Speculative Decoding", ICLR 2025.

    Examples
    --------
    >>> from otm.schemes import IID, Greedy
    >>> opt = optimal_acceptance_of(IID([0.2, 0.2, 0.6], 2), [0.5, 0.3, 0.2])
    >>> round(opt.value, 6), opt.H.tolist(), opt.method  # H = {2}: 0.2 + 1 - 0.6**2
    (0.84, [False, False, True], 'prefix')
    >>> round(optimal_acceptance_of(Greedy([0.2, 0.2, 0.6], 2), [0.5, 0.3, 0.2]).value, 6)
    1.0
    """
    target = check_target(scheme, target)
    if method not in ("auto", "window", "reference"):
        raise OtmError(f"unknown method {method!r}: choose auto, window or reference")
    if scheme.name in ("iid", "without_replacement"):
        return _prefix_optimum(scheme, target, step, method)
    if isinstance(scheme, Greedy):
        return _fixed_plus_one("greedy", scheme.k, target, scheme.fixed, scheme.last)
    if isinstance(scheme, SpecHub):
        return _fixed_plus_one("spechub", 2, target, np.array([scheme.hub]), scheme.others)
    if isinstance(scheme, Top):  # one fixed set D: the best coupling outputs y in D whenever y ~ target does
        H = np.zeros(scheme.V, dtype=bool)
        H[scheme.fixed] = True
        return Optimum(value=float(target[H].sum()), scheme="top", k=scheme.k, H=H, method="fixed_set")
    if scheme.V > BRUTE_FORCE_MAX_V:
        raise OtmError(
            f"no closed form for the {scheme.name} scheme and V={scheme.V} is above the brute-force "
            f"limit {BRUTE_FORCE_MAX_V}: use otm.lp.solve_lp"
        )
    value, H = brute_force_cut(scheme, target)
    return Optimum(value=value, scheme=scheme.name, k=scheme.k, H=H, method="brute_force")


def optimal_acceptance(target, draft, k: int, scheme: str = "iid") -> float:
    r"""The optimum :math:`\alpha^*` for ``k`` drafts of ``draft`` drawn by ``scheme``.

    .. math::

        \alpha^* = \max_{\pi \in \Pi(P, p)} P(Y \in \mathrm{set}(\bar X))
                 = \min_{H \subseteq \Sigma}\; p(H) + 1 - Q(H)

    Shorthand for ``optimal_acceptance_of(make_scheme(scheme, draft, k), target).value``.

    Parameters
    ----------
    target : array_like, shape (V,)
        Target law.
    draft : array_like, shape (V,)
        Draft law.
    k : int
        Number of drafts.
    scheme : {"iid", "without_replacement", "greedy", "spechub"}

    Returns
    -------
    alpha : float

    Examples
    --------
    >>> round(optimal_acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2, "iid"), 6)
    0.84
    >>> round(optimal_acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2, "without_replacement"), 6)
    1.0
    >>> round(optimal_acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 1), 6)  # sum(min(target, draft))
    0.6
    """
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    return optimal_acceptance_of(make_scheme(scheme, draft, k), target).value
