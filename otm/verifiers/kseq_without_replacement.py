r"""``kseq_without_replacement``: K-SEQ's sequential test over the i.i.d. arrivals embedded in drafts
drawn without replacement, up to the k-th distinct arrival. Exact at any V; acceptance at least
half of :math:`\alpha^*_{wor}` (proved) and at least K-SEQ's for i.i.d. drafts.

For k ordered drafts :math:`S = (s_1..s_k)` drawn from :math:`q` (``draft``) WITHOUT replacement
(successive sampling, scheme ``without_replacement``) and target :math:`p` (``target``).

The arrivals
------------
Let :math:`X_1, X_2, \dots` be i.i.d. :math:`q` and :math:`T` the index of the k-th *distinct*
arrival. The distinct tokens in order of first appearance have exactly the successive-sampling law,
and given them the arrivals are a walk (:mod:`otm.verifiers.optimal_embedded`, whose proof covers the
whole sequence up to :math:`T`): with :math:`A_m = \{s_1..s_m\}` seen, the next arrival repeats
:math:`j \in A_m` w.p. :math:`q_j` or is the next draft :math:`s_{m+1}` w.p. :math:`1 - q(A_m)`.
So :math:`X_1..X_T` can be generated from S and fresh uniforms, and every arrival is a draft.

The rule
--------
With a division factor :math:`\rho \ge 1` let :math:`a_y = \min(1, p_y / (\rho q_y))`. Test the
arrivals in order: accept :math:`X_t` w.p. :math:`a_{X_t}` and stop; stop rejected after testing
:math:`X_T`; then draw from the residual. Let N be the number of arrivals tested. The event
:math:`\{N \ge t\}` depends on :math:`X_{<t}` and their coins only, so

.. math::

    P(\text{accept } y) = \sum_t P(N \ge t)\, q_y a_y = E[N_\rho] \min(q_y, p_y/\rho),

the law of K-SEQ's accepted token with :math:`E[N_\rho]` in place of
:math:`(1 - (1 - \beta)^k)/\beta`. The residual
:math:`r = p - E[N_\rho] \min(q, p/\rho)` is non-negative iff :math:`E[N_\rho] \le \rho` (on
:math:`H_0 = \{p < \rho q\}` it is :math:`p(1 - E[N_\rho]/\rho)`, elsewhere :math:`p - q E[N_\rho]
\ge q(\rho - E[N_\rho])`); then the output law is exactly :math:`p`. ``rule`` takes a root
:math:`\rho^*` of :math:`h(\rho) = E[N_\rho] - \rho` (it exists: :math:`h(\rho^*_{iid}) \ge 0` and
:math:`h(E[T]) \le 0`), approached from above: the returned :math:`\rho` has :math:`E[N_\rho]` plus its
quadrature error at most :math:`\rho` (valid; :attr:`Trials.upper`) and :math:`\rho - E[N_\rho] \le 10^{-10} \rho`
(:data:`ROOT_TOL`), so every statement "at a root" below holds to a relative 1e-10.

Acceptance
----------
At a root, :math:`P(\text{accept}) = \sum_y \min(p_y, \rho^* q_y)`, and

1. **at least** :math:`\alpha^*_{wor}/2`. *Proof.* The optimum is
   :math:`\alpha^*_{wor} = \min_H [p(H) + P(S \not\subseteq H)]` (theory.md, the dual). Take
   :math:`H = H_0`. If S meets :math:`H_0^c` some arrival before :math:`T` has :math:`a = 1`, so the
   test stops accepting at the latest there: :math:`P(S \not\subseteq H_0) \le P(\text{accept})`.
   And :math:`P(\text{accept}) = p(H_0) + \rho^* q(H_0^c) \ge p(H_0)`. So
   :math:`\alpha^*_{wor} \le p(H_0) + P(\text{accept}) \le 2 P(\text{accept})`. ∎
2. **at least K-SEQ's** for k i.i.d. drafts. *Proof.* Coupled on the same arrivals and coins, the
   i.i.d. test stops at the k-th arrival and this one at the k-th distinct one (:math:`T \ge k`), so
   :math:`E[N_\rho] \ge E[N^{iid}_\rho]` for every :math:`\rho`; below :math:`\rho^*_{iid}`
   K-SEQ's :math:`g > 0`, i.e. :math:`E[N^{iid}_\rho] > \rho`, so no root lies there, and
   :math:`\sum \min(p, \rho q)` is non-decreasing in :math:`\rho`. ∎ Hence also at least
   :math:`(1 - (1 - 1/k)^k)\, \alpha^*_{iid}`.
3. At a root the residual vanishes on :math:`H_0`, and a rejection means :math:`S \subseteq H_0`:
   membership acceptance equals loop acceptance (up to the rounding of :math:`\rho^*`).

No better constant than 1/2 is proved. Measured (``analysis/research/kseq_wor_search.py``): the ratio to
:math:`\alpha^*_{wor}` and the comparison with RRSw are in docs/theory.md section 3.

:math:`E[N_\rho]` at any V: the exponential race
------------------------------------------------
Let arrivals come at the points of a rate-1 Poisson process: token y's accepted arrivals form a
Poisson process of rate :math:`\min(q_y, p_y/\rho)` (total :math:`\beta`) and its rejected ones an
independent one of rate :math:`c_y = (q_y - p_y/\rho)_+`. The test is still running at time s iff
no accepted arrival came and fewer than k tokens had rejected arrivals, so (optional stopping,
rate 1)

.. math::

    E[N_\rho] = \int_0^\infty e^{-\beta s}\, P\big(N_c(s) \le k - 1\big)\, ds, \qquad
    N_c(s) = \#\{y : \text{Poisson}(c_y s) > 0\},

whose count law is the race's (:func:`otm.race_window.states_at`: moment series for the small
rates, exact products for the large ones, all nodes at once). The integral is a trapezoid rule in
:math:`\log s` (:func:`otm.race_quadrature.trapezoid_from_zero`) with the closed-form step of
:func:`otm.race_quadrature.default_step` (halved while the
step-2h check differs by more than 1e-11 relative); the part below :math:`s_0 = 10^{-8}` (:data:`S0`) is
:math:`(1 - e^{-\beta s_0})/\beta` within :math:`s_0^{k+1}/(k+1)!`, the part above
:math:`s_1 = (42 + \log(1/\lambda))/\lambda` is below :math:`e^{-42}` (:math:`\lambda` = :math:`\beta`
plus the rejected rates outside the k - 1 largest bounds the integrand's decay). With fewer than k
tokens of positive :math:`c`, :math:`E[N_\rho] = 1/\beta` exactly.

Cost
----
Set-up: K-SEQ's :math:`\rho^*_{iid}`, then a root search in :math:`\log \rho` (from :math:`\rho^*_{iid}`,
the step :math:`\rho \leftarrow E[N_\rho]` and secant steps, at least doubling, until one lands past the
root, then Illinois in the bracket: 5-13 evaluations at V = 49152, 9.5 on average at small V, about 25 for a
root near 1e299), each
evaluation one race pass, O(V) plus O(k G) per node. Per verification O(k^2) with at most 2k
uniforms, and one residual draw (inverse CDF) after a rejection. :func:`law` given S is O(k^2 + V).

>>> import numpy as np
>>> p, q = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.7, 0.1, 0.1, 0.1])
>>> rl = rule(p, q, 2)
>>> round(rl.acceptance, 6), round(float(np.minimum(p, rl.rho * q).sum()), 6)
(0.904082, 0.904082)
>>> round(float(law(p, q, [0, 1]).sum()), 12)
1.0

Pieces: its scheme ``otm.schemes.WithoutReplacement``; the walk and the embedding in
:mod:`otm.verifiers.optimal_embedded`; the race in :mod:`otm.race_window`; alpha* in :mod:`otm.optimum`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..laws import OtmError, check_k, check_law
from ..race_quadrature import default_step, nodes, trapezoid_from_zero
from . import kseq
from .base import Outcome, check_inputs, draw_and_name, inverse_cdf_draw, require_scheme, residual_law
from .optimal import OptimalBoundVerifier
from .embedding import mass_outside, require_distinct, unseen_mass

S0 = 1e-8
"""Lower end of the quadrature; the part below it is taken in closed form (error <= S0^(k+1)/(k+1)!)."""

TAIL = 42.0
"""lambda * s1 - log(1/lambda): the part of the integral above s1 is below e^-42."""

REL_TOL = 1e-11
"""The step is halved while the step-2h check differs from the step-h sum by more than this, relatively."""

ROOT_TOL = 1e-10
"""The root search stops at a valid rho (E[N_rho] plus its quadrature error at most rho) with
rho - E[N_rho] at most this, relatively: the acceptance is then within 1e-10 (relative) of its value
at the root, and the ratio bound 1/2 holds up to that."""


@dataclass(frozen=True)
class Trials:
    """:math:`E[N_\\rho]` by the race quadrature, with the step-2h check difference and the grid size.

    ``upper`` is the bound the validity test reads: ``value + error``, or :math:`\\rho` itself where no
    token has :math:`p > \\rho q` (:func:`bounded`)."""

    value: float
    error: float
    nodes: int
    upper: float = math.inf

    def __post_init__(self):
        if self.upper == math.inf:
            object.__setattr__(self, "upper", self.value + self.error)


def _rates(target: np.ndarray, draft: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """``(accepted, rejected)`` arrival rates: ``min(q, p/rho)`` and ``(q - p/rho)_+``."""
    acc = np.minimum(draft, target / rho)
    return acc, draft - acc


def expected_trials(target, draft, k: int, rho: float, *, step: float | None = None) -> Trials:
    """:math:`E[N_\\rho]`, the expected number of arrivals the rule tests (module docstring)."""
    from ..race_window import states_at

    p = np.asarray(target, dtype=np.float64)
    q = np.asarray(draft, dtype=np.float64)
    acc, c = _rates(p, q, float(rho))
    beta = float(acc.sum())
    cp = c[c > 0]
    if cp.size < k:  # fewer than k tokens can be rejected: the test ends at its first acceptance
        return Trials(1.0 / beta, 0.0, 0)
    n_low = cp.size - (k - 1)  # the rejected rates outside the k - 1 largest
    lam = beta + float((np.partition(cp, n_low)[:n_low] if k > 1 else cp).sum())
    s1 = (TAIL + math.log(1.0 / lam)) / lam
    h = default_step(k) if step is None else float(step)
    while True:
        y = nodes(math.log(S0), math.log(s1), h)
        pmf, _ = states_at(cp, np.array([cp.size]), y, k)
        s = np.exp(y)
        f = s * np.exp(-beta * s) * pmf[0].sum(axis=0)
        # trapezoid sums over the whole line: left of y0 the integrand is e^y (1 - beta e^y + ...)
        # P(N < k) = e^y up to a relative beta s0 + s0^k, so its nodes there sum to f(y0) * left_tail(h)
        value, err = trapezoid_from_zero(f, h)
        if err <= REL_TOL * value or h < 1e-3:
            return Trials(value, err, y.size)
        h /= 2


@dataclass(frozen=True)
class TrialsRule:
    """The rule for one position: ``rho``, ``trials`` = E[N_rho], the accepted-arrival rates
    ``min(q, p/rho)`` and the residual (unnormalised)."""

    target: np.ndarray = field(repr=False)
    draft: np.ndarray = field(repr=False)
    k: int
    rho: float
    trials: Trials
    rho_iid: float  # K-SEQ's rho* for k iid drafts: the root search starts there
    evaluations: int  # E[N_rho] evaluations the root search made

    @property
    def acc_rate(self) -> np.ndarray:
        return _rates(self.target, self.draft, self.rho)[0]

    @cached_property
    def beta(self) -> float:
        return float(self.acc_rate.sum())

    @property
    def acceptance(self) -> float:
        """P(some arrival is accepted) = beta E[N_rho] (exact up to the quadrature error)."""
        return float(self.beta * self.trials.value)

    def residual(self) -> np.ndarray:
        """``p - E[N] min(q, p/rho)``: ``p (1 - E[N]/rho)`` on ``p < rho q``, ``p - q E[N]`` elsewhere
        (computed once per rule: every rejection and every exact law given S reads it)."""
        return self._residual

    @cached_property
    def _residual(self) -> np.ndarray:
        p, q, t = self.target, self.draft, self.trials.value
        out = np.where(p < self.rho * q, p * (1.0 - t / self.rho), p - q * t)
        out.flags.writeable = False
        return out


def bounded(p: np.ndarray, q: np.ndarray, t: Trials, rho: float) -> Trials:
    """``t`` with the exact bound :math:`E[N_\\rho] \\le \\rho` applied where it holds.

    Where no token has :math:`p > \\rho q`, :math:`\\beta = \\sum_y p_y/\\rho = 1/\\rho`, and
    :math:`E[N_\\rho] \\le 1/\\beta` (the test stops at the latest at the first accepted arrival): every such
    :math:`\\rho` is valid and its acceptance :math:`\\sum \\min(p, \\rho q)` is 1. There the deficit
    :math:`\\rho - E[N_\\rho]` can lie far below the quadrature's error (near-identical laws: it is
    :math:`O((\\rho - 1)^2)` at k = 2), which hid the valid region from the root search and sent it up to
    :math:`\\rho - 1 \\approx 10^{-4}`, off the root. Capping the estimate at the bound moves it towards the
    truth, never away from it."""
    if not bool(np.all(p <= rho * q)):
        return t
    return Trials(min(t.value, rho), t.error, t.nodes, upper=min(t.upper, rho))


def _build(p: np.ndarray, q: np.ndarray, k: int) -> TrialsRule:
    lo = kseq.rho_star(p, q, k)
    memo: dict[float, Trials] = {}

    def trials(rho: float) -> Trials:
        if rho not in memo:
            memo[rho] = bounded(p, q, expected_trials(p, q, k, rho), rho)
        return memo[rho]

    if float(np.minimum(p, q).sum()) == 0.0:  # disjoint laws: nothing is accepted whatever rho, r = p;
        t = trials(lo)  # E[N] = E[T], and rho = E[T] is a root
        return TrialsRule(p, q, k, max(lo, t.upper), t, lo, 1)

    def g(x: float) -> float:  # log((E[N_rho] + its error) / rho) at rho = e^x: > 0 not valid, <= 0 valid
        rho = math.exp(x)
        t = trials(rho)
        out = math.log((t.value + t.error) / rho)  # its size: how far from a root
        return min(out, 0.0) if t.upper <= rho else max(out, 1e-300)  # its sign: the validity test itself

    # E[N_rho] increases with rho, so rho <- E[N_rho] climbs from rho*_iid towards the smallest root from
    # below; secant steps through those points (in log rho, pushed 10% further, at least doubling the
    # step) overshoot it, which gives the valid end of a bracket
    a = math.log(lo)
    fa = g(a)
    if fa <= 0.0:
        return TrialsRule(p, q, k, lo, trials(lo), lo, len(memo))
    b = a + fa
    fb = g(b)
    while fb > 0.0:
        if b >= 700.0:  # pragma: no cover - E[T] < e^700 for any law with >= k drafted tokens above 1e-300
            raise OtmError("kseq_without_replacement: no division factor below e^700 (draft masses near "
                           "1e-300?): drop the tiny draft masses")
        step = 2.0 * (b - a)  # at least double the step; the secant's, pushed 10% further, up to 8 times it
        if fb < fa:
            step = min(max(step, 1.1 * fb * (b - a) / (fa - fb)), 8.0 * (b - a) + 1.0)
        a, fa, b = b, fb, min(b + step, 700.0)
        fb = g(b)
    # Illinois (regula falsi, halving the stale end) on [a invalid, b valid]; stop when b is within
    # ROOT_TOL of a root (relative) or the bracket is 1e-13 wide (relative)
    # (fa, fb are the secant's weights, halved on a stale end; gb is g(b) itself, which the stop reads)
    side, gb = 0, fb
    for _ in range(200):
        if -gb <= ROOT_TOL or b - a <= 1e-13:
            break
        x = b - fb * (b - a) / (fb - fa)
        if not a < x < b:
            x = 0.5 * (a + b)
        fx = g(x)
        if fx > 0.0:
            a, fa = x, fx
            if side == 1:
                fb *= 0.5
            side = 1
        else:
            b, fb, gb = x, fx, fx
            if side == -1:
                fa *= 0.5
            side = -1
    rho = math.exp(b)
    return TrialsRule(p, q, k, rho, trials(rho), lo, len(memo))


def rule(target, draft, k: int) -> TrialsRule:
    """Build the rule for one position (``k`` drafts without replacement from ``draft``)."""
    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    k = check_k(k)
    if int((q > 0).sum()) < k:
        raise OtmError(f"without_replacement needs at least k={k} tokens with positive draft mass, "
                       f"the draft has {int((q > 0).sum())}: lower k")
    return _build(p, q, k)


def _given(rl: TrialsRule, d: np.ndarray, rest: float) -> tuple[np.ndarray, float]:
    """``(acc, reject)``: exact P(accept draft s_j | S) for j = 1..k, and P(all rejected | S)."""
    q_s = rl.draft[d]
    b = _rates(rl.target[d], q_s, rl.rho)[0]  # min(q, p/rho) at the drafts
    avail = unseen_mass(q_s, rest)  # avail[m] = 1 - q(A_m), m = 0..k-1
    k = d.size
    acc = np.zeros(k)
    surv = 1.0
    for m in range(k):
        a = b[m] / q_s[m]  # accept the new draft s_{m+1}
        acc[m] += surv * a
        surv *= 1.0 - a
        if m == k - 1:
            break
        tot = float(b[: m + 1].sum()) + avail[m + 1]
        acc[: m + 1] += surv * b[: m + 1] / tot  # a repeat accepted before the next new draft
        surv *= avail[m + 1] / tot
    return acc, surv


def _law(rl: TrialsRule, d: np.ndarray, rest: float) -> np.ndarray:
    acc, reject = _given(rl, d, rest)
    out = np.zeros(rl.target.size)
    np.add.at(out, d, acc)
    if reject > 0:
        out = out + reject * residual_law(rl.residual(), rl.target)
    return out


def _sample(rl: TrialsRule, d: np.ndarray, rest: float, rng: np.random.Generator) -> Outcome:
    q_s = rl.draft[d]
    b = _rates(rl.target[d], q_s, rl.rho)[0]
    avail = unseen_mass(q_s, rest)
    k = d.size
    for m in range(k):
        if rng.random() * q_s[m] < b[m]:  # u q < min(q, p/rho): never true where p = 0
            return Outcome(int(d[m]), m)
        if m == k - 1:
            break
        w = np.append(b[: m + 1], avail[m + 1])
        j = int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right"))
        if j <= m:
            return Outcome(int(d[j]), j)
    return draw_and_name(d, rng.random(), inverse_cdf_draw(rl.residual), rl.target)


def _inputs(target, draft, drafts):
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "kseq_without_replacement")
    return target, draft, d


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the k = len(drafts) ordered distinct drafts."""
    target, draft, d = _inputs(target, draft, drafts)
    return _law(_build(target, draft, d.size), d, mass_outside(draft, d))


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    """One verification of the ordered distinct drafts."""
    target, draft, d = _inputs(target, draft, drafts)
    return _sample(_build(target, draft, d.size), d, mass_outside(draft, d), rng)


def acceptance(target, draft, k: int) -> float:
    """Loop acceptance :math:`\\beta E[N_{\\rho}]` at the rule's :math:`\\rho` (= the membership
    acceptance up to the rounding of the root)."""
    return rule(target, draft, k).acceptance


def conditional_acceptance(target, draft, drafts) -> tuple[float, float]:
    """``(loop, membership)`` acceptance given the ordered drafts, exact."""
    target, draft, d = _inputs(target, draft, drafts)
    rl = _build(target, draft, d.size)
    acc, reject = _given(rl, d, mass_outside(draft, d))
    r = rl.residual()
    tot = float(r.sum())
    loop = float(acc.sum())
    return loop, loop + (reject * float(r[d].sum()) / tot if tot > 0 else 0.0)


@dataclass(frozen=True)
class KseqWorBoundVerifier(OptimalBoundVerifier):
    """:class:`OptimalBoundVerifier` with ``acceptance`` the loop acceptance, ``alpha_star`` the optimum for
    drafts without replacement (so ``gap`` is the certified shortfall) and the rule."""

    rule: TrialsRule | None = None


def bind(target, scheme) -> KseqWorBoundVerifier:
    """Build the rule once for ``target`` and a ``without_replacement`` scheme; refuse others."""
    from ..optimum import optimal_acceptance_of
    from ..schemes import check_target

    require_scheme(scheme, "without_replacement", "kseq_without_replacement",
                   "use kseq (iid), or lp_optimal (small V)")
    target = check_target(scheme, target)
    draft, k = scheme.draft, scheme.k
    rl = _build(target, draft, k)

    def _check(drafts):
        t, _, d = check_inputs(target, draft, drafts, k)
        require_distinct(d, "kseq_without_replacement")
        return d

    def _law_b(drafts):
        d = _check(drafts)
        return _law(rl, d, mass_outside(draft, d))

    def _sample_b(drafts, rng):
        d = _check(drafts)
        return _sample(rl, d, mass_outside(draft, d), rng)

    alpha = optimal_acceptance_of(scheme, target).value
    return KseqWorBoundVerifier(_law_b, _sample_b, acceptance=rl.acceptance, alpha_star=alpha, plan=None, rule=rl)


__all__ = ["Trials", "TrialsRule", "KseqWorBoundVerifier", "expected_trials", "rule", "law", "sample", "acceptance",
           "conditional_acceptance", "bind"]
