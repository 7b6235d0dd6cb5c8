"""Hypothesis strategies for (target, draft) pairs, edge cases included.

Masses mix exact zeros, tiny values (1e-12 .. 1e-7) and ordinary ones; the pair
kinds add identical laws, disjoint supports and point masses.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

MASS = st.one_of(
    st.just(0.0),
    st.sampled_from([1e-12, 1e-10, 1e-9, 1e-7]),
    st.floats(min_value=1e-3, max_value=1.0, allow_nan=False),
)

KINDS = ("random", "random", "random", "identical", "disjoint", "point_target", "point_draft")


@st.composite
def law(draw, V: int) -> np.ndarray:
    raw = np.array(draw(st.lists(MASS, min_size=V, max_size=V)))
    assume(raw.sum() > 0)
    return raw / raw.sum()


@st.composite
def pair(draw, min_V: int = 2, max_V: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """A (target, draft) pair over V tokens."""
    V = draw(st.integers(min_V, max_V))
    kind = draw(st.sampled_from(KINDS))
    if kind == "identical":
        t = draw(law(V))
        return t, t.copy()
    if kind == "disjoint":
        cut = draw(st.integers(1, V - 1))
        a = draw(law(cut))
        b = draw(law(V - cut))
        return np.concatenate([a, np.zeros(V - cut)]), np.concatenate([np.zeros(cut), b])
    if kind == "point_target":
        t = np.zeros(V)
        t[draw(st.integers(0, V - 1))] = 1.0
        return t, draw(law(V))
    if kind == "point_draft":
        q = np.zeros(V)
        q[draw(st.integers(0, V - 1))] = 1.0
        return draw(law(V)), q
    return draw(law(V)), draw(law(V))
