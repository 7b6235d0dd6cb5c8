r"""``optimal_without_replacement``: layered Luce selection of one draft, then single-draft SD.

For k drafts :math:`x_1..x_k` drawn from :math:`q` (``draft``) WITHOUT replacement (successive
sampling, scheme ``without_replacement``) and target :math:`p` (``target``). Canonical form
(Khisti et al., ICLR 2025; :mod:`otm.verifiers.optimal`): (1) select ONE drafted token with an
exactly known law :math:`x`; (2) single-draft speculative sampling from :math:`x` to :math:`p`
(accept :math:`Y'` w.p. :math:`\min(1, p(Y')/x(Y'))`, else draw from
:math:`\mathrm{norm}((p - x)_+)`). Step (2) outputs exactly :math:`p` for ANY :math:`x`; the
acceptance is :math:`\sum_y \min(x(y), p(y))`.

The target selection law :math:`x^\star`
----------------------------------------
The selection laws of all rules form the base polytope of the coverage function
:math:`f(A) = P(\text{draft set meets } A)`, a polymatroid rank function. Sort the tokens by
:math:`r = p/q` descending (prefixes :math:`D_j`), let :math:`v_j = f(D_j) - f(D_{j-1})` (the law
of "select the drafted token of highest ratio") and :math:`\lambda` the isotonic (increasing,
weights :math:`p`) regression of :math:`v_j / p_j`. Then :math:`x^\star = \lambda p` is the
lexicographically optimal base of :math:`f` w.r.t. :math:`p` and
:math:`\sum \min(x^\star, p) = \alpha^* = \min_H p(H) + 1 - Q(H)`.

*Proof.* Fujishige (1980): the lexicographically optimal base has :math:`x^\star = \lambda_i p`
on the layers of the finest chain of sets minimising :math:`f(A) - \lambda p(A)` (each
contraction in turn), and it maximises :math:`\sum \min(x, p)` (concave, separable) over the
base polytope, whose maximum is the polymatroid rank of the box :math:`p`, i.e. :math:`\alpha^*`.
With :math:`H` the complement of :math:`A`, :math:`f(A) - \lambda p(A) = \lambda p(H) + 1 - Q(H)
- \lambda`, the min-cut form with weights :math:`\lambda p`; the exchange inequality (E) of
:mod:`otm.optimum` (proved there for successive sampling, for any weights and inside any
contraction) makes every minimiser a prefix of the ratio order up to ties. So the layers are
consecutive in the ratio order and :math:`\lambda` is the slope sequence of the greatest convex
minorant of the points :math:`(p(D_j), f(D_j))`: the isotonic regression above. [Measured too:
``analysis/research/wor_selection_search.py``, 4977 random cases at V <= 8, k = 2..4: max difference to a
brute-force lexicographically optimal base 7.9e-14; :math:`\sum\min(x^\star, p) - \alpha^*` below
2e-13.]

The rule: layered Luce
----------------------
Split the isotonic blocks further where a ratio prefix of a block is tight
(:math:`\sum v = \lambda \sum p` on it): the *layers*. Give every token a layer (ratio order;
tokens of zero target mass last) and a log-weight :math:`\theta`. Select among the drafted tokens
of the first occupied layer :math:`L` by a Luce (softmax) choice:
:math:`P(y \mid \text{drafts}) = e^{\theta_y} / \sum_{z \in \text{drafts} \cap L} e^{\theta_z}`.
Its selection law, for :math:`y \in L` with earlier layers :math:`D`, is

.. math::

    x_y(\theta) = E\Big[1\{y \in S,\ S \cap D = \emptyset\}\,
        \frac{e^{\theta_y}}{\sum_{z \in S \cap L} e^{\theta_z}}\Big]
      = \frac{\partial \Phi_L}{\partial \theta_y}, \qquad
    \Phi_L(\theta) = E\Big[1\{S \cap D = \emptyset\} \log \sum_{z \in S \cap L} e^{\theta_z}\Big],

S the draft set. :func:`build` computes it exactly by summing over the enumerated draft sets
(:meth:`otm.schemes.Scheme.rows`) and fits :math:`\theta` per layer by damped Newton on the
convex problem :math:`\min_\theta \Phi_L(\theta) - \langle x^\star, \theta\rangle`.

*Existence (proved).* :math:`\Phi_L` is convex and smooth, invariant along :math:`\mathbf 1`
up to the constant :math:`f_D(L)`, and its recession function is
:math:`d \mapsto E[1\{S \cap D = \emptyset\} \max_{z \in S \cap L} d_z] = \max_{x \in B} \langle x,
d\rangle` (the greedy algorithm), :math:`B` the base polytope of the minor
:math:`f_D(A) = f(D \cup A) - f(D)` on :math:`L`. On a layer no proper subset is tight for
:math:`x^\star` (ties in ratio aside), so :math:`x^\star|_L` lies in the relative interior of
:math:`B`, :math:`\Phi_L - \langle x^\star, \cdot\rangle` is coercive modulo :math:`\mathbf 1` and
has a minimiser, at which :math:`\nabla \Phi_L = x^\star|_L`. So layered Luce reaches
:math:`x^\star`, hence :math:`\alpha^*`, exactly. (For iid drafts this is the softmax form of
Thomas & Pal's Global Resolution.)

*Exactness of the law (proved).* The law the SD step uses is :math:`x(\theta)` recomputed from
the fitted :math:`\theta` by the same enumeration, so the output law is exactly the target
whatever the fit reached; the fit only decides the acceptance, and ``bind(...).gap`` reports
:math:`\alpha^* -` (the rule's acceptance), with :math:`\alpha^*` from
:func:`otm.optimum.optimal_acceptance_of` (computed, not estimated).

What is proved, what is measured, what is missing
-------------------------------------------------
* Proved: the output law is the target for every input; a layered Luce rule with acceptance
  :math:`\alpha^*` exists for every (p, q, k) (ties in ratio inside a layer aside, where the
  weights may have to diverge; the fit then stops with a reported positive gap).
* Measured: the Newton fit reaches :math:`\alpha^*` to 2e-13 on all 4977 brute-force cases
  (V <= 8, k = 2..4), under 339 Nelder-Mead attacks on the laws (largest gap 1.3e-13), on laws
  with exact ratio ties (4.6e-14) and on the tests' hypothesis bank (gap < 1e-9 asserted).
* Missing: the law :math:`x(\theta)` is computed by enumerating the
  :math:`\binom{V}{k}` draft sets, so :func:`build` refuses more than :data:`MAX_SETS` sets (V of
  a few dozen at k = 4). :func:`selection_target` (:math:`x^\star` and its layers) works at any V
  (ratio-prefix Q from :func:`otm.optimum.prefix_membership`; at V = 49152, peaked laws, 2-core
  machine at load average 3.4: 0.01-0.03 s for k = 2, 0.4-0.8 s for k = 4, 8, the race quadrature
  over every ratio prefix; :math:`\sum\min(x^\star, p) = \alpha^*` to 6e-14). There the layers are large (the largest held 1,712-49,151 tokens, 0.71-1.0 of the target
  mass, on nine peaked laws), so a real-vocabulary law needs
  :math:`E[1\{y \in S\} \prod_{z \in S \setminus y} h_z]` for every y (a leave-one-out product
  of the race's generating functions, integrated over the Luce key) -- not done. The cheap rules
  with exact laws at any V lose up to all of :math:`\alpha^*` on adversarial small laws (ratio
  priority, layered earliest draw, two-order mixtures: worst acceptance/alpha* below 1e-4).
  Beside it: :mod:`otm.verifiers.optimal_embedded` is exact at any V with acceptance at least
  :math:`\alpha^*_{iid}` (close to :math:`\alpha^*` except on sharp draft laws), and
  ``analysis/research/wor_two_pass.py`` computes a two-pass layered rule's law by the race quadrature at
  V = 49152 (gap 3e-13 to 6e-5, but minutes per position); :mod:`otm.verifiers.kseq_without_replacement`
  is exact at any V with acceptance at least :math:`\alpha^*/2` (proved) and K-SEQ's: ``docs/theory.md`` section 3.

>>> round(acceptance([0.6, 0.3, 0.1], [0.1, 0.2, 0.7], 2), 6)  # alpha* without replacement (RRSw: 0.7)
0.758333
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression
from scipy.special import logsumexp, softmax

from ..laws import OtmError, check_k, check_law
from .embedding import require_distinct
from .base import Outcome, check_inputs, inverse_cdf_draw, require_scheme, residual_law, serve_selected
from .optimal import OptimalBoundVerifier  # the same bound: the rule's acceptance, alpha* and their gap

MAX_SETS = 200_000
"""Largest number of draft sets :func:`build` enumerates to compute the Luce law exactly."""

NEWTON_STEPS = 100
"""Newton iterations per layer (each with a backtracking line search on the convex objective)."""

GRADIENT_TOL = 1e-15
"""The fit of a layer stops when its law is within this of x* at every token."""

TIGHT = 1e-13
"""A ratio prefix of an isotonic block is split off as its own layer when its slack is below this."""


@dataclass(frozen=True)
class Target:
    """The lexicographically optimal base ``x_star`` of f w.r.t. the target, and its layers."""

    x_star: np.ndarray  # [V]
    layer: np.ndarray  # [V] int, 0 = highest priority; consecutive in the ratio order
    order: np.ndarray  # [V] tokens by ratio descending (zero-target tokens last)
    vertex: np.ndarray  # [V] law of the ratio priority (select the drafted token of highest ratio)


def _descending(target, draft):
    from ..optimum import ratio_order

    asc = ratio_order(target, draft)
    desc = asc[::-1]
    return np.concatenate([desc[target[desc] > 0], desc[target[desc] <= 0]])


def _layers(order, target, vertex):
    """Isotonic regression of the vertex slopes along ``order``; blocks split at tight prefixes."""
    V = order.size
    pos = order[target[order] > 0]
    lam = np.zeros(V)
    layer = np.zeros(V, dtype=np.int64)
    if pos.size == 0:
        return lam, layer
    pp = target[pos]
    iso = isotonic_regression(vertex[pos] / pp, weights=pp, increasing=True)
    lam[pos] = iso.x
    bounds = np.asarray(iso.blocks)
    mark = np.zeros(pos.size, dtype=np.int64)
    mark[bounds[1:-1]] = 1  # a new layer starts at every block but the first ...
    for a, b in zip(bounds[:-1], bounds[1:]):  # ... and at every tight ratio prefix inside a block
        if b - a < 2:
            continue
        cv = np.cumsum(vertex[pos[a:b]])
        cp = np.cumsum(pp[a:b]) * iso.x[a]
        mark[a + 1 + np.flatnonzero(np.abs(cv - cp)[:-1] <= TIGHT * max(1.0, cv[-1]))] = 1
    lay = np.cumsum(mark)
    layer[pos] = lay
    layer[order[target[order] <= 0]] = lay[-1] + 1
    return lam, layer


def selection_target(target, draft, k: int) -> Target:
    """:math:`x^\\star` and its layers at any V (Q on the ratio prefixes by ``prefix_membership``).

    For k >= 3 the prefix Q comes from the race quadrature (errors ~1e-13); the vertex law is
    their differences, so :math:`x^\\star` carries that error (it is a target, not a law used).
    """
    from ..optimum import prefix_membership

    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    k = check_k(k)
    order = _descending(target, draft)
    m = prefix_membership(draft, k, order[::-1], "without_replacement")
    inside = m.inside  # Q(H_j) for ascending prefixes; D_j (descending) = complement of H_{V-j}
    V = target.size
    vertex = np.empty(V)
    i = np.arange(V)
    vertex[order] = np.maximum(inside[V - i] - inside[V - i - 1], 0.0)  # f(D_j) - f(D_{j-1})
    lam, layer = _layers(order, target, vertex)
    return Target(_x_star(lam, target, vertex), layer, order, vertex)


def _x_star(lam, target, vertex):
    """lambda p on tokens of positive target; the ratio-priority vertex on the rest (they come last)."""
    return np.where(target > 0, lam * target, vertex)


@dataclass(frozen=True)
class LucePlan:
    """One position's rule: layers, Luce log-weights, the exact selection law and its acceptance."""

    x: np.ndarray  # [V] exact selection law of the rule (from theta)
    x_star: np.ndarray  # [V] lexicographically optimal base (what the fit aims at)
    layer: np.ndarray  # [V] int layer (0 = highest priority)
    theta: np.ndarray  # [V] Luce log-weight within the layer
    acceptance: float  # sum min(x, target)
    alpha_sets: float  # sum min(x_star, target) with x_star from the exact set law (= alpha*)
    residual: np.ndarray  # [V] (target - x)_+, unnormalised


def _sets(draft, k):
    from ..schemes import WithoutReplacement

    scheme = WithoutReplacement(draft, k)
    n = scheme.n_sets()
    if n > MAX_SETS:
        raise OtmError(
            f"optimal_without_replacement computes its Luce law by enumerating the {n:,} draft sets "
            f"(V={draft.size}, k={k}), above MAX_SETS={MAX_SETS:,}: no real-vocabulary law yet; "
            "selection_target gives x* at any V; kseq_without_replacement, optimal_embedded and rrs_without_replacement "
            "are the large-V verifiers"
        )
    rows = scheme.rows(fold=True)
    return rows.tokens.reshape(-1, k), rows.mass


def _luce(sets, mass, first, inl, theta, V, which, hess):
    rows = first == which
    T, P, m = sets[rows], mass[rows], inl[rows]
    z = np.where(m, theta[T], -np.inf)
    s = softmax(z, axis=1)  # [n, k] choice probabilities
    x = np.bincount(T.ravel(), weights=(P[:, None] * s).ravel(), minlength=V)
    phi = float((P * logsumexp(z, axis=1)).sum())
    if not hess:
        return x, phi, None
    H = np.zeros((V, V))
    kk = T.shape[1]
    np.add.at(H, (T.ravel(), T.ravel()), (P[:, None] * s).ravel())
    for a in range(kk):
        for b in range(kk):
            np.add.at(H, (T[:, a], T[:, b]), -P * s[:, a] * s[:, b])
    return x, phi, H


def build(target, draft, k: int) -> LucePlan:
    """The layered Luce rule for one position (exact law by enumeration of the draft sets)."""
    target = check_law(target, "target")
    draft = check_law(draft, "draft", size=target.size)
    k = check_k(k)
    V = target.size
    sets, mass = _sets(draft, k)
    order = _descending(target, draft)
    rank = np.empty(V, dtype=np.int64)
    rank[order] = np.arange(V)
    # exact vertex law: P(the drafted token of highest ratio is y), summed over the sets
    top = np.take_along_axis(sets, np.argmin(rank[sets], axis=1)[:, None], 1)[:, 0]
    vertex = np.bincount(top, weights=mass, minlength=V)
    lam, layer = _layers(order, target, vertex)
    x_star = _x_star(lam, target, vertex)
    lay = layer[sets]
    first = lay.min(axis=1)
    inl = lay == first[:, None]
    theta = np.zeros(V)
    x = np.zeros(V)
    for L in np.unique(layer):
        toks = np.flatnonzero((layer == L) & (draft > 0))
        if toks.size == 0:
            continue
        xl, _, _ = _luce(sets, mass, first, inl, theta, V, L, False)
        if toks.size >= 2 and target[toks].sum() > 0:
            tgt = x_star[toks]
            free = toks[1:]  # theta of the first token stays 0 (the law is shift invariant)
            for _ in range(NEWTON_STEPS):
                xl, phi, H = _luce(sets, mass, first, inl, theta, V, L, True)
                g = xl[free] - tgt[1:]
                gmax = float(np.abs(g).max())
                if gmax <= GRADIENT_TOL:
                    break
                step = -np.linalg.lstsq(H[np.ix_(free, free)], g, rcond=None)[0]
                obj = phi - float(theta[toks] @ tgt)
                t = 1.0
                for _ in range(40):  # backtracking: Armijo on the convex objective, or a smaller gradient
                    th2 = theta.copy()
                    th2[free] += t * step
                    x2, phi2, _ = _luce(sets, mass, first, inl, th2, V, L, False)
                    if (phi2 - float(th2[toks] @ tgt) <= obj + 1e-4 * t * float(g @ step)
                            or float(np.abs(x2[free] - tgt[1:]).max()) < 0.5 * gmax):
                        break
                    t /= 2
                else:
                    break  # no progress: converged to rounding
                theta = th2
            xl, _, _ = _luce(sets, mass, first, inl, theta, V, L, False)
        x[toks] = xl[toks]
    acc = float(np.minimum(x, target).sum())
    return LucePlan(x, x_star, layer, theta, acc, float(np.minimum(x_star, target).sum()), np.maximum(target - x, 0.0))



def selection_law(plan: LucePlan, drafts) -> np.ndarray:
    """Exact P(selected = y | drafts): Luce among the drafts of the first occupied layer."""
    d = np.asarray(drafts, dtype=np.int64).reshape(-1)
    lay = plan.layer[d]
    cand = d[lay == lay.min()]
    out = np.zeros(plan.x.size)
    out[cand] = softmax(plan.theta[cand])
    return out


def _law(plan: LucePlan, target, d) -> np.ndarray:
    sel = selection_law(plan, d)
    hit = sel > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(hit, np.minimum(1.0, target / np.where(hit, plan.x, 1.0)), 0.0)
    out = sel * acc
    reject = float((sel * (1.0 - acc)).sum())
    if reject > 0:
        out = out + reject * residual_law(plan.residual, target)
    return out


def _sample(plan: LucePlan, target, d, rng: np.random.Generator) -> Outcome:
    lay = plan.layer[d]
    idx = np.flatnonzero(lay == lay.min())
    w = np.exp(plan.theta[d[idx]] - plan.theta[d[idx]].max())
    c = np.cumsum(w)
    i = int(idx[min(int(np.searchsorted(c, rng.random() * c[-1], side="right")), idx.size - 1)])
    return serve_selected(rng, d, i, target[d[i]], plan.x[d[i]], inverse_cdf_draw(lambda: plan.residual), target)


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the k = len(drafts) distinct drafts."""
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "optimal_without_replacement")
    return _law(build(target, draft, d.size), target, d)


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    """One verification: Luce choice in the first occupied layer (one uniform), SD accept (one),
    residual draw if rejected."""
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "optimal_without_replacement")
    return _sample(build(target, draft, d.size), target, d, rng)


def acceptance(target, draft, k: int) -> float:
    r""":math:`\sum_y \min(x(y), p(y))`, the probability the selected draft is accepted."""
    return build(target, draft, k).acceptance


def bind(target, scheme) -> OptimalBoundVerifier:
    """Build the rule once for ``target`` and a ``without_replacement`` scheme; refuse others."""
    from ..optimum import optimal_acceptance_of
    from ..schemes import check_target

    require_scheme(scheme, "without_replacement", "optimal_without_replacement", "use optimal (iid) or lp_optimal (small V)")
    target = check_target(scheme, target)
    plan = build(target, scheme.draft, scheme.k)
    k = scheme.k

    def _check(drafts):
        t, _, d = check_inputs(target, scheme.draft, drafts, k)
        require_distinct(d, "optimal_without_replacement")
        return t, d

    def _law_b(drafts):
        t, d = _check(drafts)
        return _law(plan, t, d)

    def _sample_b(drafts, rng):
        t, d = _check(drafts)
        return _sample(plan, t, d, rng)

    alpha = optimal_acceptance_of(scheme, target).value
    return OptimalBoundVerifier(_law_b, _sample_b, acceptance=plan.acceptance, alpha_star=alpha, plan=plan)


__all__ = ["LucePlan", "Target", "OptimalBoundVerifier", "MAX_SETS", "build", "selection_target", "selection_law", "law",
           "sample", "acceptance", "bind"]
