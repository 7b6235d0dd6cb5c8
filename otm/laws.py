"""Checking and normalising probability vectors: the one door bad input meets.

Every public entry point of ``otm`` passes its laws through :func:`check_law`, so
a negative, NaN or badly normalised mass is refused here with a one-line
message (an :class:`OtmError`) instead of producing a silently wrong answer.

Laws are float64 numpy vectors. A law is accepted when every mass is finite and
non-negative and the total is within ``SUM_TOLERANCE`` of 1; it is then divided by
its sum, so downstream code sees a vector that sums to 1 up to rounding.
"""

from __future__ import annotations

import numpy as np

SUM_TOLERANCE = 1e-6
"""Largest accepted ``|sum(law) - 1|`` before normalisation."""


class OtmError(ValueError):
    """Bad input to otm: the message is one line that says what is wrong and what to do."""


def check_law(law, name: str = "law", *, size: int | None = None, size_of: str = "the target") -> np.ndarray:
    """Return ``law`` as a normalised float64 vector, or raise :class:`OtmError`.

    Parameters
    ----------
    law : array_like, shape (V,)
        Probability masses.
    name : str
        Used in the error message (``"target"``, ``"draft"``...).
    size : int, optional
        Required length (the vocabulary size of another law).
    size_of : str
        What ``size`` is the length of, for the error message (default "the target").

    Examples
    --------
    >>> check_law([0.5, 0.25, 0.25], "target")
    array([0.5 , 0.25, 0.25])
    >>> check_law([0.5, -0.1, 0.6], "draft")
    Traceback (most recent call last):
    ...
    otm.laws.OtmError: draft has a negative mass (-0.1 at index 1): give non-negative probabilities
    """
    try:
        arr = np.asarray(law, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise OtmError(f"{name} is not a vector of numbers ({exc}): give probabilities like 0.5,0.3,0.2") from None
    if arr.ndim != 1:
        raise OtmError(f"{name} must be a 1-D vector, got shape {arr.shape}")
    if arr.size == 0:
        raise OtmError(f"{name} is empty: give at least one probability")
    if size is not None and arr.size != size:
        raise OtmError(
            f"{name} has {arr.size} masses but {size_of} has {size}: give laws over the same vocabulary"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise OtmError(f"{name} has a non-finite mass ({arr[i]} at index {i}): give finite probabilities")
    neg = arr < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise OtmError(f"{name} has a negative mass ({arr[i]:g} at index {i}): give non-negative probabilities")
    with np.errstate(over="ignore"):  # finite masses near 1e308 may sum to inf: refused just below
        total = float(arr.sum())
    if not abs(total - 1.0) <= SUM_TOLERANCE:
        raise OtmError(
            f"{name} sums to {total:.9g}, not 1 (tolerance {SUM_TOLERANCE:g}): normalise it first"
        )
    return arr / total


def check_k(k) -> int:
    """Return ``k`` as an int >= 1, or raise :class:`OtmError`."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise OtmError(f"k must be a whole number >= 1, got {k!r}")
    if k < 1:
        raise OtmError(f"k must be >= 1 (drafts per position), got {k}")
    return int(k)


def support_size(law: np.ndarray) -> int:
    """Number of tokens with positive mass."""
    return int(np.count_nonzero(law > 0))


def categorical(rng: np.random.Generator, law: np.ndarray) -> int:
    """Draw one token from ``law`` (need not be normalised) by inverse CDF.

    Uses ``u`` in [0, 1) and ``searchsorted(side="right")``, so a token with zero
    mass is never returned, even for ``u == 0`` (the boundary bug of SGLang #35771).
    """
    return inverse_cdf(law, rng.random())


def inverse_cdf(law: np.ndarray, u: float) -> int:
    """The token :func:`categorical` draws with the uniform ``u`` in [0, 1): the first token whose
    cumulative mass exceeds ``u * total`` (the last positive token when ``u * total`` rounds up to
    the total), so a zero-mass token is never returned."""
    cdf = np.cumsum(law)
    total = cdf[-1]
    if not total > 0:
        raise OtmError("cannot sample from a law with no positive mass")
    i = int(np.searchsorted(cdf, u * total, side="right"))
    if i >= law.size:  # u * total rounded up to total: take the last positive token
        i = int(np.flatnonzero(law > 0)[-1])
    return i


def positive_part(v: np.ndarray) -> np.ndarray:
    """``(v)_+``: the positive part, elementwise."""
    return np.maximum(v, 0.0)


def normalise(v: np.ndarray) -> np.ndarray | None:
    """``v / sum(v)``, or ``None`` when ``v`` has no positive mass (caller decides)."""
    s = float(v.sum())
    if not s > 0:
        return None
    return v / s
