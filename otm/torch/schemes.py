r"""Batched draft samplers: ``drafts [batch, k]`` with the law of each numpy scheme.

Each sampler takes ``draft [batch, V]`` (:math:`q`, any floating dtype, upcast and
renormalised as in :mod:`otm.torch.verifiers`) and returns int64 token ids whose
law per row is the ``enumerate()`` law of the scheme of the same name in
:mod:`otm.schemes`:

* :func:`sample_iid`: k independent inverse-CDF draws (``uniforms [batch, k]``,
  one per draft in order, as ``IID.sample`` consumes ``rng.random()``);
* :func:`sample_without_replacement`: Gumbel-top-k in its exponential-race form,
  the k smallest :math:`E_x / q(x)` in increasing order with :math:`E_x \sim
  \mathrm{Exp}(1)` drawn in float64 (float32 noise truncates the race below
  2^-24 and under-samples tail tokens: vLLM #43150). Increasing order of the
  keys is the order of successive sampling without replacement;
* :func:`sample_greedy`: the top k-1 tokens of :math:`q` (ties to the lower
  index, ascending token ids, like ``Greedy.fixed``) then one inverse-CDF draw
  from :math:`q` restricted to the other tokens (``uniforms [batch, 1]``);
* :func:`sample_spechub`: :math:`x_1 \sim q` with uniform 0; :math:`x_2` = the
  hub :math:`\arg\max q` if :math:`x_1 \ne` hub, else a draw from :math:`q`
  without the hub with uniform 1 (``uniforms [batch, 2]``).

>>> import torch
>>> draft = torch.tensor([[0.1, 0.4, 0.4, 0.1]])
>>> top_tokens(draft, 2)
tensor([[1, 2]])
>>> sample_greedy(draft, 3, uniforms=torch.tensor([[0.75]], dtype=torch.float64))
tensor([[1, 2, 3]])
"""

from __future__ import annotations

import torch

from ._core import (
    DECISION_DTYPE,
    fail,
    categorical,
    check_law_tensor,
    check_law_values,
    compute_dtype_for,
    normalised,
    uniforms_for,
)


def _prepare(draft, k, compute_dtype, validate, *, min_support: int = 1):
    check_law_tensor(draft, "draft")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        fail(f"k must be a whole number >= 1, got {k!r}")
    if validate:
        check_law_values(draft, "draft")
        if min_support > 1:
            support = (draft > 0).sum(-1)  # [batch]
            if bool((support < min_support).any()):
                row = int(support.argmin())
                fail(
                    f"draft row {row} has {int(support[row])} tokens with positive mass, the scheme needs "
                    f"at least {min_support}: lower k or use the iid scheme"
                )
    return normalised(draft, compute_dtype_for(draft, compute_dtype=compute_dtype))


def top_tokens(draft: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m`` largest tokens of each row, ties to the lower index, in ascending token order ``[batch, m]``.

    Equals ``np.sort(np.argsort(-row, kind="stable")[:m])``, the fixed drafts of
    :class:`otm.schemes.Greedy`, without a full sort: the m-th largest value ``t``
    is found by ``topk``, every token above ``t`` is taken, and the ties at ``t``
    are filled in index order.
    """
    batch, V = draft.shape
    if m == 0:
        return torch.empty((batch, 0), dtype=torch.int64, device=draft.device)
    t = draft.topk(m, -1).values[:, -1:]  # [batch, 1]: m-th largest value
    above = draft > t  # [batch, V]
    tied = draft == t  # [batch, V]
    need = m - above.sum(-1, keepdim=True)  # [batch, 1]: ties to take
    chosen = above | (tied & (tied.cumsum(-1) <= need))  # [batch, V], m per row
    ids = torch.arange(V, device=draft.device)  # [V]
    key = torch.where(chosen, -ids, -V)  # [batch, V]: larger key = smaller id
    return key.topk(m, -1).indices.sort(-1).values


def sample_iid(draft, k: int, *, generator=None, uniforms=None, compute_dtype=None, validate=True) -> torch.Tensor:
    """k i.i.d. draws per row by inverse CDF: ``[batch, k]`` int64 (``uniforms [batch, k]``)."""
    q = _prepare(draft, k, compute_dtype, validate)
    u = uniforms_for(uniforms, q.shape[0], k, q.device, generator, validate)  # [batch, k]
    return categorical(q, u)


def sample_without_replacement(draft, k: int, *, generator=None, exponentials=None, validate=True) -> torch.Tensor:
    """Successive sampling without replacement by exponential race (Gumbel-top-k): ``[batch, k]`` int64.

    ``exponentials [batch, V]`` (float64 Exp(1) noise) may be given; otherwise it is
    drawn from ``generator``. Needs k tokens of positive mass per row (checked
    when ``validate``; otherwise such rows get zero-mass tokens).
    """
    q = _prepare(draft, k, torch.float64, validate, min_support=k)  # float64: the race is decided in float64
    if exponentials is None:
        e = torch.empty_like(q).exponential_(generator=generator)  # [batch, V]
    else:
        if not isinstance(exponentials, torch.Tensor) or tuple(exponentials.shape) != tuple(q.shape):
            fail(f"exponentials must be a tensor of shape {tuple(q.shape)} (one Exp(1) per token)")
        e = exponentials.to(device=q.device, dtype=DECISION_DTYPE)
    keys = torch.where(q > 0, e / q, torch.full_like(q, torch.inf))  # [batch, V]: arrival time of each token
    return keys.topk(k, -1, largest=False, sorted=True).indices


def sample_greedy(draft, k: int, *, generator=None, uniforms=None, compute_dtype=None, validate=True) -> torch.Tensor:
    """Hu et al.'s greedy drafts: top k-1 tokens (ascending ids), then one draw outside them: ``[batch, k]``."""
    q = _prepare(draft, k, compute_dtype, validate)
    if k > q.shape[1]:
        fail(f"greedy needs k <= V, got k={k} and V={q.shape[1]}")
    fixed = top_tokens(q, k - 1)  # [batch, k-1]
    rest = q.scatter(1, fixed, 0.0)  # [batch, V]
    if validate and bool((rest.sum(-1) <= 0).any()):
        fail(f"greedy with k={k} needs positive draft mass outside the top {k - 1} tokens in every row: lower k")
    u = uniforms_for(uniforms, q.shape[0], 1, q.device, generator, validate)  # [batch, 1]
    return torch.cat([fixed, categorical(rest, u)], dim=1)


def sample_spechub(draft, k: int = 2, *, generator=None, uniforms=None, compute_dtype=None, validate=True) -> torch.Tensor:
    """SpecHub's pair ``(x1, x2)`` per row: ``[batch, 2]`` int64 (``uniforms [batch, 2]``)."""
    if k != 2:
        fail(f"the spechub scheme has exactly k=2 drafts, got k={k}")
    q = _prepare(draft, k, compute_dtype, validate, min_support=2)
    u = uniforms_for(uniforms, q.shape[0], 2, q.device, generator, validate)  # [batch, 2]
    hub = q.argmax(-1, keepdim=True)  # [batch, 1]: first maximum
    x1 = categorical(q, u[:, :1])  # [batch, 1]
    other = categorical(q.scatter(1, hub, 0.0), u[:, 1:])  # [batch, 1]: used only where x1 is the hub
    x2 = torch.where(x1 == hub, other, hub)
    return torch.cat([x1, x2], dim=1)


def sample_top(draft, k: int, *, generator=None, uniforms=None, compute_dtype=None, validate=True) -> torch.Tensor:
    """The k most probable tokens per row, decreasing draft probability, ties to the lower index
    ``[batch, k]`` (deterministic: ``generator`` and ``uniforms`` are not used); twin of
    :class:`otm.schemes.Top`."""
    q = _prepare(draft, k, compute_dtype, validate, min_support=k)
    return q.sort(dim=-1, descending=True, stable=True).indices[:, :k].contiguous()  # [batch, k]


SAMPLERS = {
    "iid": sample_iid,
    "without_replacement": sample_without_replacement,
    "greedy": sample_greedy,
    "spechub": sample_spechub,
    "top": sample_top,
}
"""Scheme name (as in :mod:`otm.schemes`) -> batched sampler ``f(draft, k, generator=...)``."""


def sample_drafts(scheme: str, draft, k: int, *, generator=None, validate=True) -> torch.Tensor:
    """``drafts [batch, k]`` from the scheme named ``scheme``."""
    if scheme not in SAMPLERS:
        fail(f"unknown scheme {scheme!r}: choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[scheme](draft, k, generator=generator, validate=validate)


__all__ = [
    "SAMPLERS",
    "sample_drafts",
    "sample_iid",
    "sample_without_replacement",
    "sample_greedy",
    "sample_spechub",
    "sample_top",
    "top_tokens",
]
