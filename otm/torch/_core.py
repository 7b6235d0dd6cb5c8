"""What the batched torch verifiers and samplers share: entry checks, uniforms, draws.

Shapes: ``batch`` rows, ``V`` tokens, ``k`` drafts. Laws are ``[batch, V]``
tensors of any floating dtype; they are upcast to the *compute dtype*
(float32, or float64 when an input is float64 or when asked) and divided by
their row sums, as :func:`otm.laws.check_law` does for the numpy path.
Quantities that decide a draw (accept tests, rho*, inverse-CDF sums) are
float64 whatever the compute dtype, so tails are not truncated (the float32
noise bug of vLLM #43150 has an inverse-CDF twin: a float32 CDF absorbs masses
below 6e-8 of the running total).

Every check on shapes, dtypes and devices runs on entry and costs no device
synchronisation. Checks on values (finite, non-negative, normalised, draft
tokens in range and drawn with positive draft mass, uniforms in [0, 1)) need
one; they run when ``validate=True`` (the default).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..laws import OtmError

NOT_ACCEPTED = -1
"""``accepted`` for a row whose token is not one of its drafts (numpy: ``None``)."""

LAW_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
COMPUTE_DTYPES = (torch.float32, torch.float64)
DECISION_DTYPE = torch.float64
"""dtype of uniforms, accept tests, CDFs and rho*."""

SUM_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
"""Largest accepted ``|row sum - 1|`` per input dtype (``validate=True``); rows are then renormalised.
float64 matches :data:`otm.laws.SUM_TOLERANCE`; half precisions round each mass by up to 2^-9 (bf16)
or 2^-11 (fp16), and float32 laws are often such values upcast."""


class Verified(NamedTuple):
    """The result of a batched verification (unpacks as ``token, accepted``)."""

    token: torch.Tensor  # [batch] int64: the output token of each row
    accepted: torch.Tensor  # [batch] int64: index into drafts of the matched draft, or NOT_ACCEPTED


def fail(message: str):
    raise OtmError(message)


def check_law_tensor(law, name: str, *, shape=None, device=None) -> None:
    """Shape/dtype/device checks of a ``[batch, V]`` law tensor (no synchronisation)."""
    if not isinstance(law, torch.Tensor):
        fail(f"{name} must be a torch.Tensor of shape [batch, V], got {type(law).__name__}")
    if law.ndim != 2 or law.shape[0] == 0 or law.shape[1] == 0:
        fail(f"{name} must have shape [batch, V] with batch, V >= 1, got {tuple(law.shape)}")
    if law.dtype not in LAW_DTYPES:
        fail(f"{name} must be float16, bfloat16, float32 or float64, got {law.dtype}")
    if shape is not None and tuple(law.shape) != tuple(shape):
        fail(f"{name} has shape {tuple(law.shape)} but target has {tuple(shape)}: give laws over the same rows and vocabulary")
    if device is not None and law.device != device:
        fail(f"{name} is on {law.device} but target is on {device}: put all inputs on one device")


def check_law_values(law: torch.Tensor, name: str) -> None:
    """Finite, non-negative, rows summing to 1 within :data:`SUM_TOLERANCE` (one device sync).

    Two reductions per row (sum, minimum): a NaN or infinity makes the row sum
    non-finite. The slow search for the offending entry runs only on failure.
    """
    acc = torch.float32 if law.dtype in (torch.float16, torch.bfloat16) else law.dtype
    total = law.sum(-1, dtype=acc)  # [batch]
    tol = SUM_TOLERANCE[law.dtype]
    bad = ~torch.isfinite(total) | (law.amin(-1) < 0) | ((total.double() - 1.0).abs() > tol)  # [batch]
    if not bool(bad.any()):
        return
    entries = ~torch.isfinite(law) | (law < 0)
    if bool(entries.any()):
        row, col = (int(i) for i in entries.nonzero()[0])
        fail(f"{name}[{row}, {col}] = {law[row, col].item():g}: give finite non-negative probabilities")
    row = int(bad.nonzero()[0, 0])
    fail(f"{name} row {row} sums to {total[row].item():.9g}, not 1 (tolerance {tol:g} for {law.dtype}): normalise it first")


def compute_dtype_for(*tensors, compute_dtype=None) -> torch.dtype:
    if compute_dtype is None:
        return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    if compute_dtype not in COMPUTE_DTYPES:
        fail(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    return compute_dtype


def normalised(law: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``law / law.sum(-1)`` in ``dtype`` (the numpy door divides by the total too)."""
    law = law.to(dtype)
    return law / law.sum(-1, keepdim=True)  # [batch, V]


def check_drafts(drafts, batch: int, device, *, k: int | None = None, name: str = "drafts") -> torch.Tensor:
    """Shape/dtype/device checks of ``drafts [batch, k]``; returns it as int64."""
    if not isinstance(drafts, torch.Tensor):
        fail(f"{name} must be a torch.Tensor of token ids with shape [batch, k], got {type(drafts).__name__}")
    if drafts.ndim != 2 or drafts.shape[1] == 0:
        fail(f"{name} must have shape [batch, k] with k >= 1, got {tuple(drafts.shape)}")
    if drafts.shape[0] != batch:
        fail(f"{name} has {drafts.shape[0]} rows but target has {batch}: give one row of drafts per row of target")
    if drafts.dtype.is_floating_point or drafts.dtype == torch.bool or drafts.dtype.is_complex:
        fail(f"{name} must hold integer token ids (int64), got {drafts.dtype}")
    if drafts.device != device:
        fail(f"{name} is on {drafts.device} but target is on {device}: put all inputs on one device")
    if k is not None and drafts.shape[1] != k:
        fail(f"this verifier takes exactly {k} drafts per row, got {drafts.shape[1]}")
    return drafts.to(torch.int64)


def check_distinct(drafts: torch.Tensor, name: str) -> None:
    """Drafts drawn without replacement: no token twice in a row (synchronises)."""
    if drafts.shape[1] > 1:
        sd = drafts.sort(-1).values
        if bool((sd[:, 1:] == sd[:, :-1]).any()):
            fail(f"{name} needs distinct drafts in every row (drawn without replacement)")


def check_draft_values(drafts: torch.Tensor, draft: torch.Tensor) -> None:
    """Drafts in range and of positive draft mass (synchronises)."""
    V = draft.shape[1]
    out = (drafts < 0) | (drafts >= V)
    if bool(out.any()):
        row, col = (int(i) for i in out.nonzero()[0])
        fail(f"draft tokens must lie in 0..{V - 1}, got {int(drafts[row, col])} at drafts[{row}, {col}]")
    zero = draft.gather(1, drafts) == 0
    if bool(zero.any()):
        row, col = (int(i) for i in zero.nonzero()[0])
        fail(
            f"draft token {int(drafts[row, col])} (drafts[{row}, {col}]) has zero draft probability: "
            "drafts must be drawn from the draft law"
        )


def uniforms_for(uniforms, batch: int, n: int, device, generator, validate: bool, name: str = "uniforms") -> torch.Tensor:
    """``[batch, n]`` float64 uniforms on [0, 1): the given ones, or fresh from ``generator``."""
    if uniforms is None:
        return torch.rand((batch, n), dtype=DECISION_DTYPE, device=device, generator=generator)  # [batch, n]
    if not isinstance(uniforms, torch.Tensor) or not uniforms.dtype.is_floating_point:
        fail(f"{name} must be a floating torch.Tensor of shape [batch, {n}]")
    if tuple(uniforms.shape) != (batch, n):
        fail(f"{name} must have shape [batch, {n}] = [{batch}, {n}], got {tuple(uniforms.shape)}")
    if uniforms.device != device:
        fail(f"{name} is on {uniforms.device} but target is on {device}: put all inputs on one device")
    u = uniforms.to(DECISION_DTYPE)
    if validate and bool(((u < 0) | (u >= 1) | torch.isnan(u)).any()):
        fail(f"{name} must lie in [0, 1)")
    return u


def accept_test(u: torch.Tensor, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """True with probability ``min(1, num / den)``: ``u * den < num`` with u in [0, 1).

    A token of zero numerator (zero target mass) is never accepted, even for u = 0
    (SGLang #35771; the ``u <= ratio`` form of vLLM, HF, gpt-fast accepts it).
    """
    return u * denominator.to(DECISION_DTYPE) < numerator.to(DECISION_DTYPE)


CDF_DIRECT_MAX = 4096
"""Rows of at most this many tokens are drawn from one float64 cumulative sum, as numpy does."""
CDF_BLOCK = 256
"""Longer rows use a two-level CDF over blocks of this many tokens (a V-long cumsum is a serial loop, ~1 ns a token)."""


def _search(cdf: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``searchsorted(cdf, v, right=True)`` kept at or before the first index where ``cdf`` reaches its total.

    Returns the first index whose cumulative mass exceeds ``v``, a token of positive
    mass; when ``v`` rounds up to the total it returns the first index at which the
    CDF reaches its total (also of positive mass) instead of running off the end.
    """
    total = cdf[..., -1:].contiguous()
    idx = torch.searchsorted(cdf, v, right=True)
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(idx, last)


def categorical(law: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws from the rows of ``law [batch, V]`` (non-negative, need not be normalised).

    ``u [batch, n]`` float64 in [0, 1) gives ``[batch, n]`` int64 tokens: the first
    token whose cumulative mass exceeds ``u * total``, as :func:`otm.laws.categorical`
    (``searchsorted(cumsum(law), u * total, side="right")``), so a zero-mass token is
    never returned, even for u = 0. The CDF is float64 whatever the law's dtype (a
    float32 CDF absorbs masses below 6e-8 of the running total). When ``u * total``
    rounds up to ``total`` the draw is the first token at which the CDF reaches its
    total (numpy takes the last positive token; they differ only when rounding
    absorbs tail masses). Rows must have positive mass.

    Rows longer than :data:`CDF_DIRECT_MAX` use block sums: the block is found on
    the cumulative block masses, then the token on the cumulative sum inside that
    block, with the same guard at both levels. This is the same law; it differs
    from numpy's single cumulative sum only in summation order (boundaries move by
    ~1e-16 of the total).
    """
    batch, V = law.shape
    if V <= CDF_DIRECT_MAX:
        cdf = law.cumsum(-1, dtype=DECISION_DTYPE)  # [batch, V]
        return _search(cdf, u * cdf[:, -1:])
    n_blocks = -(-V // CDF_BLOCK)
    if n_blocks * CDF_BLOCK != V:
        law = torch.nn.functional.pad(law, (0, n_blocks * CDF_BLOCK - V))  # zero mass: never drawn
    blocks = law.reshape(batch, n_blocks, CDF_BLOCK)  # [batch, n_blocks, CDF_BLOCK]
    # block masses summed in the law's dtype (relative error ~1e-7 of each block's own mass in float32),
    # accumulated across blocks in float64
    block_cdf = blocks.sum(-1).to(DECISION_DTYPE).cumsum(-1)  # [batch, n_blocks]
    edges = torch.nn.functional.pad(block_cdf, (1, 0))  # [batch, n_blocks + 1]: where each block starts
    v = u * block_cdf[:, -1:]  # [batch, n]
    j = _search(block_cdf, v)  # [batch, n]: block of each draw
    n = u.shape[1]
    inner = blocks.gather(1, j.unsqueeze(-1).expand(batch, n, CDF_BLOCK)).cumsum(-1, dtype=DECISION_DTYPE)  # [batch, n, CDF_BLOCK]
    i = _search(inner, (v - edges.gather(1, j)).unsqueeze(-1)).squeeze(-1)  # [batch, n]: v - start of block j >= 0
    return j * CDF_BLOCK + i


def residual_draw(residual: torch.Tensor, fallback: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row from ``norm(residual)``, or from ``fallback`` where the residual has no mass.

    ``residual``, ``fallback`` ``[batch, V]`` non-negative (``residual`` is overwritten);
    ``u [batch]``. Mirrors
    ``otm.verifiers.base.residual_sample`` (the empty-residual branch has probability
    0 in exact arithmetic, see that module).
    """
    empty = residual.sum(-1, keepdim=True) <= 0  # [batch, 1]
    law = residual.addcmul_(fallback, empty.to(residual.dtype))  # [batch, V]: residual, or fallback where empty
    return categorical(law, u.unsqueeze(1)).squeeze(1)  # [batch]


def first_accepted(accept: torch.Tensor, drafts: torch.Tensor):
    """``(any [batch] bool, index [batch] int64, token [batch] int64)`` of the first True per row."""
    any_ = accept.any(-1)  # [batch]
    index = accept.to(torch.uint8).argmax(-1)  # [batch]: first True (0 where none)
    token = drafts.gather(1, index.unsqueeze(1)).squeeze(1)  # [batch]
    return any_, index, token


def assemble(any_, index, token, residual_token) -> Verified:
    """Accepted rows keep their draft; the others take the residual token, ``NOT_ACCEPTED``."""
    out_token = torch.where(any_, token, residual_token)
    accepted = torch.where(any_, index, torch.full_like(index, NOT_ACCEPTED))
    return Verified(out_token, accepted)
