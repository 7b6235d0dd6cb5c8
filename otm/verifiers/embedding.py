"""The i.i.d. arrivals embedded in k drafts drawn without replacement: the pieces of the walk that
``optimal_embedded`` and ``kseq_without_replacement`` both read (the walk itself and its proof:
:mod:`otm.verifiers.optimal_embedded`)."""

from __future__ import annotations

import numpy as np

from ..laws import OtmError


def unseen_mass(q_s: np.ndarray, rest: float) -> np.ndarray:
    """``[k]`` mass not yet seen after m drafts, ``1 - q(A_m) = rest + q(s_{m+1}..s_k)`` (m = 0..k-1)."""
    return rest + np.cumsum(q_s[::-1])[::-1]


def mass_outside(draft: np.ndarray, d: np.ndarray) -> float:
    """Draft mass outside the drafts, without cancellation when little is left."""
    rest = float(draft.sum() - draft[d].sum())
    if rest < 1e-3:
        w = draft.copy()
        w[d] = 0.0
        rest = float(w.sum())
    return max(rest, 0.0)


def require_distinct(d: np.ndarray, rule: str) -> None:
    """A one-line refusal of repeated drafts by ``rule`` (a rule for drafts drawn without replacement)."""
    if np.unique(d).size != d.size:
        raise OtmError(f"{rule} needs distinct drafts (drawn without replacement): draw them with the "
                       "without_replacement scheme")


__all__ = ["unseen_mass", "mass_outside", "require_distinct"]
