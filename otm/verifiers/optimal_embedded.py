r"""``optimal_embedded``: the iid ``optimal`` rule run on an iid sequence embedded in drafts drawn
without replacement. Exact at any V; acceptance at least the iid optimum.

For k ordered drafts :math:`S = (s_1..s_k)` drawn from :math:`q` (``draft``) WITHOUT replacement
(successive sampling, scheme ``without_replacement``) and target :math:`p` (``target``).

The embedding
-------------
Let :math:`X_1, X_2, \dots` be i.i.d. :math:`q` (:math:`q` has at least k tokens of positive mass).
The first k *distinct* tokens in order of first appearance have exactly the successive-sampling
law: token :math:`s_{m+1}` is the first arrival outside :math:`A_m = \{s_1..s_m\}`, which has law
:math:`q_{s_{m+1}} / (1 - q(A_m))` whatever happened before. Given :math:`S`, the first k arrivals
:math:`X = (X_1..X_k)` follow a simple walk: :math:`X_1 = s_1`, :math:`m = 1`; each next arrival
is a *repeat* :math:`j \in A_m` with probability :math:`q_j`, or the next new token
:math:`s_{m+1}` with probability :math:`1 - q(A_m)` (then :math:`m \leftarrow m + 1`).

*Proof.* Write :math:`x = (x_1..x_k)` with :math:`m` distinct values whose order of first
appearance is :math:`s_1..s_m` (other x have probability 0 given S, and under the walk). The
infinite sequence has :math:`X_{1..k} = x` and :math:`S = s` iff its first k terms are x and the
next new tokens after them are :math:`s_{m+1}..s_k` in order, so

.. math::

    P(X = x, S = s) = \prod_{i \le k} q_{x_i} \prod_{j=m}^{k-1} \frac{q_{s_{j+1}}}{1 - q(A_j)},
    \qquad
    P(S = s) = \prod_{j=0}^{k-1} \frac{q_{s_{j+1}}}{1 - q(A_j)} .

Dividing, the new-token factors :math:`q_{s_1}..q_{s_m}` of :math:`\prod_i q_{x_i}` cancel
(:math:`1 - q(A_0) = 1`) and

.. math::

    P(X = x \mid S = s) = \prod_{i:\ x_i \text{ a repeat}} q_{x_i} \prod_{j=1}^{m-1} (1 - q(A_j)),

which is the walk's probability of the path x (a repeat step contributes :math:`q_{x_i}`; the step
that raises :math:`m` from j to j + 1 contributes :math:`1 - q(A_j)`). Hence, drawing S by
successive sampling and then X by the walk, :math:`X \sim q^{\otimes k}` *exactly*, and every
:math:`X_i \in S`. [Also checked by enumeration in the tests: :math:`\sum_S P(S) P(X \mid S) =
\prod_i q_{X_i}` to 1e-12.] The walk needs only :math:`q(A_m)` and :math:`q` at the k drafts;
in floating point its transition probabilities are divided by their sum
:math:`q(A_m) + (1 - q(A_m))` computed from the same numbers, in the sampler and in the law.

The rule
--------
Run the iid rule :mod:`otm.verifiers.optimal` (its lazy :func:`otm.verifiers.optimal.rule`,
k positions) on X: it selects one position with the iid rule's selection law :math:`x`
(marginally over S and the walk, because X is exactly i.i.d. :math:`q`), then single-draft SD from
:math:`x` to :math:`p`. The selected token is a draft of S; the output law is exactly the target for
every input (canonical form: any selection law with exactly known marginal :math:`x`).

Acceptance (two numbers)
------------------------
* *selection acceptance* :math:`\sum_y \min(x(y), p(y))`, the probability that the selected draft
  is accepted: the iid rule's acceptance, :math:`\alpha^*_{iid}(p, q, k)` when its reported gap is
  0 (:func:`acceptance`; exact, O(V));
* *membership acceptance* :math:`P(\text{output} \in S)`: the selection acceptance plus the
  probability that a rejected draft's residual draw lands on a token of S that the walk did not
  repeat into X. Between the selection acceptance and :math:`\alpha^*_{wor}`; exact given S
  (:func:`conditional_acceptance`), so exact over the scheme by enumeration at small V, and at
  large V an unbiased Rao-Blackwellised Monte Carlo over S (:func:`membership_acceptance`, with
  its standard error).

``bind(target, scheme).gap`` is :math:`\alpha^*_{wor}` less the selection acceptance: a certified
upper bound on how far the rule falls short of the optimum for drafts without replacement.

Cost
----
Set-up: the iid rule (:func:`otm.verifiers.optimal.rule`, O(V) passes, no sort). Per verification:
the walk (k - 1 uniforms, O(k^2)), the race (k uniforms), the accept test, and after a rejection
one draw from the residual, group first (:meth:`otm.verifiers.optimal.GroupedRule.draw_residual`).
:func:`law` enumerates the walk's paths, the restricted-growth sequences of
length k (Bell(k): 2, 5, 15, 52, 203, 877, 4140 for k = 2..8), vectorised.

Measured at V = 49152 (``analysis/bench_embedded.py``, table in ``docs/theory.md`` section 3;
numpy float64, batch 1, one thread of a shared 2-core AMD EPYC): set-up 0.8-4.6 ms, one
verification 0.06-0.9 ms, :func:`law` 1 ms (k = 2, 4) to 21-45 ms (k = 8). On peaked,
Dirichlet(0.05) and target-proportional-to-draft-squared laws (k = 2, 4, 8, three seeds) the
selection acceptance (= :math:`\alpha^*_{iid}`) is within 1e-4 to 0.01 of :math:`\alpha^*_{wor}` and
0.05-0.15 above RRSw (Dirichlet: 0.001-0.003). On *sharp* laws (a few heavy draft tokens, which iid
drafts keep repeating) :math:`\alpha^*_{iid}` is far below :math:`\alpha^*_{wor}` (0.34 vs 0.53 at
k = 2); the membership acceptance recovers much of it but stays at or below RRSw. A floor with an
exact law at any V, not the optimum.

>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)  # alpha*_iid = 0.2 + 1 - 0.6**2
0.84
>>> law([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [2, 0]).round(4)
array([0.6333, 0.0333, 0.3333])
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..laws import OtmError, check_k, check_law, inverse_cdf
from . import optimal
from .embedding import mass_outside, require_distinct, unseen_mass
from .base import Outcome, check_inputs, require_scheme, residual_law, serve_selected
from .optimal import OptimalBoundVerifier

MAX_K = 8
"""Largest k :func:`law` enumerates the walk for (Bell(8) = 4,140 paths; the race arrays grow as
Bell(k) (2k)^2); the sampler has no limit. ``otm acceptance`` reads it (a module's ``MAX_K``) to give
the closed form instead of the enumerated law above it."""

MC_SAMPLES = 2000
"""Default number of draft sets for :func:`membership_acceptance` at large V."""

EXACT_TUPLES = 20_000
""":func:`membership_acceptance` enumerates the scheme's ordered tuples up to this many."""


@functools.lru_cache(maxsize=16)
def walk_paths(k: int) -> np.ndarray:
    """``[Bell(k), k]`` restricted-growth sequences: ``a[0] = 0``, ``a[i] <= max(a[:i]) + 1``.

    Path ``a`` is the walk's ``X = S[a]`` (indices into the ordered drafts), read-only.
    """
    paths = np.zeros((1, 1), dtype=np.int64)
    for _ in range(1, k):
        top = paths.max(axis=1)
        reps = top + 2  # choices: any seen index 0..top, or the new one top + 1
        rows = np.repeat(np.arange(paths.shape[0]), reps)
        nxt = np.concatenate([np.arange(r) for r in reps])
        paths = np.concatenate([paths[rows], nxt[:, None]], axis=1)
    paths.flags.writeable = False
    return paths


def walk_weights(q_s: np.ndarray, rest: float) -> np.ndarray:
    """``[Bell(k)]`` probability of each path of :func:`walk_paths` given the ordered drafts.

    ``q_s``: draft masses of ``s_1..s_k``; ``rest``: the draft mass outside S. A repeat of ``s_j``
    has probability ``q_j / total``, the next new draft ``(1 - q(A_m)) / total``, with
    ``total = q(A_m) + (1 - q(A_m))`` (1 up to rounding).
    """
    k = q_s.size
    paths = walk_paths(k)
    avail = unseen_mass(q_s, rest)
    seen = np.maximum.accumulate(paths, axis=1)  # [R, k] largest index seen up to i
    m = seen[:, :-1] + 1  # drafts seen before step i (i = 1..k-1)
    new = paths[:, 1:] == m
    qa = np.cumsum(q_s)[m - 1]  # q(A_m)
    total = qa + avail[np.minimum(m, k - 1)]
    num = np.where(new, avail[np.minimum(m, k - 1)], q_s[paths[:, 1:]])
    return np.prod(num / total, axis=1)


def walk(q_s: np.ndarray, rest: float, u: np.ndarray) -> np.ndarray:
    """``[k]`` one walk path (indices into S) from ``k - 1`` uniforms ``u``: the sampler's twin of
    :func:`walk_weights` (same transition probabilities, inverse CDF over ``(s_1..s_m, new)``)."""
    k = q_s.size
    avail = unseen_mass(q_s, rest)
    cq = np.cumsum(q_s)
    out = np.zeros(k, dtype=np.int64)
    m = 1
    for i in range(1, k):
        t = u[i - 1] * (cq[m - 1] + avail[m])
        j = int(np.searchsorted(cq[:m], t, side="right"))  # j < m: repeat s_j; j == m: new
        out[i] = j
        m += j == m
    return out


def _race_selection(theta, key1, key2, paths):
    """``[R, k]`` P(position j of path r is selected) by the iid rule's race: each position takes its
    token's pass-1 key w.p. theta, else its pass-2 key; smallest key wins, the first on ties
    (:func:`otm.verifiers.optimal.selection_law`, vectorised over the paths)."""
    R, k = paths.shape
    keys = np.stack([key1[paths], key2[paths]], axis=2)  # [R, k, 2]
    th = theta[paths]
    probs = np.stack([th, 1.0 - th], axis=2)  # [R, k, 2]
    pos = np.arange(k)
    kj = keys[:, :, :, None, None]  # [R, j, s, 1, 1]
    kl = keys[:, None, None, :, :]  # [R, 1, 1, l, s']
    later = (pos[None, :] > pos[:, None])[None, :, None, :, None]  # l > j
    beats = (kl > kj) | ((kl == kj) & later)  # j's option s beats l's option s'
    survive = (probs[:, None, None, :, :] * beats).sum(axis=4)  # [R, j, s, l]
    survive[:, pos, :, pos] = 1.0
    return (probs * survive.prod(axis=3)).sum(axis=2)  # [R, j]


def _selection_given(rl: optimal.GroupedRule, draft: np.ndarray, d: np.ndarray, rest: float | None = None):
    """``(sel, x_s)``: exact P(selected = s_j | S) over the k drafts, and the iid rule's x at them."""
    theta, key1, key2, x_s = rl.at(d)
    q_s = draft[d]
    w = walk_weights(q_s, mass_outside(draft, d) if rest is None else rest)
    paths = walk_paths(d.size)
    per = _race_selection(theta, key1, key2, paths)  # [R, k]
    sel = np.bincount(paths.ravel(), weights=(w[:, None] * per).ravel(), minlength=d.size)
    return sel, x_s


def _accept_prob(p_s, x_s):
    """``min(1, p/x)`` at the drafts; 0 where x = 0 (such a draft is never selected)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x_s > 0, np.minimum(1.0, p_s / np.where(x_s > 0, x_s, 1.0)), 0.0)


def _law(rl: optimal.GroupedRule, target, draft, d) -> np.ndarray:
    sel, x_s = _selection_given(rl, draft, d)
    acc = _accept_prob(target[d], x_s)
    out = np.zeros(target.size)
    out[d] = sel * acc
    reject = float((sel * (1.0 - acc)).sum())
    if reject > 0:
        out = out + reject * residual_law(rl.residual(), target)
    return out


def _sample(rl: optimal.GroupedRule, target, draft, d, rng: np.random.Generator, rest: float | None = None) -> Outcome:
    q_s = draft[d]
    path = walk(q_s, mass_outside(draft, d) if rest is None else rest, rng.random(d.size - 1))
    theta, key1, key2, x_s = rl.at(d)
    u = rng.random(d.size)
    keys = np.where(u < theta[path], key1[path], key2[path])
    j = int(path[int(np.argmin(keys))])  # the selected draft's index in S
    return serve_selected(rng, d, j, target[d[j]], x_s[j], rl.draw_residual, target)


def sample_rows(rl: optimal.GroupedRule, target, draft, d: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_sample` for many rows sharing one rule, with each row's uniforms given in the sampler's
    order (``u [n, 2k + 1]``: walk ``0..k-2``, race passes ``k-1..2k-2``, accept test ``2k-1``, residual
    draw ``2k``): ``(token [n], accepted [n])``, -1 where no draft is named. The same float64 operations
    row by row, vectorised over the rows (otm.torch.optimal_embedded on the host)."""
    n, k = d.shape
    q_s = draft[d]  # [n, k]
    rest = float(draft.sum()) - q_s.sum(axis=1)  # mass_outside, row by row (the same sums)
    for r in np.flatnonzero(rest < 1e-3):
        rest[r] = mass_outside(draft, d[r])
    avail = rest[:, None] + np.cumsum(q_s[:, ::-1], axis=1)[:, ::-1]  # unseen_mass, row by row
    cq = np.cumsum(q_s, axis=1)
    path = np.zeros((n, k), dtype=np.int64)
    m = np.ones(n, dtype=np.int64)
    rows = np.arange(n)
    for i in range(1, k):  # walk, row by row: searchsorted(cq[:m], t, "right") = #{c < m: cq_c <= t}
        t = u[:, i - 1] * (cq[rows, m - 1] + avail[rows, np.minimum(m, k - 1)])
        j = ((cq <= t[:, None]) & (np.arange(k)[None, :] < m[:, None])).sum(axis=1)
        path[:, i] = j
        m += j == m
    theta, key1, key2, x_s = (a.reshape(n, k) for a in rl.at(d.ravel()))
    th, k1, k2 = (np.take_along_axis(a, path, axis=1) for a in (theta, key1, key2))
    keys = np.where(u[:, k - 1 : 2 * k - 1] < th, k1, k2)
    j = path[rows, np.argmin(keys, axis=1)]  # the selected draft's index in S (first on ties)
    y = d[rows, j]
    accepted = u[:, 2 * k - 1] * x_s[rows, j] < target[y]  # base.accept: u * den < num
    token = np.where(accepted, y, -1)
    index = np.where(accepted, j, -1)
    rejected = np.flatnonzero(~accepted)
    for r, z in zip(rejected, rl.draw_residual_many(u[rejected, 2 * k])):
        if z is None:  # base.draw_and_name's fallback
            z = inverse_cdf(target, float(u[r, 2 * k]))
        hit = np.flatnonzero(d[r] == z)
        token[r], index[r] = z, (hit[0] if hit.size else -1)
    return token, index


def _check_k(d: np.ndarray) -> None:
    if d.size > MAX_K:
        raise OtmError(f"optimal_embedded.law enumerates Bell(k) walk paths up to k = {MAX_K}, got k = {d.size}")


def rule(target, draft, k: int) -> optimal.GroupedRule:
    """The iid rule the drafts' embedded sequence is verified by: :func:`otm.verifiers.optimal.rule`."""
    return optimal.rule(target, draft, k)


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the k = len(drafts) ordered distinct drafts (Bell(k) walk paths)."""
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "optimal_embedded")
    _check_k(d)
    return _law(optimal.checked_rule(target, draft, d.size), target, draft, d)


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    """One verification: the walk (k - 1 uniforms), the iid rule's race (k), SD accept (one),
    residual draw if rejected. ``Outcome.accepted`` indexes ``drafts``."""
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "optimal_embedded")
    return _sample(optimal.checked_rule(target, draft, d.size), target, draft, d, rng)


def acceptance(target, draft, k: int) -> float:
    r"""Selection acceptance :math:`\sum_y \min(x(y), p(y))`, x the iid rule's selection law
    (:math:`\alpha^*_{iid}` unless that rule reports a gap); the membership acceptance is at least this."""
    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    return optimal.checked_rule(p, q, check_k(k)).acceptance


def conditional_acceptance(target, draft, drafts) -> tuple[float, float]:
    """``(selection, membership)`` acceptance given the ordered drafts, exact: P(the selected draft is
    accepted | S) and P(output in S | S)."""
    target, draft, d = check_inputs(target, draft, drafts)
    require_distinct(d, "optimal_embedded")
    _check_k(d)
    return _conditional(optimal.checked_rule(target, draft, d.size), target, draft, d)


def _conditional(rl, target, draft, d, residual=None):
    sel, x_s = _selection_given(rl, draft, d)
    acc = _accept_prob(target[d], x_s)
    a_sel = float((sel * acc).sum())
    reject = float((sel * (1.0 - acc)).sum())
    if reject > 0:
        r = rl.residual() if residual is None else residual
        tot = float(r.sum())
        frac = float(r[d].sum()) / tot if tot > 0 else float(target[d].sum())
        return a_sel, a_sel + reject * frac
    return a_sel, a_sel


@dataclass(frozen=True)
class MembershipEstimate:
    """Membership acceptance P(output in S) with its standard error (0 when exact)."""

    value: float
    se: float
    method: str  # "exact" (enumerated tuples) or "monte_carlo" (Rao-Blackwellised over S)
    samples: int = 0


def _wor_sample(rng, logq, k):
    """Ordered drafts without replacement by Gumbel-top-k (the successive-sampling law)."""
    g = logq + rng.gumbel(size=logq.size)
    top = np.argpartition(-g, k - 1)[:k]
    return top[np.argsort(-g[top])]


def membership_acceptance(target, draft, k: int, *, samples: int = MC_SAMPLES, rng=None,
                          max_tuples: int = EXACT_TUPLES) -> MembershipEstimate:
    """P(output in S) over the scheme: exact by enumeration when the ordered tuples number at most
    ``max_tuples``, else the mean over ``samples`` draft sets S (Gumbel-top-k) of the exact
    conditional membership acceptance, with its standard error."""
    from ..schemes import WithoutReplacement

    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    k = check_k(k)
    if k > MAX_K:
        raise OtmError(f"membership_acceptance enumerates Bell(k) walk paths up to k = {MAX_K}, got k = {k}")
    scheme = WithoutReplacement(q, k)
    rl = optimal.checked_rule(p, q, k)
    res = rl.residual()
    if scheme.n_tuples() <= max_tuples:
        tuples, probs = scheme.enumerate()
        val = sum(pr * _conditional(rl, p, q, t, res)[1] for t, pr in zip(tuples, probs))
        return MembershipEstimate(float(val), 0.0, "exact")
    if samples < 2:
        raise OtmError(f"membership_acceptance needs samples >= 2 for a standard error, got {samples}")
    rng = np.random.default_rng(rng)
    with np.errstate(divide="ignore"):
        logq = np.log(q)
    # control variate: E_S[selection acceptance | S] is known exactly (the iid rule's), so average
    # only the membership gain P(residual lands in S | S) (far smaller variance)
    gain = np.array([np.subtract(*_conditional(rl, p, q, _wor_sample(rng, logq, k), res)[::-1])
                     for _ in range(samples)])
    value = rl.acceptance + float(gain.mean())
    return MembershipEstimate(value, float(gain.std(ddof=1) / np.sqrt(samples)), "monte_carlo", samples)


@dataclass(frozen=True)
class EmbeddedBoundVerifier(OptimalBoundVerifier):
    """:class:`OptimalBoundVerifier` with ``acceptance`` the selection acceptance and ``alpha_star`` the
    optimum for drafts without replacement (so ``gap`` bounds the shortfall from above), plus the
    iid optimum the rule is built on, and its rule."""

    alpha_iid: float = float("nan")
    rule: optimal.GroupedRule | None = None


def bind(target, scheme) -> EmbeddedBoundVerifier:
    """Build the iid rule once for ``target`` and a ``without_replacement`` scheme; refuse others."""
    from ..optimum import optimal_acceptance_of
    from ..schemes import IID, check_target

    require_scheme(scheme, "without_replacement", "optimal_embedded", "use optimal (iid) or lp_optimal (small V)")
    target = check_target(scheme, target)
    draft, k = scheme.draft, scheme.k
    rl = optimal.checked_rule(target, draft, k)

    def _check(drafts):
        t, _, d = check_inputs(target, draft, drafts, k)
        require_distinct(d, "optimal_embedded")
        return t, d

    def _law_b(drafts):
        t, d = _check(drafts)
        _check_k(d)
        return _law(rl, t, draft, d)

    def _sample_b(drafts, rng):
        t, d = _check(drafts)
        return _sample(rl, t, draft, d, rng)

    alpha = optimal_acceptance_of(scheme, target).value
    alpha_iid = optimal_acceptance_of(IID(draft, k), target).value
    return EmbeddedBoundVerifier(_law_b, _sample_b, acceptance=rl.acceptance, alpha_star=alpha, plan=None,
                         alpha_iid=alpha_iid, rule=rl)


__all__ = ["EmbeddedBoundVerifier", "MembershipEstimate", "MAX_K", "walk_paths", "walk_weights", "walk", "rule", "law", "sample",
           "acceptance", "conditional_acceptance", "membership_acceptance", "bind"]
