"""The bank of (target, draft) laws a rule is certified on, and the hypothesis strategy behind the search.

Fixed adversarial families, each a case a published rule or a real engine got wrong at some
point: exact zeros in either law (top-k / top-p truncation), masses of 1e-12 (a ratio p/q that
overflows or a residual that rounds away), point masses, identical laws (an empty residual),
disjoint supports (every draft rejected), peaked and flat laws, near-equal laws, and random
Dirichlet laws. The hypothesis strategy :func:`pairs` draws the same kinds at random and
shrinks a counterexample to its smallest form (fewest tokens, simplest masses).

A case a scheme cannot be built on (``without_replacement`` or ``top`` with fewer than k tokens of
positive draft mass, ``greedy`` with no draft mass left outside its top k - 1) is skipped and
listed in the report, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from ..laws import OtmError
from ..schemes import Scheme, make_scheme

CERTIFY_SCHEMES = ("iid", "without_replacement", "greedy", "spechub", "top")
"""Schemes a rule can be certified under (:func:`otm.schemes.make_scheme` names)."""


@dataclass(frozen=True)
class Instance:
    """One (target, draft) pair of the bank, by family name."""

    name: str
    target: np.ndarray
    draft: np.ndarray

    @property
    def V(self) -> int:
        return self.target.size


def _law(*masses) -> np.ndarray:
    a = np.array(masses, dtype=np.float64)
    return a / a.sum()


def _dirichlet(seed: int, V: int, concentration: float) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(V, concentration))


def fixed_bank() -> list[Instance]:
    """The fixed adversarial families (V from 2 to 6), in a stable order."""
    flat4 = _law(1, 1, 1, 1)
    ident = _dirichlet(3, 5, 1.0)
    near = _law(0.3, 0.25, 0.25, 0.2)
    return [
        Instance("two tokens V=2", _law(0.7, 0.3), _law(0.4, 0.6)),
        Instance("README V=3", _law(0.5, 0.3, 0.2), _law(0.2, 0.2, 0.6)),
        Instance("flat identical V=3", _law(1, 1, 1), _law(1, 1, 1)),
        Instance("identical V=5", ident, ident.copy()),
        Instance("peaked target V=4", _law(0.85, 0.05, 0.05, 0.05), flat4),
        Instance("peaked draft V=4", flat4, _law(0.05, 0.85, 0.05, 0.05)),
        Instance("zeros in both V=5", _law(0.4, 0.3, 0, 0.3, 0), _law(0, 0.2, 0.3, 0.3, 0.2)),
        Instance("tiny masses V=4", _law(1e-12, 0.5, 0.3, 0.2), _law(0.3, 1e-12, 0.4, 0.3)),
        Instance("tiny draft masses V=4", _law(0.2, 0.3, 0.25, 0.25), _law(1e-12, 1e-12, 0.6, 0.4)),
        Instance("point target V=3", _law(0, 1, 0), _law(0.3, 0.3, 0.4)),
        Instance("point draft V=3", _law(0.5, 0.3, 0.2), _law(0, 0, 1)),
        Instance("disjoint V=4", _law(0.6, 0.4, 0, 0), _law(0, 0, 0.5, 0.5)),
        Instance("near-equal V=4", near, _law(0.28, 0.27, 0.24, 0.21)),
        Instance("dirichlet(0.3) V=6", _dirichlet(11, 6, 0.3), _dirichlet(12, 6, 0.3)),
        Instance("dirichlet(1) V=5", _dirichlet(21, 5, 1.0), _dirichlet(22, 5, 1.0)),
        Instance("dirichlet(3) V=6", _dirichlet(31, 6, 3.0), _dirichlet(32, 6, 3.0)),
    ]


def build_scheme(name: str, draft: np.ndarray, k: int) -> Scheme:
    """``make_scheme`` with the certify scheme names (raises OtmError when it cannot be built)."""
    if name not in CERTIFY_SCHEMES:
        raise OtmError(f"unknown scheme {name!r}: choose one of {', '.join(CERTIFY_SCHEMES)}")
    return make_scheme(name, draft, k)


# -- hypothesis ----------------------------------------------------------------------------------

MASS = st.one_of(
    st.just(0.0),
    st.sampled_from([1e-12, 1e-10, 1e-9, 1e-7]),
    st.floats(min_value=1e-3, max_value=1.0, allow_nan=False),
)
"""One raw mass: exact zeros, tiny values and ordinary ones (normalised afterwards)."""

PAIR_KINDS = ("random", "random", "random", "identical", "disjoint", "point_target", "point_draft")


@st.composite
def law(draw, V: int) -> np.ndarray:
    """A law over V tokens built from :data:`MASS` values."""
    raw = np.array(draw(st.lists(MASS, min_size=V, max_size=V)))
    assume(raw.sum() > 0)
    return raw / raw.sum()


@st.composite
def pairs(draw, min_V: int = 2, max_V: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """A (target, draft) pair over V tokens, V in [min_V, max_V], of one of :data:`PAIR_KINDS`."""
    V = draw(st.integers(min_V, max_V))
    kind = draw(st.sampled_from(PAIR_KINDS))
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
