r"""Batched verifiers for drafts without replacement: a host set-up (numpy per row) on the CPU, a sync-free
set-up in torch elsewhere.

``kseq_without_replacement`` (twin of :mod:`otm.verifiers.kseq_without_replacement`).

Set-up, on the CPU (:func:`otm.torch._rho.on_host`): per distinct row in numpy float64 (the root search of
:math:`E[N_\rho] = \rho`, one race quadrature per evaluation: 30-80 ms at V = 49152, see
``analysis/bench_embedded.py``). Elsewhere (and on the CPU with ``otm.torch._rho.FORCE_DEVICE_PATH``):
:mod:`otm.torch._wor_trials`, the same quadrature and root search in torch float64 over all rows at once,
with fixed shapes and no value read back (its rho is the host's to 2.5e-10 relatively on the small rows of
tests/test_wor_device.py, 8e-8 at worst on 64 rows of V = 49152; valid either way). The decisions are
torch ops on the input's device: for each new draft :math:`s_{m+1}` the test
``u q < min(q, p/rho)``, then the repeat phase (an accepted repeat of :math:`s_1..s_{m+1}`, or on to the
next new draft, by inverse CDF over ``(min(q, p/rho) at s_1..s_{m+1}, 1 - q(A_{m+1}))``), and after k
rejections one draw from :math:`p - E[N_\rho] \min(q, p/\rho)`.

Uniforms ``[batch, 2k]``: ``2m`` for the test of draft m, ``2m + 1`` for the repeat phase after it
(m < k - 1), ``2k - 1`` for the residual draw: the order in which the numpy sampler consumes
``rng.random()``, so the same uniforms give the same token and index.

``optimal_embedded`` (twin of :mod:`otm.verifiers.optimal_embedded`). On the CPU: set-up per distinct row by
:func:`otm.verifiers.optimal.rule` (1-3 ms at V = 49152); the decisions run on the host, row by row,
through the numpy sampler itself (the walk of repeats, the race, the accept test, the group-first
residual draw), fed the row's uniforms: the same code, so the same token and index by construction.
Elsewhere: the walk of repeats in torch (:func:`embedded_walk`: fixed shapes, no read back), then the
iid ``optimal`` (``otm.torch.optimal``) on the embedded draws with the remaining uniforms; the walk adds
no read, so the call reads back what ``optimal`` reads (8 per call at batch 32, k = 4, ``validate=False``).
Uniforms ``[batch, 2k + 1]``: ``0..k-2`` the walk, ``k-1..2k-2`` the race passes, ``2k - 1`` the accept
test, ``2k`` the residual draw (the numpy sampler's order; the last k + 2 are ``optimal``'s layout).

Time per call at V = 49152 (``analysis/bench_wor_device.py``, the 2-core AMD EPYC, one torch thread),
host set-up / device path on the CPU: ``kseq_without_replacement`` 58 / 213 ms (batch 1, k = 2), 86 / 311 ms
(batch 1, k = 4), 2034 / 17042 ms (batch 32, k = 2), 2950 / 23284 ms (batch 32, k = 4); ``optimal_embedded``
1 / 6, 6 / 6, 82 / 71, 243 / 141 ms. The device path does 43 quadratures per row (ROOT_STEPS + 3) where
the host does 5-13; it is written for an accelerator, where the rows run in parallel.
"""

from __future__ import annotations

import numpy as np
import torch

from ..verifiers import kseq_without_replacement as _np_kw
from ..verifiers import optimal_embedded as _np_oe
from ..verifiers.embedding import mass_outside
from ._core import (
    DECISION_DTYPE,
    NOT_ACCEPTED,
    Verified,
    accept_test,
    check_distinct,
    residual_draw,
    uniforms_for,
)
from . import _rho
from . import _wor_trials as _trials
from ._optimal import normalised_row, checked_inputs, distinct_rows, host_laws, optimal


def _distinct_normalised(p: np.ndarray, q: np.ndarray):
    """``(inverse, rows)``: each row's index into ``rows``, the distinct (target, draft) pairs normalised in
    float64 as :func:`otm.laws.check_law` does (rows of equal laws share one set-up)."""
    first, inverse = distinct_rows(p, q)
    return inverse, [(normalised_row(p[r])[0], normalised_row(q[r])[0]) for r in first]


def _setups(p: np.ndarray, q: np.ndarray, d: np.ndarray):
    """Per row: ``(p64, q64)`` float64 ``[batch, V]`` normalised as :func:`otm.laws.check_law` does,
    ``rho``, ``trials`` (E[N_rho]) and ``rest`` (draft mass outside the row's drafts) ``[batch]``."""
    batch, k = d.shape
    inverse, rows = _distinct_normalised(p, q)
    rules = [_np_kw._build(pr, qr, k) for pr, qr in rows]
    p64 = np.stack([rows[i][0] for i in inverse])
    q64 = np.stack([rows[i][1] for i in inverse])
    rho = np.array([rules[i].rho for i in inverse])
    trials = np.array([rules[i].trials.value for i in inverse])
    rest = np.array([mass_outside(q64[r], d[r]) for r in range(batch)])
    return p64, q64, rho, trials, rest


def device_laws(target: torch.Tensor, draft: torch.Tensor):
    """``(p, q)`` float64 ``[batch, V]`` on the input's device, each row divided by its float64 sum (as
    :func:`otm.laws.check_law` does; the sums are torch's, so the last bits may differ from numpy's)."""
    p, q = target.to(torch.float64), draft.to(torch.float64)
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def mass_outside_rows(q: torch.Tensor, q_d: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """:func:`otm.verifiers.embedding.mass_outside` row by row, without a branch on values: ``q.sum - q(S)``,
    or where that is below 1e-3 the sum of q with the drafts zeroed (no cancellation); at least 0."""
    rest = q.sum(-1) - q_d.sum(-1)  # [batch]
    exact = q.scatter(1, d, 0.0).sum(-1)
    return torch.where(rest < 1e-3, exact, rest).clamp(min=0.0)


def _device_setups(target, draft, d, k):
    """The sync-free set-up (:mod:`otm.torch._wor_trials`): ``(p, q, rho, trials, rest)`` on the device."""
    p, q = device_laws(target, draft)
    r = _trials.root(p, q, k)
    return p, q, r.rho, r.trials, mass_outside_rows(q, q.gather(1, d), d)


def kseq_without_replacement(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None,
                             validate=True) -> Verified:
    r"""K-SEQ's test over the i.i.d. arrivals embedded in drafts drawn without replacement (module doc).

    Twin of :func:`otm.verifiers.kseq_without_replacement.sample`; drafts distinct in every row
    (``sample_without_replacement``), any k >= 1 and V.

    Parameters
    ----------
    target, draft : Tensor [batch, V]
    drafts : Tensor [batch, k] int64, drawn without replacement from ``draft``
    uniforms : Tensor [batch, 2k], optional
        ``2m``: test of draft m; ``2m + 1``: the repeat phase after it; ``2k - 1``: the residual draw.
    generator : torch.Generator, optional
    compute_dtype : torch.float32 or torch.float64, optional
        Accepted for the common signature and checked; the set-up and the decisions are float64.
    validate : bool
        Check values (one device sync); shapes, dtypes and devices are always checked.
    """
    d = checked_inputs(target, draft, drafts, compute_dtype, validate)
    batch, k = d.shape
    if validate:
        check_distinct(d, "kseq_without_replacement")
    u = uniforms_for(uniforms, batch, 2 * k, target.device, generator, validate)  # [batch, 2k]
    device = target.device
    if _rho.on_host(device):
        p_in, q_in = host_laws(target, draft)
        p64, q64, rho, trials, rest = (torch.from_numpy(a).to(device) for a in _setups(p_in, q_in, d.cpu().numpy()))
    else:
        p64, q64, rho, trials, rest = _device_setups(target, draft, d, k)
    p, q = p64, q64  # [batch, V] float64
    rho_t, trials_t = rho.unsqueeze(1), trials.unsqueeze(1)  # [batch, 1]
    q_d = q.gather(1, d)  # [batch, k]
    b = torch.minimum(q_d, p.gather(1, d) / rho_t)  # accepted-arrival rates at the drafts
    # avail[:, m] = 1 - q(A_m) = rest + q(s_{m+1}) + ... + q(s_k), as the numpy walk forms it
    avail = rest.unsqueeze(1) + q_d.flip(1).cumsum(1).flip(1)  # [batch, k]
    index = torch.full((batch,), NOT_ACCEPTED, dtype=torch.int64, device=device)
    open_ = torch.ones(batch, dtype=torch.bool, device=device)  # no acceptance yet
    for m in range(k):
        hit = open_ & accept_test(u[:, 2 * m], b[:, m], q_d[:, m])  # u q < min(q, p/rho)
        index = torch.where(hit, torch.full_like(index, m), index)
        open_ = open_ & ~hit
        if m == k - 1:
            break
        w = torch.cat([b[:, : m + 1], avail[:, m + 1 : m + 2]], dim=1)  # [batch, m + 2]
        t = u[:, 2 * m + 1] * w.sum(-1)
        j = (w.cumsum(-1) <= t.unsqueeze(1)).sum(-1)  # searchsorted(cumsum, t, side="right")
        rep = open_ & (j <= m)
        index = torch.where(rep, j, index)
        open_ = open_ & ~rep
    y_acc = d.gather(1, index.clamp(min=0).unsqueeze(1)).squeeze(1)
    residual = torch.where(p < rho_t * q, p * (1.0 - trials_t / rho_t), p - q * trials_t).to(DECISION_DTYPE)
    z = residual_draw(residual, p.clone(), u[:, 2 * k - 1])  # [batch]
    z_hit = d == z.unsqueeze(1)
    z_index = torch.where(z_hit.any(-1), z_hit.to(torch.uint8).argmax(-1), torch.full_like(index, NOT_ACCEPTED))
    accepted = ~open_
    return Verified(torch.where(accepted, y_acc, z), torch.where(accepted, index, z_index))


def embedded_walk(q: torch.Tensor, d: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The walk of repeats (:func:`otm.verifiers.optimal_embedded.sample_rows`' first loop) in torch, fixed
    shapes and no value read back: ``path [batch, k]`` int64, the embedded i.i.d. draws as indices into the
    drafts ``d [batch, k]`` (``path[:, 0] = 0``), from the float64 normalised draft ``q [batch, V]`` and the
    walk's uniforms ``u [batch, k - 1]``. Step i (i = 1..k-1), with m drafts seen: the next arrival is the
    seen draft j (``cq_j <= t < cq_{j+1}``) or the next new draft (j = m), ``t = u_{i-1} (q(A_m) + 1 - q(A_m))``
    as numpy forms it (``q(A_m)`` a cumulative sum, ``1 - q(A_m)`` the unseen mass)."""
    batch, k = d.shape
    q_s = q.gather(1, d)  # [batch, k]
    avail = mass_outside_rows(q, q_s, d).unsqueeze(1) + q_s.flip(1).cumsum(1).flip(1)  # [batch, k]
    cq = q_s.cumsum(1)
    cols = torch.arange(k, device=d.device)
    m = torch.ones(batch, 1, dtype=torch.int64, device=d.device)
    steps = [torch.zeros(batch, dtype=torch.int64, device=d.device)]
    for i in range(1, k):
        t = u[:, i - 1 : i] * (cq.gather(1, m - 1) + avail.gather(1, m.clamp(max=k - 1)))  # [batch, 1]
        j = ((cq <= t) & (cols < m)).sum(1)  # [batch]
        steps.append(j)
        m = m + (j.unsqueeze(1) == m).to(torch.int64)
    return torch.stack(steps, dim=1)


def _embedded_on_device(target, draft, d, u, compute_dtype) -> Verified:
    """The walk in torch, then the iid ``optimal`` on the embedded draws (uniforms ``k-1..2k``: its race,
    accept test, residual draw); the index is the token's position among the drafts (they are distinct, so
    it names the selected draft after an acceptance, and the first equal draft after a rejection)."""
    k = d.shape[1]
    _, q = device_laws(target, draft)
    x = d.gather(1, embedded_walk(q, d, u[:, : k - 1]))  # [batch, k]: the embedded i.i.d. draws
    # the laws, drafts and uniforms were checked by the caller (validate): x is made of valid drafts
    out = optimal(target, draft, x, uniforms=u[:, k - 1 :], compute_dtype=compute_dtype, validate=False)
    hit = d == out.token.unsqueeze(1)
    index = torch.where(hit.any(-1), hit.to(torch.uint8).argmax(-1), torch.full_like(out.token, NOT_ACCEPTED))
    return Verified(out.token, index)


def optimal_embedded(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None,
                     validate=True) -> Verified:
    r"""The iid ``optimal`` rule on the i.i.d. draws embedded in drafts drawn without replacement (module doc).

    Twin of :func:`otm.verifiers.optimal_embedded.sample`; drafts distinct in every row, any k >= 1, V.

    Parameters
    ----------
    target, draft : Tensor [batch, V]
    drafts : Tensor [batch, k] int64, drawn without replacement from ``draft``
    uniforms : Tensor [batch, 2k + 1], optional
        ``0..k-2``: the walk; ``k-1..2k-2``: the race passes; ``2k - 1``: accept test; ``2k``: residual draw.
    generator : torch.Generator, optional
    compute_dtype : torch.float32 or torch.float64, optional
        Accepted for the common signature and checked; the set-up and the decisions are float64.
    validate : bool
        Check values (one device sync); shapes, dtypes and devices are always checked.
    """
    d = checked_inputs(target, draft, drafts, compute_dtype, validate)
    batch, k = d.shape
    if validate:
        check_distinct(d, "optimal_embedded")
    u = uniforms_for(uniforms, batch, 2 * k + 1, target.device, generator, validate)
    if not _rho.on_host(target.device):
        return _embedded_on_device(target, draft, d, u, compute_dtype)
    u = u.cpu().numpy()
    p_in, q_in = host_laws(target, draft)
    d_np = d.cpu().numpy()
    inverse, rows = _distinct_normalised(p_in, q_in)
    rules = [_np_oe.rule(pr, qr, k) for pr, qr in rows]
    token = np.empty(batch, dtype=np.int64)
    accepted = np.empty(batch, dtype=np.int64)
    for i, rl in enumerate(rules):  # the rows sharing a rule at once: the numpy sampler's operations, vectorised
        at = np.flatnonzero(inverse == i)
        tok, acc = _np_oe.sample_rows(rl, rows[i][0], rows[i][1], d_np[at], u[at])
        token[at] = tok
        accepted[at] = np.where(acc < 0, NOT_ACCEPTED, acc)
    device = target.device
    return Verified(torch.from_numpy(token).to(device), torch.from_numpy(accepted).to(device))


__all__ = ["kseq_without_replacement", "optimal_embedded"]
