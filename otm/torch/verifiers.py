r"""Batched torch twins of the numpy verifiers in :mod:`otm.verifiers`.

Every function takes ``target [batch, V]`` (:math:`p`), ``draft [batch, V]``
(:math:`q`) and ``drafts [batch, k]`` (int64 token ids) on any device and
returns ``Verified(token [batch] int64, accepted [batch] int64)``: ``accepted``
is the index into ``drafts`` of the draft the output matched, or
:data:`~otm.torch.NOT_ACCEPTED` (-1) when the output is not one of the drafts,
with the same meaning as ``Outcome.accepted`` of the numpy twin.

Uniforms. Each row uses ``k + 1`` uniforms in [0, 1): uniform ``i`` for the
accept test of draft ``i`` and uniform ``k`` for the residual draw by inverse
CDF (greedy tests only its last draft, with uniform ``k - 1``; SpecHub's two
tests use uniforms 0 and 1). The numpy samplers consume ``rng.random()`` in the
same order, stopping at the first acceptance, so passing ``uniforms`` here and
the same numbers to the numpy ``sample`` gives the same token and index, up to
rounding at the boundaries (bit-identical decisions in float64 apart from
summation order). Without ``uniforms`` they are drawn in float64 from
``generator``.

Precision. Laws are upcast to float32 (or float64 when an input is float64, or
``compute_dtype=torch.float64``) and renormalised; accept tests, rho* and the
inverse CDF are float64 whatever the input dtype. There is no Python loop over
rows or tokens; the loop over the k drafts is what the rules themselves do.

>>> import torch
>>> target = torch.tensor([[0.5, 0.3, 0.2]])
>>> draft = torch.tensor([[0.2, 0.2, 0.6]])
>>> u = torch.tensor([[0.9, 0.1, 0.5]], dtype=torch.float64)
>>> kseq(target, draft, torch.tensor([[2, 0]]), uniforms=u)
Verified(token=tensor([0]), accepted=tensor([1]))
"""

from __future__ import annotations

import numpy as np
import torch

from . import _rho
from ._optimal import optimal
from ._wor import kseq_without_replacement, optimal_embedded
from ._core import (
    DECISION_DTYPE,
    NOT_ACCEPTED,
    Verified,
    fail,
    accept_test,
    assemble,
    check_distinct,
    check_draft_values,
    check_drafts,
    check_law_tensor,
    check_law_values,
    compute_dtype_for,
    first_accepted,
    normalised,
    residual_draw,
    uniforms_for,
)

# -- entry -------------------------------------------------------------------------------


def _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate, *, k=None):
    """Checks and conversions shared by every verifier.

    Returns ``(p, q, d, u)``: normalised ``[batch, V]`` laws in the compute dtype,
    ``d [batch, k]`` int64 and ``u [batch, k + 1]`` float64.
    """
    check_law_tensor(target, "target")
    check_law_tensor(draft, "draft", shape=target.shape, device=target.device)
    batch = target.shape[0]
    d = check_drafts(drafts, batch, target.device, k=k)
    dtype = compute_dtype_for(target, draft, compute_dtype=compute_dtype)
    if validate:
        check_law_values(target, "target")
        check_law_values(draft, "draft")
        check_draft_values(d, draft)
    u = uniforms_for(uniforms, batch, d.shape[1] + 1, target.device, generator, validate)
    return normalised(target, dtype), normalised(draft, dtype), d, u


def _gather(law: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return law.gather(1, d)  # [batch, k]


# -- single draft ------------------------------------------------------------------------


def speculative(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None, validate=True) -> Verified:
    r"""Single-draft speculative sampling (Leviathan et al. 2023; Chen et al. 2023), k = 1.

    Accept :math:`x` with probability :math:`\min(1, p(x)/q(x))`, else emit
    :math:`y \sim \mathrm{norm}((p - q)_+)`. Twin of :func:`otm.verifiers.speculative.sample`.

    Parameters
    ----------
    target, draft : Tensor [batch, V]
    drafts : Tensor [batch, 1] int64
    uniforms : Tensor [batch, 2], optional
        Uniform 0 for the accept test, uniform 1 for the residual draw.
    generator : torch.Generator, optional
    compute_dtype : torch.float32 or torch.float64, optional
    validate : bool
        Check values (one device sync); shapes, dtypes and devices are always checked.
    """
    p, q, d, u = _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate, k=1)
    accept = accept_test(u[:, :1], _gather(p, d), _gather(q, d))  # [batch, 1]
    residual = (p - q).clamp_min_(0.0)  # [batch, V]
    y = residual_draw(residual, p, u[:, 1])  # [batch]
    return assemble(*first_accepted(accept, d), y)


# -- K-SEQ -------------------------------------------------------------------------------


def rho_star(
    target, draft, k: int, *, compute_dtype=None, validate=True, max_iterations: int = _rho.RHO_MAX_ITERATIONS
) -> torch.Tensor:
    r"""K-SEQ's division factor :math:`\rho^*` per row, float64 ``[batch]``.

    The smallest :math:`\rho \in [1, k]` with :math:`g(\rho) = 1 - (1 - \beta(\rho))^k
    - \rho\,\beta(\rho) \le 0`, :math:`\beta(\rho) = \sum_x \min(q(x), p(x)/\rho)`;
    twin of :func:`otm.verifiers.kseq.rho_star`, and the value :func:`kseq` uses (the laws
    are normalised in the compute dtype, then searched in float64).

    Method (details in :mod:`otm.torch._rho`): no sort of the V breakpoints
    :math:`p(x)/q(x)`; Brent's method (scipy's ``brentq``, same tolerances
    ``xtol = 1e-15``, ``rtol = 4 eps``) on :math:`g` over :math:`[1, k]` for all rows at
    once, one float64 pass over V per evaluation (8 to 10 in all at V = 49152), with
    the form of :math:`g` that avoids cancellation in each row's regime. The
    smallest point where :math:`g \le 0` was evaluated is rounded up by the numpy
    module's relative ``SAFETY`` (1e-14) and capped at k. ``max_iterations`` caps
    Brent's steps; a capped result is still valid (:math:`g(\rho) \le 0`), only not
    minimal.

    >>> import torch
    >>> round(float(rho_star(torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([[0.2, 0.2, 0.6]]), 2)), 6)
    1.463325
    """
    check_law_tensor(target, "target")
    check_law_tensor(draft, "draft", shape=target.shape, device=target.device)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        fail(f"k must be a whole number >= 1, got {k!r}")
    if validate:
        check_law_values(target, "target")
        check_law_values(draft, "draft")
    dtype = compute_dtype_for(target, draft, compute_dtype=compute_dtype)
    p, q = normalised(target, dtype).to(DECISION_DTYPE), normalised(draft, dtype).to(DECISION_DTYPE)
    return _rho.search(p, q, k, max_iterations).rho


class _FirstAcceptance:
    """Which rows' K-SEQ outcome is an acceptance already settled by a bracket ``lo <= rho <= hi``?

    The accept test ``u * (rho * q(x)) < p(x)`` is monotone in rho in floating point too
    (rounding is monotone): it passes for every rho <= hi if it passes at hi, and fails for
    every rho >= lo if it fails at lo. A row is settled when its first draft not failing at
    ``lo`` passes at ``hi``; ``lo``, ``hi`` are widened by 1e-12 (relative) for the rounding
    of the search. Rows where every draft might be rejected need rho* itself (the residual).
    ``index`` holds the settled rows' draft indices (``NOT_ACCEPTED`` for the others) once every
    row is settled or some have been dropped; ``active`` lists the rows the search still runs on
    (None: all; :func:`otm.torch._rho.search` drops settled rows through :meth:`keep`).
    """

    MARGIN = 1e-12

    def __init__(self, p, q, d, u, k):
        self.num = p.gather(1, d).to(DECISION_DTYPE).numpy()  # [active, k], as accept_test sees them
        self.q = q.gather(1, d).to(DECISION_DTYPE).numpy()  # [active, k]
        self.u = u[:, :k].numpy()  # [active, k]
        self.index = None  # [batch], once known
        self.active = None  # rows (of the batch) still searched; None: all
        self._first = None  # [active]: the first draft not rejected at the last bracket shown

    def __call__(self, lo, hi):
        lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))[:, None] * (1.0 - self.MARGIN)
        hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))[:, None] * (1.0 + self.MARGIN)
        might_pass = self.u * (lo * self.q) < self.num  # [active, k]: not rejected at every rho in the bracket
        first = might_pass.argmax(1)  # [active]
        rows = np.arange(first.size)
        settled = might_pass[rows, first] & (self.u * (hi * self.q) < self.num)[rows, first]
        if settled.all():
            if self.active is None:
                self.index = first
            else:
                self.index[self.active] = first
        else:
            self._first = first
        return settled

    def keep(self, mask):
        """The search goes on with the active rows where ``mask`` is True only (the others were
        settled at the last bracket shown)."""
        if self.active is None:
            self.active = np.arange(mask.size)
            self.index = np.full(mask.size, NOT_ACCEPTED, dtype=np.int64)
        done = ~mask
        self.index[self.active[done]] = self._first[done]
        self.num, self.q, self.u, self.active = self.num[mask], self.q[mask], self.u[mask], self.active[mask]


def kseq(
    target, draft, drafts, *, uniforms=None, generator=None, rho=None, compute_dtype=None, validate=True
) -> Verified:
    r"""K-SEQ, the draft-selection rule of SpecTr (Sun et al., NeurIPS 2023), batched.

    For drafts :math:`x_1..x_k \sim q` i.i.d., accept :math:`x_i` (first in order)
    with probability :math:`\min(1, p(x_i) / (\rho\, q(x_i)))`; if all are rejected
    emit :math:`y \sim \mathrm{norm}\big((p - \min(p/\rho, q)\, p_{acc}/\beta)_+\big)`
    with :math:`\beta = \beta(\rho)`, :math:`p_{acc} = 1 - (1-\beta)^k`.
    :math:`\rho` defaults to :func:`rho_star` (computed in float64). Twin of
    :func:`otm.verifiers.kseq.sample`; the residual is evaluated as
    :math:`\max(p - c\,q,\ p\,\epsilon,\ 0)` with :math:`c = p_{acc}/\beta` and
    :math:`\epsilon = 1 - c/\rho = -g(\rho)/(\rho\beta)` taken from the search, the same
    expression without the cancellation of numpy's :math:`p - (p/\rho)\,c` on the
    tokens with :math:`p < \rho q` (where it is ~1e-14 p at :math:`\rho^*(1 + \mathrm{SAFETY})`).

    On the CPU, where synchronising costs nothing, the search for :math:`\rho^*`
    stops for a row as soon as its bracket settles the row's outcome as an acceptance
    (the accept test is monotone in :math:`\rho`; settled rows leave the search once they
    are a quarter of those searched, :data:`otm.torch._rho.DROP_FRACTION`), and the
    residual is built only for the rows that reject every draft: same tokens and indices
    as with :math:`\rho^*` to full precision. Elsewhere the full search runs, with no
    synchronisation but one every few steps.

    Parameters
    ----------
    target, draft : Tensor [batch, V]
    drafts : Tensor [batch, k] int64
    uniforms : Tensor [batch, k + 1], optional
    generator : torch.Generator, optional
    rho : float or Tensor [batch], optional
        Division factor; any value in :math:`[\rho^*, k]` is valid.
    compute_dtype, validate : see :func:`speculative`.
    """
    p, q, d, u = _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate)
    k = d.shape[1]
    p64, q64 = p.to(DECISION_DTYPE), q.to(DECISION_DTYPE)  # [batch, V] (no copy when float64)
    settle = None
    if rho is None:
        # on the CPU (no device to synchronise with) the search stops for a row as soon as a bracket of
        # rho* settles its first acceptance: the same outcome, without the last steps and the residual
        settle = _FirstAcceptance(p, q, d, u, k) if _rho.on_host(p.device) else None
        found = _rho.search(p64, q64, k, stop=settle)
        if found is None:
            index = torch.from_numpy(settle.index).to(d.device)  # [batch]
            return Verified(d.gather(1, index.unsqueeze(1)).squeeze(1), index)
        rho, beta, c, eps = found  # [rows searched to the end] each
    else:
        rho = torch.as_tensor(rho, dtype=DECISION_DTYPE, device=p.device).expand(p.shape[0]).contiguous()
        rho, beta, c, eps = _rho.at(p64, q64, k, rho)
    if settle is not None and settle.active is not None:  # some rows settled and dropped on the way
        active = torch.from_numpy(settle.active)  # [rows searched to the end]
        p, q, d_a, u_a = p[active], q[active], d[active], u[active]
    else:
        active, d_a, u_a = None, d, u
    accept = accept_test(u_a[:, :k], _gather(p, d_a), rho.unsqueeze(1) * _gather(q, d_a).to(DECISION_DTYPE))  # [rows, k]
    any_, index, token = first_accepted(accept, d_a)  # [rows] each
    y = token.clone()
    if _rho.on_host(p.device) and p.shape[0] > 1:  # the residual of the rows that reject every draft only
        rej = torch.nonzero(~any_).squeeze(1)  # [rejected]
        p_r, q_r, c_r, eps_r, u_r = p[rej], q[rej], c[rej], eps[rej], u_a[rej, k]
    else:
        rej, p_r, q_r, c_r, eps_r, u_r = None, p, q, c, eps, u_a[:, k]
    if p_r.shape[0]:
        # residual (p - min(p/rho, q) c)_+ = max(p - c q, p (1 - c/rho), 0), with eps = 1 - c/rho in [0, 1]
        residual = torch.addcmul(p_r, q_r, c_r.to(p.dtype).unsqueeze(1), value=-1.0)  # [rejected, V]: p - c q
        torch.maximum(residual, p_r * eps_r.to(p.dtype).unsqueeze(1), out=residual)  # >= 0 since eps >= 0
        drawn = residual_draw(residual, p_r, u_r)  # [rejected]
        if rej is None:
            y = drawn
        else:
            y[rej] = drawn
    out = assemble(any_, index, token, y)
    if active is None:
        return out
    index = torch.from_numpy(settle.index)  # [batch]: the settled rows' draft indices
    token = d.gather(1, index.clamp(min=0).unsqueeze(1)).squeeze(1)  # [batch]
    token[active], index[active] = out.token, out.accepted
    return Verified(token, index)


# -- recursive rejection sampling --------------------------------------------------------


def _renormalised_or_kept(nxt: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """``nxt / nxt.sum()`` per row, or ``current`` where ``nxt`` has no mass (numpy's branch)."""
    s = nxt.sum(-1, keepdim=True)  # [batch, 1]
    empty = s <= 0
    out = nxt / torch.where(empty, torch.ones_like(s), s)  # [batch, V]
    return torch.addcmul(out, current, empty.to(out.dtype))


def rrs(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None, validate=True) -> Verified:
    r"""Recursive rejection sampling with replacement (SpecInfer, Miao et al. 2024), batched.

    With :math:`p_1 = p`: accept :math:`x_i` with probability
    :math:`\min(1, p_i(x_i)/q(x_i))`, else :math:`p_{i+1} = \mathrm{norm}((p_i - q)_+)`;
    if all k are rejected emit :math:`y \sim p_{k+1}`. Twin of
    :func:`otm.verifiers.rrs.sample`. Arguments as :func:`kseq` (no ``rho``).
    """
    p, q, d, u = _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate)
    k = d.shape[1]
    q_d = _gather(q, d)  # [batch, k]
    current = p  # [batch, V]: p_i
    accept = torch.empty(d.shape, dtype=torch.bool, device=p.device)  # [batch, k]
    for i in range(k):
        accept[:, i] = accept_test(u[:, i], current.gather(1, d[:, i : i + 1]).squeeze(1), q_d[:, i])
        current = _renormalised_or_kept((current - q).clamp_min_(0.0), current)
    y = residual_draw(current, current, u[:, k])
    return assemble(*first_accepted(accept, d), y)


def rrs_without_replacement(
    target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None, validate=True
) -> Verified:
    r"""Recursive rejection sampling without replacement (MCSD; RSD; Sequoia), batched.

    With :math:`p_1 = p, q_1 = q`: accept :math:`x_i` with probability
    :math:`\min(1, p_i(x_i)/q_i(x_i))`, else :math:`p_{i+1} = \mathrm{norm}((p_i - q_i)_+)`
    and :math:`q_{i+1} = \mathrm{norm}(q_i \cdot 1[\cdot \ne x_i])`; if all k are rejected
    emit :math:`y \sim p_{k+1}`. Drafts must be distinct (drawn without replacement,
    e.g. :func:`otm.torch.schemes.sample_without_replacement`). Twin of
    :func:`otm.verifiers.rrs_without_replacement.sample`.
    """
    p, q, d, u = _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate)
    k = d.shape[1]
    if validate:
        check_distinct(d, "rrs_without_replacement")
    current, proposal = p, q  # [batch, V]: p_i, q_i
    accept = torch.empty(d.shape, dtype=torch.bool, device=p.device)  # [batch, k]
    for i in range(k):
        x = d[:, i : i + 1]  # [batch, 1]
        accept[:, i] = accept_test(u[:, i], current.gather(1, x).squeeze(1), proposal.gather(1, x).squeeze(1))
        current = _renormalised_or_kept((current - proposal).clamp_min_(0.0), current)
        if i + 1 < k:  # q_{k+1} is never used (and is 0/0 when the draft support has k tokens)
            proposal = proposal.scatter(1, x, 0.0)
            proposal = proposal / proposal.sum(-1, keepdim=True)
    y = residual_draw(current, current, u[:, k])
    return assemble(*first_accepted(accept, d), y)


# -- greedy ------------------------------------------------------------------------------


def greedy(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None, validate=True) -> Verified:
    r"""Verification of Hu et al.'s greedy drafts (ICLR 2025), batched.

    ``drafts[:, :k-1]`` are the top k-1 tokens :math:`D` of :math:`q` (ties to the
    lower index, any order) and ``drafts[:, k-1]`` is :math:`x \sim q' = q\,1[\cdot
    \notin D]/q(\Sigma\setminus D)`. Accept :math:`x` with probability
    :math:`\min(1, p(x)/q'(x))` (uniform ``k-1``), else emit
    :math:`y \sim \mathrm{norm}((p - q')_+)` (uniform ``k``); a residual token in
    :math:`D` counts as accepted, with the index of its first occurrence. Twin of
    :func:`otm.verifiers.greedy.sample`.
    """
    p, q, d, u = _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate)
    k = d.shape[1]
    fixed, x = d[:, : k - 1], d[:, k - 1 :]  # [batch, k-1], [batch, 1]
    if validate:
        from .schemes import top_tokens

        if k > 1 and not torch.equal(fixed.sort(-1).values, top_tokens(q, k - 1)):
            fail(
                f"greedy drafts must start with the top {k - 1} draft tokens of their row (ties to the lower index): "
                "draw them with otm.torch.schemes.sample_greedy"
            )
        if bool((q.scatter(1, fixed, 0.0).sum(-1) <= 0).any()):
            fail(f"greedy with k={k} needs positive draft mass outside the top {k - 1} tokens in every row: lower k")
    rest = q.scatter(1, fixed, 0.0)  # [batch, V]: q on the tokens outside D
    last = rest / rest.sum(-1, keepdim=True)  # [batch, V]: q'
    tested = accept_test(u[:, k - 1], p.gather(1, x).squeeze(1), last.gather(1, x).squeeze(1))  # [batch]
    residual = (p - last).clamp_min_(0.0)  # [batch, V]: = p on D since q' = 0 there
    y = residual_draw(residual, p, u[:, k])  # [batch]
    hit = fixed == y.unsqueeze(1)  # [batch, k-1]: the residual token is one of D
    hit_index = hit.to(torch.uint8).argmax(-1) if k > 1 else torch.zeros_like(y)  # [batch]: first occurrence
    not_accepted = torch.full_like(y, NOT_ACCEPTED)
    token = torch.where(tested, x.squeeze(1), y)
    accepted = torch.where(tested, torch.full_like(y, k - 1), torch.where(hit.any(-1), hit_index, not_accepted))
    return Verified(token, accepted)


# -- SpecHub -----------------------------------------------------------------------------


def spechub(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None, validate=True) -> Verified:
    r"""SpecHub verification (Sun, Zhou, Chen & Sun, EMNLP 2024), batched, k = 2.

    Hub :math:`a = \arg\max q` (first maximum); drafts are :math:`(i, a)` or
    :math:`(a, i)`. With :math:`q_a(i) = q(i) 1[i \ne a]`,
    :math:`m_2(i) = q(a) q_a(i) / (1 - q(a))`, :math:`p'(i) = (p(i) - q_a(i))_+ 1[i \ne a]`,
    :math:`L_1 = \sum (q_a - p)_+ 1[\cdot \ne a]`, :math:`L_2 = \sum (m_2 - p')_+`,
    :math:`p'(a) = (p(a) - L_2)_+`:

    * :math:`(i, a)`: accept :math:`i` if :math:`u_0 q_a(i) < p(i)`, else :math:`a` if
      :math:`u_1 L_1 < p'(a)`;
    * :math:`(a, i)`: accept :math:`i` if :math:`u_0 m_2(i) < p'(i)`, else :math:`a` if
      :math:`u_1 L_2 < p(a)`;
    * else emit :math:`y \sim \mathrm{norm}((p - q_a - m_2)_+ 1[\cdot \ne a])` with :math:`u_2`.

    Twin of :func:`otm.verifiers.spechub.sample`; ``uniforms`` is ``[batch, 3]``.
    """
    p, q, d, u = _prepare(target, draft, drafts, uniforms, generator, compute_dtype, validate, k=2)
    hub = q.argmax(-1, keepdim=True)  # [batch, 1]: first maximum, as np.argmax
    x1, x2 = d[:, :1], d[:, 1:]  # [batch, 1] each
    hub_first = (x1 == hub) & (x2 != hub)  # [batch, 1]
    if validate and bool((~hub_first & ~((x2 == hub) & (x1 != hub))).any()):
        row = int((~hub_first & ~((x2 == hub) & (x1 != hub))).nonzero()[0, 0])
        fail(
            f"spechub drafts must be (i, hub) or (hub, i) with hub = argmax draft; row {row} has "
            f"({int(x1[row])}, {int(x2[row])}) with hub {int(hub[row])}"
        )
    not_hub = torch.ones_like(q).scatter_(1, hub, 0.0)  # [batch, V]
    q_a = q * not_hub  # [batch, V]: mass of the pairs (i, a)
    others = q_a / q_a.sum(-1, keepdim=True)  # [batch, V]: q restricted to tokens != hub
    q_hub = q.gather(1, hub)  # [batch, 1]
    p_hub = p.gather(1, hub)  # [batch, 1]
    m2 = q_hub * others  # [batch, V]: mass of the pairs (a, i)
    p_excess = (p - q_a).clamp_min_(0.0) * not_hub  # [batch, V]: p'(i)
    left1 = ((q_a - p).clamp_min_(0.0) * not_hub).sum(-1, keepdim=True)  # [batch, 1]: L_1
    left2 = (m2 - p_excess).clamp_min_(0.0).sum(-1, keepdim=True)  # [batch, 1]: L_2
    hub_rest = (p_hub - left2).clamp_min_(0.0)  # [batch, 1]: p'(a)
    i = torch.where(hub_first, x2, x1)  # [batch, 1]: the non-hub draft
    num_i = torch.where(hub_first, p_excess.gather(1, i), p.gather(1, i))
    den_i = torch.where(hub_first, m2.gather(1, i), q_a.gather(1, i))
    num_a = torch.where(hub_first, p_hub, hub_rest)
    den_a = torch.where(hub_first, left2, left1)
    accept_i = accept_test(u[:, 0], num_i.squeeze(1), den_i.squeeze(1))  # [batch]
    accept_a = accept_test(u[:, 1], num_a.squeeze(1), den_a.squeeze(1))  # [batch]
    residual = (p - q_a - m2).clamp_min_(0.0) * not_hub  # [batch, V]
    y = residual_draw(residual, p, u[:, 2])  # [batch]
    hub_first = hub_first.squeeze(1)
    i_index = hub_first.to(torch.int64)  # 1 if the hub came first
    token = torch.where(accept_i, i.squeeze(1), torch.where(accept_a, hub.squeeze(1), y))
    accepted = torch.where(accept_i, i_index, torch.where(accept_a, 1 - i_index, torch.full_like(y, NOT_ACCEPTED)))
    return Verified(token, accepted)


VERIFIERS = {
    "speculative": speculative,
    "kseq": kseq,
    "rrs": rrs,
    "rrs_without_replacement": rrs_without_replacement,
    "greedy": greedy,
    "spechub": spechub,
    "optimal": optimal,
    "kseq_without_replacement": kseq_without_replacement,
    "optimal_embedded": optimal_embedded,
}
"""Name -> batched verifier (the names of :data:`otm.verifiers.VERIFIERS`, less ``lp_optimal``)."""

__all__ = ["VERIFIERS", "optimal", "kseq_without_replacement", "optimal_embedded", "speculative", "kseq", "rho_star", "rrs", "rrs_without_replacement", "greedy", "spechub"]
