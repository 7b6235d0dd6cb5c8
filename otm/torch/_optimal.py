r"""Batched torch twin of :mod:`otm.verifiers.optimal` (select one draft by a race, then single-draft SD).

For k i.i.d. drafts per row: (1) a race selects one drafted position, whose token has the
exactly known selection law :math:`x` of the row's plan; (2) single-draft speculative
sampling from :math:`x` to the target :math:`p`: accept the selected token :math:`y` when
``u * x(y) < p(y)`` (so a token of zero target mass is never accepted), else draw from
:math:`\mathrm{norm}((p - x)_+)`. The output law is exactly :math:`p` for every row, as for
the numpy rule (see that module for the selection law and its gap to :math:`\alpha^*`).

Where the work runs. **On the CPU the set-up is numpy, one row at a time** (this module; below). **Off the
CPU** (or with ``otm.torch._rho.FORCE_DEVICE_PATH``, as :func:`otm.torch._rho.on_host` decides for every
verifier) the call goes to :mod:`otm.torch._optimal_device`: a set-up on the input's device with fixed
ratio groups and fixed shapes that reads nothing back and copies no host tensor in (with ``validate=False``
and the uniforms given: it traces with ``torch.compile(fullgraph=True)``; CUDA-graph capture is what this
allows, not run on a GPU here), the same uniform layout and an exact law, its acceptance
within a measured gap of this path's (``docs/torch_verifiers.md``, "Device syncs"); its tokens for the same
uniforms may differ from this path's (other groups, other race keys).

On the CPU each row's laws are
read on the CPU (float32 or float64 as given; half precisions upcast to float32, exactly),
upcast to float64 and divided by their float64 sums as :func:`otm.laws.check_law` does (the
same numbers as the numpy door for float64 laws; unlike the other torch verifiers, no float32
normalisation first), row by row while the row is in cache, and given to the grouped rule of
:func:`otm.verifiers.optimal.rule` (ratio groups from the floats' bits, no sort over the
vocabulary; the layered two-pass race over the groups), evaluated lazily: at the k drafted
tokens, and for the rows that reject a draw from their residual (group first, then a token of
that group: one pass over the sub-bucket ids, not the O(V) residual). Rows with
equal laws within one call share one set-up. The race and the accept test are float64
comparisons on the set-up's arrays: in numpy (:data:`HOST_DECISIONS`), or batched torch ops, the
same comparisons either way; the residual draw is the rule's own
(:meth:`otm.verifiers.optimal.GroupedRule.draw_residual`, on the host), and the target's float64 inverse
CDF of :mod:`otm.torch._core` only where a residual has no mass. Measured times beside
:func:`otm.torch.kseq`: ``docs/torch_verifiers.md``.

Uniforms. Each row uses ``k + 2`` uniforms in [0, 1): uniform ``i < k`` decides the pass
of draft position ``i`` (pass 1 iff ``u_i < theta(d_i)``), uniform ``k`` the accept test,
uniform ``k + 1`` the residual draw (inverse CDF over the groups' residual masses, then inside
the group; :meth:`otm.verifiers.optimal.GroupedRule.draw_residual`). The numpy ``sample`` consumes
``rng.random(k)`` then ``rng.random()`` twice (the second only on rejection) in the same
order, so the same numbers give the same token and index (float64: bit-identical
decisions; the plans are the same numpy computation).

``accepted`` is the index of the selected draft when it is accepted; after a rejection it
is the index of the first draft equal to the residual token, or
:data:`~otm.torch.NOT_ACCEPTED` (numpy: ``Outcome.accepted``, same meaning).

>>> import torch
>>> target = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
>>> draft = torch.tensor([[0.2, 0.2, 0.6]], dtype=torch.float64)
>>> u = torch.tensor([[0.5, 0.5, 0.1, 0.5]], dtype=torch.float64)
>>> optimal(target, draft, torch.tensor([[2, 0]]), uniforms=u)
Verified(token=tensor([0]), accepted=tensor([1]))
"""

from __future__ import annotations

import numpy as np
import torch

from ..verifiers import optimal as _np_optimal
from ..verifiers.optimal import Scaled
from . import _rho
from ._core import (
    NOT_ACCEPTED,
    Verified,
    accept_test,
    check_draft_values,
    check_drafts,
    check_law_tensor,
    check_law_values,
    categorical,
    compute_dtype_for,
    uniforms_for,
)
from ._optimal_device import optimal_on_device


def _row_steps(p_row: np.ndarray, q_row: np.ndarray, k: int):
    """The numpy rule's steps for one row, normalising the row when its first step runs.

    Each row (float32 or float64, as given) is divided by its float64 sum, as
    :func:`otm.laws.check_law` does (``law / law.sum()``; the same numbers for a float64 row);
    the normalised copies live only while the row's O(V) work (ratio groups, group sums) runs,
    in the core's cache, and the rule keeps the raw row and its sum (:class:`Scaled`)."""
    p, pl = normalised_row(p_row)
    q, ql = normalised_row(q_row)
    steps = _np_optimal.rule_steps(p, q, k, None, (pl, ql))
    del p, q  # the steps drop them once the O(V) work is done
    return (yield from steps)


def normalised_row(row: np.ndarray):
    """``(row / total, Scaled(row, total))``: the row divided by its float64 sum, and the same kept lazily."""
    if row.dtype == np.float64:
        total = float(row.sum())
        return row / total, Scaled(row, total)
    out = row.astype(np.float64)  # exact
    total = float(out.sum())
    out /= total
    return out, Scaled(row, total)


def checked_inputs(target, draft, drafts, compute_dtype, validate) -> torch.Tensor:
    """The checks of a verifier whose set-up runs in numpy float64 (``compute_dtype`` is checked, not
    used); returns ``drafts`` as int64 ``[batch, k]``."""
    check_law_tensor(target, "target")
    check_law_tensor(draft, "draft", shape=target.shape, device=target.device)
    d = check_drafts(drafts, target.shape[0], target.device)
    compute_dtype_for(target, draft, compute_dtype=compute_dtype)
    if validate:
        check_law_values(target, "target")
        check_law_values(draft, "draft")
        check_draft_values(d, draft)
    return d


def host_laws(target: torch.Tensor, draft: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The two laws as numpy arrays on the CPU for a numpy set-up: float64 when either is float64, else
    float32 (each row is upcast exactly and normalised in float64 later, as :func:`otm.laws.check_law`
    does); no copy for CPU float32/float64 tensors."""
    host = torch.float64 if target.dtype == torch.float64 or draft.dtype == torch.float64 else torch.float32
    p, q = (law.to(host).cpu().numpy() for law in (target, draft))
    return p, q


def distinct_rows(p: np.ndarray, q: np.ndarray) -> tuple[list[int], np.ndarray]:
    """``(first, inverse)``: the first row of each distinct (target, draft) pair, and each row's pair
    index (a fingerprint of every 97th mass, then a full comparison), so equal rows share one set-up."""
    batch = p.shape[0]
    if batch > 1 and bool((p[:, ::97] == p[:1, ::97]).all()) and bool((p == p[:1]).all() and (q == q[:1]).all()):
        return [0], np.zeros(batch, dtype=np.int64)
    seen: dict = {}
    first, inverse = [], np.empty(batch, dtype=np.int64)
    for r in range(batch):
        bucket = seen.setdefault((p[r, ::97].tobytes(), q[r, ::97].tobytes()), [])
        for j in bucket:
            if np.array_equal(p[r], p[first[j]]) and np.array_equal(q[r], q[first[j]]):
                inverse[r] = j
                break
        else:
            bucket.append(len(first))
            inverse[r] = len(first)
            first.append(r)
    return first, inverse


def _plans(p: np.ndarray, q: np.ndarray, d: np.ndarray, k: int):
    """Numpy set-up per distinct row, as the numpy ``sample`` does it, evaluated lazily.

    ``p``, ``q`` float32 or float64 ``[batch, V]`` as given (rows summing to 1 up to rounding;
    each is normalised in float64 as :func:`otm.laws.check_law` does), ``d [batch, k]``.
    Returns ``(theta_d, key1_d, key2_d, target_d, x_d, draws, targets)``: the race arrays, the
    target (as :func:`otm.laws.check_law` normalises it) and the selection law at the drafted
    tokens, ``[batch, k]``; ``draws(rows, us)`` gives one draw from ``norm((target - x)_+)`` per row
    that needs one, with its uniform (:meth:`~otm.verifiers.optimal.GroupedRule.draw_residual`: group, then
    token; None where the residual has no mass); ``targets(rows)`` the normalised targets (read only
    where a residual has no mass).
    Rows with equal laws share one rule.
    """
    batch = p.shape[0]
    theta_d = np.empty((batch, k))
    key1_d = np.empty((batch, k), dtype=np.int64)
    key2_d = np.empty((batch, k), dtype=np.int64)
    target_d = np.empty((batch, k))
    x_d = np.empty((batch, k))
    first, inverse = distinct_rows(p, q)
    # one row at a time up to the group layouts, which are solved for all rows together
    distinct = _np_optimal.drive_rules([_row_steps(p[r], q[r], k) for r in first], k)
    rules = [distinct[i] for i in inverse]
    for j, rl in enumerate(distinct):  # the rows sharing a rule at once (elementwise: the same numbers)
        rows = np.flatnonzero(inverse == j)
        toks = d[rows].ravel()
        theta, key1, key2, x = rl.at(toks)
        theta_d[rows], key1_d[rows], key2_d[rows] = theta.reshape(-1, k), key1.reshape(-1, k), key2.reshape(-1, k)
        x_d[rows], target_d[rows] = x.reshape(-1, k), rl.target_law.at(toks).reshape(-1, k)

    def draws(rows, us):
        rows, us = np.asarray(rows, dtype=np.int64), np.asarray(us, dtype=np.float64)
        out: list[int | None] = [None] * rows.size
        which = inverse[rows]
        for j in np.unique(which):
            at = np.flatnonzero(which == j)
            for i, tok in zip(at, distinct[j].draw_residual_many(us[at])):
                out[i] = tok
        return out

    def targets(rows):
        return np.stack([rules[r].target for r in rows])

    return theta_d, key1_d, key2_d, target_d, x_d, draws, targets


def optimal(target, draft, drafts, *, uniforms=None, generator=None, compute_dtype=None, validate=True) -> Verified:
    r"""Race selection with a known law :math:`x`, then SD from :math:`x` to the target (module doc).

    Twin of :func:`otm.verifiers.optimal.sample`; valid for i.i.d. drafts (``sample_iid``),
    any k >= 1 (k = 1 is single-draft speculative sampling) and any V.

    Parameters
    ----------
    target, draft : Tensor [batch, V]
    drafts : Tensor [batch, k] int64, i.i.d. from ``draft``
    uniforms : Tensor [batch, k + 2], optional
        Uniforms 0..k-1: pass of each draft position; k: accept test; k + 1: residual draw.
    generator : torch.Generator, optional
    compute_dtype : torch.float32 or torch.float64, optional
        Accepted for the common signature and checked; the laws are normalised and the set-up run
        in float64 (numpy on the CPU, torch on other devices) whatever it is.
    validate : bool
        Check values (one device sync); shapes, dtypes and devices are always checked. Off the CPU,
        ``validate=False`` with the uniforms given reads nothing back (:mod:`otm.torch._optimal_device`).
    """
    d = checked_inputs(target, draft, drafts, compute_dtype, validate)
    batch, k = d.shape
    u = uniforms_for(uniforms, batch, k + 2, target.device, generator, validate)  # [batch, k + 2]
    device = target.device
    if not _rho.on_host(device):  # off the CPU (or forced): the sync-free set-up, race and draw on the device
        return optimal_on_device(target, draft, d, u)
    # numpy set-up per distinct row, float64 on the CPU: each row upcast (exactly) and normalised in
    # float64 as the numpy sample does (float64 laws: the same numbers), one row at a time
    p_in, q_in = host_laws(target, draft)
    theta_d, key1_d, key2_d, p_d, x_d, draws, targets = _plans(p_in, q_in, d.cpu().numpy(), k)
    if HOST_DECISIONS:
        return _decide_on_host(u.numpy(), d.numpy(), k, theta_d, key1_d, key2_d, p_d, x_d, draws, targets)
    theta = torch.from_numpy(theta_d).to(device)  # [batch, k]
    # batched race: pass 1 iff u_i < theta(d_i); the smallest key wins (first position on ties)
    keys = torch.where(u[:, :k] < theta, torch.from_numpy(key1_d).to(device), torch.from_numpy(key2_d).to(device))
    index = keys.argmin(-1)  # [batch]
    y = d.gather(1, index.unsqueeze(1)).squeeze(1)  # [batch]
    at = index.unsqueeze(1)
    p_y = torch.from_numpy(p_d).to(device).gather(1, at).squeeze(1)  # [batch] float64
    x_y = torch.from_numpy(x_d).to(device).gather(1, at).squeeze(1)  # [batch] float64: selection law at y
    ok = accept_test(u[:, k], p_y, x_y)  # [batch]
    z = y.clone()
    rows = torch.nonzero(~ok).squeeze(1)  # [rejected]: only these need a draw from (p - x)_+
    if rows.numel():
        rows_ = rows.cpu().tolist()
        got = draws(rows_, u[rows, k + 1].to(torch.float64).cpu().tolist())  # group, then token (host)
        none = [i for i, g in enumerate(got) if g is None]  # no residual mass (probability 0 exactly)
        zr = torch.tensor([NOT_ACCEPTED if g is None else g for g in got], dtype=torch.int64, device=device)
        if none:  # draw from the target there with the same uniform, as residual_draw does
            tgt = torch.from_numpy(targets([rows_[i] for i in none])).to(device)
            at_none = rows[torch.tensor(none, device=device)]
            zr[torch.tensor(none, device=device)] = categorical(tgt, u[at_none, k + 1].unsqueeze(1)).squeeze(1)
        z[rows] = zr
    hit = d == z.unsqueeze(1)  # [batch, k]
    z_index = torch.where(hit.any(-1), hit.to(torch.uint8).argmax(-1), torch.full_like(index, NOT_ACCEPTED))
    token = torch.where(ok, y, z)
    accepted = torch.where(ok, index, z_index)
    return Verified(token, accepted)


HOST_DECISIONS = True
"""The race, the accept test and the residual draw of the host path run in numpy on the set-up's arrays
(:func:`_decide_on_host`: the same float64 comparisons as the torch ops above, so the same tokens and
indices for the same uniforms); about 0.3 ms of some twenty small torch calls less per call, which is
most of the difference at batch 1. With this False (the tests keep that path covered) they are the torch
ops above. Off the CPU neither runs: the device path does (:mod:`otm.torch._optimal_device`)."""


def _decide_on_host(u, d, k, theta_d, key1_d, key2_d, p_d, x_d, draws, targets) -> Verified:
    """The decisions of :func:`optimal` in numpy (float64 ``u [batch, k + 2]``, ``d [batch, k]``)."""
    batch = d.shape[0]
    r = np.arange(batch)
    index = np.where(u[:, :k] < theta_d, key1_d, key2_d).argmin(-1)  # [batch]: smallest key, first on ties
    y = d[r, index]
    ok = u[:, k] * x_d[r, index] < p_d[r, index]  # accept_test: u * x(y) < p(y)
    z = y.copy()
    rows = np.flatnonzero(~ok)
    if rows.size:
        got = draws(rows.tolist(), u[rows, k + 1].tolist())  # group, then token
        none = [i for i, g in enumerate(got) if g is None]  # no residual mass (probability 0 exactly)
        z[rows] = [NOT_ACCEPTED if g is None else g for g in got]
        if none:  # draw from the target with the same uniform, as the torch path does
            at = rows[none]
            tgt = torch.from_numpy(targets(at.tolist()))
            z[at] = categorical(tgt, torch.from_numpy(u[at, k + 1 : k + 2])).squeeze(1).numpy()
    hit = d == z[:, None]  # [batch, k]
    z_index = np.where(hit.any(-1), hit.argmax(-1), NOT_ACCEPTED)
    token = np.where(ok, y, z)
    accepted = np.where(ok, index, z_index)
    return Verified(torch.from_numpy(token.astype(np.int64)), torch.from_numpy(accepted.astype(np.int64)))


__all__ = ["optimal"]
