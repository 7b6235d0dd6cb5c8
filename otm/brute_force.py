r""":math:`\alpha^*` of any scheme by brute force: the minimum cut over all :math:`2^V` subsets.

The reference for every closed form of :mod:`otm.optimum` (and its route for a scheme without one,
e.g. :class:`otm.schemes.Table`):

.. math::

    \alpha^* = \min_{H \subseteq \Sigma}\; p(H) + 1 - Q(H),

with :math:`Q(H)` summed from the scheme's enumeration of its draft tuples by a subset-sum (zeta)
transform over bitmasks, :math:`O(V 2^V)` work and memory, so V <= :data:`BRUTE_FORCE_MAX_V`.
"""

from __future__ import annotations

import numpy as np

from .laws import OtmError
from .schemes import Scheme, check_target

BRUTE_FORCE_MAX_V = 20
"""Largest vocabulary :func:`brute_force_optimum` enumerates (``2^V`` subsets)."""


def _zeta(f: np.ndarray, V: int) -> np.ndarray:
    """Subset sums ``g[H] = sum_{S subset of H} f[S]`` over bitmasks, in place, O(V 2^V)."""
    for bit in range(V):
        view = f.reshape(-1, 2, 1 << bit)
        view[:, 1, :] += view[:, 0, :]
    return f


def brute_force_cut(scheme: Scheme, target: np.ndarray) -> tuple[float, np.ndarray]:
    """``(alpha*, H)``: the least ``p(H) + 1 - Q(H)`` over all subsets and a subset H attaining it; ``target``
    as returned by :func:`otm.schemes.check_target`."""
    V = scheme.V
    if V > BRUTE_FORCE_MAX_V:
        raise OtmError(
            f"brute_force_optimum enumerates all 2^V subsets: V={V} is above the limit {BRUTE_FORCE_MAX_V}"
        )
    tuples, probs = scheme.enumerate()
    masks = np.bitwise_or.reduce(np.left_shift(np.int64(1), tuples), axis=1)
    inside = _zeta(np.bincount(masks, weights=probs, minlength=1 << V).astype(np.float64), V)
    mass = np.zeros(1 << V)
    mass[1 << np.arange(V)] = target
    mass = _zeta(mass, V)
    values = mass + (1.0 - inside)
    h = int(np.argmin(values))
    H = ((h >> np.arange(V)) & 1).astype(bool)
    return float(values[h]), H


def brute_force_optimum(scheme: Scheme, target) -> float:
    r"""Reference :math:`\alpha^*`: the minimum over all :math:`2^V` subsets.

    .. math::

        \alpha^* = \min_{H \subseteq \Sigma}\; p(H) + 1 - Q(H), \qquad
        Q(H) = \sum_{S \subseteq H} P(\mathrm{set}(\bar X) = S),

    with the set law from :meth:`Scheme.enumerate` and :math:`Q` by a
    subset-sum (zeta) transform over bitmasks, :math:`O(V 2^V)`. Any scheme,
    :class:`otm.schemes.Table` included.

    Parameters
    ----------
    scheme : Scheme
    target : array_like, shape (V,)

    Returns
    -------
    alpha : float

    Raises
    ------
    OtmError
        If ``V > 20`` (:data:`BRUTE_FORCE_MAX_V`) or the enumeration is too large.

    Examples
    --------
    >>> from otm.schemes import IID, Table
    >>> round(brute_force_optimum(IID([0.2, 0.2, 0.6], 2), [0.5, 0.3, 0.2]), 6)
    0.84
    >>> round(brute_force_optimum(Table([[0, 1], [2, 2]], [0.5, 0.5], V=3), [0.5, 0.3, 0.2]), 6)
    0.7
    """
    target = check_target(scheme, target)
    return brute_force_cut(scheme, target)[0]
