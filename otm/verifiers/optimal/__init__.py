r"""``optimal``: select one draft by a layered two-pass priority race, then single-draft SD.

For k i.i.d. drafts :math:`x_1..x_k \sim q` (``draft``) and target :math:`p`
(``target``) the rule has Khisti et al.'s canonical form (ICLR 2025, theory
section 5.2): (1) select ONE drafted token :math:`Y'` with an exactly known law
:math:`x(y) = P(Y' = y)`; (2) single-draft speculative sampling from :math:`x` to
:math:`p`: accept :math:`Y'` w.p. :math:`\min(1, p(Y')/x(Y'))`, else draw from
:math:`\mathrm{norm}((p - x)_+)`. Step (2) outputs exactly :math:`p` for ANY
selection law :math:`x`, so the output law is the target whatever the choices
below; they only decide the acceptance :math:`\sum_y \min(x(y), p(y))`.

Selection as a race on the draft-mass clock
-------------------------------------------
Give every token :math:`i` a measure :math:`\mu_i` on :math:`[0, 1]` of mass
:math:`q_i` with :math:`\sum_i \mu_i = ` Lebesgue (a *tiling*). Each draft position
with token :math:`i` draws a key :math:`s \sim \mu_i / q_i`; the position with the
smallest key is selected. Positions are i.i.d. and the key of a position is
Uniform[0,1], so

.. math::

    x_i = k \int (1 - s)^{k-1}\, d\mu_i(s) = \int g'(s)\, d\mu_i(s),
    \qquad g(s) = 1 - (1 - s)^k .

A fixed priority order is the tiling by consecutive intervals
(:math:`x_{\sigma_j} = g(D_j) - g(D_{j-1})`); every point of the base polytope
of the coverage function :math:`f(A) = g(q(A))` (theory section 11) is some tiling.

The target selection law
------------------------
Sort tokens by :math:`r = p/q` descending (tokens with :math:`p = 0` last) and let
:math:`\lambda` be the isotonic (increasing, weights :math:`p`) regression of the
per-token slopes :math:`s_j = (g(D_j) - g(D_{j-1}))/p_j`, i.e. the slopes of the
greatest convex minorant of the points :math:`(P_j, g(D_j))`. Then
:math:`x^\star = \lambda p` is the lexicographically optimal base of :math:`f`
with respect to :math:`p` (Fujishige 1980, "Lexicographically optimal base of a
polymatroid with respect to a weight vector"); since :math:`\min(x, p) = p\,h(x/p)`
with :math:`h(t) = \min(t, 1)` concave, that base maximises
:math:`\sum \min(x, p)` over the base polytope, whose maximum is
:math:`\alpha^* = \min_H p(H) + 1 - q(H)^k` (polymatroid rank of the box
:math:`p`; Hu et al., ICLR 2025). [Proved, standard results; the equality
:math:`\sum\min(x^\star, p) = \alpha^*` is also checked against
:func:`otm.optimum.optimal_acceptance_of` and the LP in the tests.]

Realising it: layered two-pass priority
---------------------------------------
The isotonic blocks (layers) are consecutive in the ratio order and are given
consecutive intervals :math:`[A, B]` of the clock (layers in ratio order). Inside a
layer with tokens :math:`1..n` (ratio order), prefix masses :math:`Q_i` and prefix
targets :math:`V_i = \lambda P_i`, a split point :math:`\Theta` divides
:math:`[A, B]` into a first pass :math:`[A, A+\Theta]` and a second pass
:math:`[A+\Theta, B]`; token :math:`i` takes a fraction :math:`\theta_i` of its mass
in the first pass and the rest in the second, each pass laid out in ratio order.
As a rule: a position with token :math:`i` is in pass 1 w.p. :math:`\theta_i`
(independently); select the drafted position with the smallest key
(layer, pass, ratio rank). With :math:`T_i = \sum_{j \le i} \theta_j q_j`,
:math:`U_i = Q_i - T_i`, :math:`c = 1 - A` and :math:`\Theta = T_n`:

.. math::

    x_i = \big[(c - T_{i-1})^k - (c - T_i)^k\big]
        + \big[(c - \Theta - U_{i-1})^k - (c - \Theta - U_i)^k\big].

Given :math:`\Theta`, :math:`T_i` solves the scalar monotone equation
:math:`(c^k - (c-T)^k) + ((c-\Theta)^k - (c-\Theta-Q_i+T)^k) = V_i` (independently
per token: vectorised, Newton from below on a concave increasing function). If the
solution is monotone with :math:`0 \le T_i - T_{i-1} \le q_i`, the layer realises
:math:`x^\star` exactly. Otherwise :math:`\theta` is clipped to [0, 1] and
:math:`x` recomputed from the clipped :math:`\theta` by the formula above, so
**the selection law used is always exactly the one the sampler realises**; only
the acceptance may fall short of :math:`\alpha^*`. :math:`\Theta` is chosen per
layer among a few candidates in :math:`[g'^{-1}(v_1), g'^{-1}(v_n)] - A`
(:math:`v = \lambda r`), the necessary range for the first and last token, keeping
the candidate with the largest acceptance.

What is proved and what is tested
---------------------------------
* Proved: the output law is exactly the target for every input (canonical form
  + exact selection law; the selection law's closed form is also checked by
  enumeration in the tests); :math:`\sum\min(x^\star, p) = \alpha^*`.
* NOT proved: that a two-pass layout realising :math:`x^\star` always exists.
  Measured: on random peaked laws at V = 49152, k = 2, 4, 8 the gap
  :math:`\alpha^* - ` :func:`acceptance` was below 1e-12 in every case tried; on
  the embedded pair's real laws (64 positions, k = 2, 4, 8; ``analysis/accept_vs_time.py``)
  it was above 1e-9 at 1 of 192 cases (2.1e-3, k = 4; three more, 1e-8 to 3e-3, were
  closed by trying more split candidates); on adversarial small laws (Dirichlet 0.1-3,
  V <= 13, k <= 8) it was positive in about 0.2% of cases (largest seen 5e-3). The rule
  reports its own gap: ``bind(target, scheme).gap``.

``acceptance`` returns :math:`\sum_y \min(x(y), p(y))`, the probability that the
selected draft is accepted. When the gap is 0 the residual never lands on a draft
(rejection implies every draft lies in the min cut :math:`H^*`, where
:math:`x \ge p`), so this is the membership acceptance :math:`\alpha^*`; when the gap
is positive the membership acceptance lies between it and :math:`\alpha^*`.

Groups: the rule at real vocabularies
-------------------------------------
:func:`build_tokens` lays out every token (one argsort, one isotonic regression,
Newton passes over the tokens of multi-token layers): 10-200 ms per position at
V = 49152. The rule that :func:`sample`, :func:`law`, :func:`bind` and
:func:`otm.torch.optimal` use, :func:`rule` (and :func:`build`, its arrays over the
vocabulary), races *groups* of tokens instead:

1. tokens are cut into ratio slices (*buckets*) of ``2**-GROUP_BITS`` octave, and
   each bucket into ``2**FINE_BITS`` *sub-buckets*, read from the floats' bits (no sort
   over the vocabulary; one weighted bincount per law); the two buckets around the
   best cut between whole buckets hold the optimal cut :math:`H^*` and are raced as
   their sub-buckets, and the two sub-buckets around the best cut between those as
   single tokens, from the start;
2. the layered two-pass race above is built on the groups (each a "token" of target
   mass :math:`P_G` and draft mass :math:`Q_G`; about 150-350 groups at V = 49152);
3. inside a group, each draft position takes its group's pass-1 key with
   probability :math:`\theta_i`, else the pass-2 key, and ties go to the first
   position. Given the groups and passes of all positions (which decide the winning
   position), the tokens are independent with law :math:`q_i \theta_i / \Theta_G` in
   pass 1 and :math:`q_i (1 - \theta_i) / (Q_G - \Theta_G)` in pass 2, so the selection
   law is exactly :math:`x_i = q_i(\theta_i a_G + (1 - \theta_i) b_G)`, with
   :math:`a_G, b_G` the group's pass-1 and pass-2 selection mass per unit of draft mass.
   :math:`\theta_i = \theta_G` gives :math:`x_i = x_G q_i / Q_G`; where :math:`b_G \le
   \lambda_G r_i \le a_G` over the group's ratio range, :math:`\theta_i = (\lambda_G r_i -
   b_G)/(a_G - b_G)` gives :math:`x_i = \lambda_G p_i` (:math:`\lambda_G = x_G / P_G`),
   and the constraint :math:`\sum_i q_i \theta_i = \Theta_G` holds by construction;
4. a group whose tokens lie on both sides of :math:`x_i = p_i` (a *straddling* group)
   is split into single tokens and the layout redone (up to :data:`REFINE_ROUNDS`);
   a whole bucket's tokens are counted only then (one token cannot straddle).

The law is exact whatever the groups (step 3); the acceptance is
:math:`\sum_G \min(x_G, P_G)` when nothing straddles, which equals the optimum over
group-closed cuts, :math:`\alpha_G \ge \alpha^*`, and so is :math:`\alpha^*` itself.
``RacePlan.gap_bound = alpha_groups - acceptance`` bounds the gap from above without a
sort. Measured (tests and ``analysis/bench_verify.py --optimal-only``): gap below
1e-12 on every peaked and real law tried at V = 49152, k = 2, 4, 8, usually after one
group layout. Per position: O(V) passes (the ratio's bits, two weighted bincounts, the
tokens of the two single sub-buckets),
one group layout, and O(k) for the race and the accept test; after a rejection, the draw
from :math:`\mathrm{norm}((p - x)_+)` goes group first (inverse CDF over the groups' residual
masses :math:`(P_G - x_G)_+`), then to a token of that group (one pass over the sub-bucket
ids): :meth:`GroupedRule.draw_residual`, never the O(V) residual itself. Times:
``docs/torch_verifiers.md``.

>>> round(acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), 6)  # alpha* = 0.2 + 1 - 0.6**2
0.84
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...laws import OtmError, check_k, check_law
from ..base import BoundVerifier, Outcome, check_inputs, inverse_cdf_draw, require_scheme, residual_law, serve_selected
from .groups import rule_steps
from .layout import RacePlan, layout_rows
from .lazy import GroupedRule, Scaled
from .reference import build_tokens, selection_law


def build(target, draft, k: int, *, group_bits: int | None = None) -> RacePlan:
    """The selection rule for one position, every token's arrays at once: ``rule(...).plan()``."""
    return rule(target, draft, k, group_bits=group_bits).plan()


def rule(target, draft, k: int, *, group_bits: int | None = None) -> GroupedRule:
    r"""The selection rule for one position, racing groups of tokens of nearly equal ratio.

    Tokens are cut into groups consecutive in the ratio order (``2**group_bits`` buckets per
    octave of :math:`p/q`, each of ``2**FINE_BITS`` sub-buckets, :func:`_ratio_bins`: no sort;
    steps 1 and 4 of the module docstring say which are raced whole); the layered two-pass race of
    the module docstring is built on the groups as if each were one token of target mass
    :math:`P_G = p(G)` and draft mass :math:`Q_G = q(G)`, giving the group selection law
    :math:`x_G`. Each draft position gets its group's pass and key; the smallest key wins,
    the first position on ties. Given the positions' groups and passes (which decide the
    winning position) the drafted tokens are independent with law :math:`q_i / Q_G` inside
    their groups, so the selected token's law is exactly

    .. math::  x_i = x_{G(i)}\, q_i / Q_{G(i)} .

    Acceptance. :math:`\sum_i \min(x_i, p_i) \le \sum_G \min(x_G, P_G)`, with equality
    when no group *straddles*, i.e. has tokens on both sides of :math:`x_i = p_i`; a group
    of ratios in :math:`[lo, hi)` cannot straddle when :math:`x_G/Q_G \le lo` or
    :math:`\ge hi`. Straddling groups are split into single tokens (sorted: they are few)
    and the groups rebuilt, up to :data:`REFINE_ROUNDS` times; straddling groups whose losses
    :math:`\\sum_i (p_i - x_i)_+ \\le Q_G (hi - x_G/Q_G)` add up to at most
    :data:`SPLIT_TOLERANCE` stay whole. The group race reaches
    :math:`\alpha_G = 1 + \min_j g(D_j) - P_j` over the group boundaries (when its own
    layout reaches its optimum), and :math:`\alpha_G \ge \alpha^*` since fewer cuts are
    tried; so when nothing straddles, the acceptance equals :math:`\alpha^*`.
    ``plan.gap_bound = alpha_groups - acceptance`` bounds the gap to :math:`\alpha^*`
    from above without a sort; :func:`bind` reports the gap itself.
    """
    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    return checked_rule(p, q, check_k(k), group_bits)


def checked_rule(p: np.ndarray, q: np.ndarray, k: int, group_bits: int | None = None) -> GroupedRule:
    """:func:`rule` on checked, normalised float64 laws."""
    return drive_rules([rule_steps(p, q, k, group_bits)], k)[0]


def rules(targets, drafts, k: int) -> list[GroupedRule]:
    """:func:`rule` of every row of ``targets``, ``drafts`` (``[rows, V]``), the rows' group layouts
    solved together (:func:`layout_rows`): each row's rule is the one :func:`rule` gives it alone,
    bit for bit. Each row is checked and normalised by :func:`otm.laws.check_law`."""
    targets, drafts = np.asarray(targets, dtype=np.float64), np.asarray(drafts, dtype=np.float64)
    if targets.ndim != 2 or drafts.shape != targets.shape:
        raise OtmError(f"targets and drafts must be [rows, V] arrays of one shape, got {targets.shape} and {drafts.shape}")
    k = check_k(k)
    rows = [(check_law(t, "target"), check_law(d, "draft")) for t, d in zip(targets, drafts)]
    return checked_rules(np.array([t for t, _ in rows]), np.array([d for _, d in rows]), k)


def checked_rules(targets: np.ndarray, drafts: np.ndarray, k: int) -> list[GroupedRule]:
    """:func:`rules` on checked, normalised float64 rows."""
    return drive_rules([rule_steps(t, d, k, None) for t, d in zip(targets, drafts)], k)


def drive_rules(steps, k: int) -> list[GroupedRule]:
    """Run :func:`rule_steps` generators in lock step: each round's group layouts in one call."""
    out: list = [None] * len(steps)
    pending = {i: next(s) for i, s in enumerate(steps)}
    while pending:
        ids = list(pending)
        layouts = layout_rows([pending[i][0] for i in ids], [pending[i][1] for i in ids], k)
        pending = {}
        for i, lay in zip(ids, layouts):
            try:
                pending[i] = steps[i].send(lay)
            except StopIteration as done:
                out[i] = done.value
    return out


def _law(plan: RacePlan, target: np.ndarray, d: np.ndarray) -> np.ndarray:
    sel = selection_law(plan, d)
    hit = sel > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(hit, np.minimum(1.0, target / np.where(hit, plan.x, 1.0)), 0.0)
    out = sel * acc
    reject = float((sel * (1.0 - acc)).sum())
    if reject > 0:
        out = out + reject * residual_law(plan.residual, target)
    return out


def _sample(plan: RacePlan, target: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> Outcome:
    u = rng.random(d.size)
    keys = np.where(u < plan.theta[d], plan.key1[d], plan.key2[d])
    i = int(np.argmin(keys))
    return serve_selected(rng, d, i, target[d[i]], plan.x[d[i]], inverse_cdf_draw(lambda: plan.residual), target)


def law(target, draft, drafts) -> np.ndarray:
    """Exact output law given the k = len(drafts) drafts."""
    target, draft, d = check_inputs(target, draft, drafts)
    return _law(build(target, draft, d.size), target, d)


def sample(target, draft, drafts, rng: np.random.Generator) -> Outcome:
    """One verification: race selection (k uniforms), SD accept (one), residual draw if rejected.

    The rule is evaluated lazily (:class:`GroupedRule`): at the k drafts, and after a rejection the
    residual is drawn group first (:meth:`GroupedRule.draw_residual`); the same selection and accept
    decisions as :func:`_sample` on ``rule.plan()`` (whose residual draw is the inverse CDF over
    the tokens: the same law, another token for the same uniform).
    """
    target, draft, d = check_inputs(target, draft, drafts)
    return _sample_rule(checked_rule(target, draft, d.size), d, rng)


def _sample_rule(rl: GroupedRule, d: np.ndarray, rng: np.random.Generator) -> Outcome:
    u = rng.random(d.size)
    theta, key1, key2, x = rl.at(d)
    i = int(np.argmin(np.where(u < theta, key1, key2)))
    return serve_selected(rng, d, i, rl.target_law.at(d[i : i + 1])[0], x[i], rl.draw_residual, rl.target)


def acceptance(target, draft, k: int) -> float:
    r""":math:`\sum_y \min(x(y), p(y))`, the probability the selected draft is accepted (module doc)."""
    return build(target, draft, k).acceptance


@dataclass(frozen=True)
class OptimalBoundVerifier(BoundVerifier):
    """:class:`BoundVerifier` plus the rule's own acceptance, the optimum and the gap between them
    (``bind`` of this module and of :mod:`otm.verifiers.optimal_without_replacement`; ``plan`` is
    that module's ``RacePlan``)."""

    acceptance: float = float("nan")
    alpha_star: float = float("nan")
    plan: RacePlan | None = None

    @property
    def gap(self) -> float:
        """``alpha_star - acceptance`` (>= 0 up to rounding; 0 when the layout realises x*)."""
        return self.alpha_star - self.acceptance


def bind(target, scheme) -> OptimalBoundVerifier:
    """Build the rule once for ``target`` and an ``iid`` scheme; refuse other schemes."""
    from ...optimum import optimal_acceptance_of
    from ...schemes import check_target

    require_scheme(scheme, "iid", "the optimal verifier", "use lp_optimal (small V) or the scheme's own verifier")
    target = check_target(scheme, target)
    plan = build(target, scheme.draft, scheme.k)
    k = scheme.k

    def _law_b(drafts):
        t, _, d = check_inputs(target, scheme.draft, drafts)
        return _law(plan if d.size == k else build(target, scheme.draft, d.size), t, d)

    def _sample_b(drafts, rng):
        t, _, d = check_inputs(target, scheme.draft, drafts)
        return _sample(plan if d.size == k else build(target, scheme.draft, d.size), t, d, rng)

    alpha = optimal_acceptance_of(scheme, target).value
    return OptimalBoundVerifier(_law_b, _sample_b, acceptance=plan.acceptance, alpha_star=alpha, plan=plan)


__all__ = ["RacePlan", "GroupedRule", "Scaled", "OptimalBoundVerifier", "build", "build_tokens", "rule", "rules", "selection_law", "law", "sample", "acceptance", "bind"]
