"""Draft schemes: the joint law of the k draft tokens at one position.

A scheme is built from the draft model's next-token law ``draft`` (``q`` in most
papers) and the number of drafts ``k``. Each scheme can

* ``enumerate()`` its ordered draft tuples with their probabilities (small V),
* ``rows(fold=True)`` give the same law folded onto *sets* of distinct tokens,
  which is all the membership cost of the OTM problem looks at, and
* ``sample(rng)`` one draft tuple with a seeded :class:`numpy.random.Generator`.

Schemes
-------
``iid``
    k independent draws from ``draft`` (with replacement; SpecTr, SpecInfer).
``without_replacement``
    successive sampling: draw from ``draft``, remove the token, renormalise,
    repeat (the law of the Gumbel-top-k order; MCSD, RSD, Sequoia).
``greedy``
    Hu et al. (ICLR 2025): the top k-1 tokens of ``draft`` are fixed, the last
    draft is drawn from ``draft`` restricted to the other tokens.
``spechub``
    SpecHub (Sun et al., EMNLP 2024), k = 2: with ``a = argmax draft``,
    ``x1 ~ draft``; ``x2 = a`` if ``x1 != a`` else ``x2 ~ draft`` restricted to
    tokens other than ``a``.
``top``
    the k most probable tokens of ``draft``, deterministic, in decreasing order of
    draft probability (the drafts of EAGLE-2, SGLang and llama.cpp trees; the
    optimum is then the target mass of the set).
``table``
    an explicit joint law over k-tuples (e.g. drafts from different models).

Ties in "top" and "argmax" are broken towards the lower token index, so every
scheme is a deterministic function of its inputs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .laws import OtmError, categorical, check_k, check_law, support_size

MAX_ENUMERATION = 5_000_000
"""Largest number of draft tuples (or sets) :meth:`Scheme.enumerate` builds by default."""

SCHEME_NAMES = ("iid", "without_replacement", "greedy", "spechub", "top", "table")


@dataclass(frozen=True)
class Rows:
    """Draft tuples or sets in compressed form, the input of the LP builders.

    Row ``r`` holds the distinct tokens ``tokens[ptr[r]:ptr[r+1]]`` (sorted) and
    has probability ``mass[r]``.
    """

    ptr: np.ndarray  # [n + 1] int64
    tokens: np.ndarray  # [nnz] int64
    mass: np.ndarray  # [n] float64

    @property
    def n(self) -> int:
        return int(self.mass.size)

    def members(self, r: int) -> np.ndarray:
        return self.tokens[self.ptr[r] : self.ptr[r + 1]]


def _rows_from_lists(token_lists, mass) -> Rows:
    lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    ptr = np.zeros(len(token_lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    tokens = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=int(ptr[-1]))
    return Rows(ptr, tokens, np.asarray(mass, dtype=np.float64))


def rows_from_tuples(tuples: np.ndarray, probs: np.ndarray, fold: bool) -> Rows:
    """Rows of distinct-token sets from ordered tuples; ``fold`` merges equal sets."""
    sets = [tuple(sorted(set(map(int, t)))) for t in tuples]
    if not fold:
        return _rows_from_lists(sets, probs)
    acc: dict[tuple[int, ...], float] = {}
    for s, pr in zip(sets, probs):
        acc[s] = acc.get(s, 0.0) + float(pr)
    keys = sorted(acc, key=lambda s: (len(s), s))
    return _rows_from_lists(keys, [acc[s] for s in keys])


def _remaining_mass(q: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """``sum(q) - sum(q[drawn_row])`` per row, without cancellation when little is left.

    ``drawn`` is ``[n, j]`` with distinct tokens per row. Where the subtraction
    would lose more than ~1e-13 relative precision the complement is summed
    directly.
    """
    total = float(q.sum())
    if drawn.shape[1] == 0:
        return np.full(drawn.shape[0], total)
    rem = total - q[drawn].sum(axis=1)
    risky = np.flatnonzero(rem < 1e-3 * total)
    for r in risky:
        mask = np.ones(q.size, dtype=bool)
        mask[drawn[r]] = False
        rem[r] = q[mask].sum()
    return rem


class Scheme:
    """Base class. Subclasses set ``name``, ``k``, ``V`` and ``draft``."""

    name: str = ""
    k: int
    V: int
    draft: np.ndarray | None
    exchangeable: bool = False

    # -- sizes -----------------------------------------------------------------
    def n_tuples(self) -> int:
        """Number of ordered tuples :meth:`enumerate` returns (computed before building)."""
        raise NotImplementedError

    def n_sets(self) -> int:
        """Number of distinct-token sets :meth:`rows` with ``fold=True`` returns (an upper bound)."""
        raise NotImplementedError

    def _check_size(self, n: int, what: str, limit: int) -> None:
        if n > limit:
            raise OtmError(
                f"the {self.name} scheme with V={self.V}, k={self.k} has {n:,} {what}, more than the "
                f"limit {limit:,}: use a smaller vocabulary or k, or the closed form"
            )

    # -- laws ------------------------------------------------------------------
    def enumerate(self, limit: int = MAX_ENUMERATION) -> tuple[np.ndarray, np.ndarray]:
        """All ordered draft tuples with positive probability.

        Returns
        -------
        tuples : ndarray, shape (n, k), int64
        probs : ndarray, shape (n,), float64, summing to 1
        """
        self._check_size(self.n_tuples(), "draft tuples", limit)
        return self._enumerate()

    def rows(self, fold: bool = True, limit: int = MAX_ENUMERATION) -> Rows:
        """The scheme's law on distinct-token sets (``fold``) or on ordered tuples."""
        if fold:
            self._check_size(self.n_sets(), "draft sets", limit)
            return self._sets()
        tuples, probs = self.enumerate(limit)
        return rows_from_tuples(tuples, probs, fold=False)

    def _enumerate(self):
        raise NotImplementedError

    def _sets(self) -> Rows:
        tuples, probs = self._enumerate()
        return rows_from_tuples(tuples, probs, fold=True)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One draft tuple, shape (k,), int64."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(V={self.V}, k={self.k})"


class IID(Scheme):
    r"""k i.i.d. draws from ``draft``: :math:`P(x_1..x_k) = \prod_i q(x_i)`."""

    name = "iid"
    exchangeable = True

    def __init__(self, draft, k: int):
        self.draft = check_law(draft, "draft")
        self.k = check_k(k)
        self.V = self.draft.size
        self.support = np.flatnonzero(self.draft > 0)

    def n_tuples(self) -> int:
        return self.support.size**self.k

    def n_sets(self) -> int:
        s = self.support.size
        return sum(math.comb(s, m) for m in range(1, min(self.k, s) + 1))

    def _enumerate(self):
        s, k = self.support, self.k
        grids = np.stack(np.meshgrid(*([np.arange(s.size)] * k), indexing="ij"), axis=-1).reshape(-1, k)
        tuples = s[grids]
        probs = np.prod(self.draft[tuples], axis=1)
        return tuples, probs

    def _sets(self) -> Rows:
        # P(set S) = sum over compositions c of k into |S| positive parts of
        # k!/prod(c!) prod q^c: a sum of positive terms, no cancellation.
        q, k, sup = self.draft, self.k, self.support
        token_lists: list = []
        masses: list = []
        for m in range(1, min(k, sup.size) + 1):
            combos = np.array(list(itertools.combinations(sup, m)), dtype=np.int64).reshape(-1, m)
            comps = [c for c in itertools.product(range(1, k + 1), repeat=m) if sum(c) == k]
            comps_a = np.array(comps, dtype=np.float64)  # [nc, m]
            coef = np.array([math.factorial(k) / math.prod(math.factorial(ci) for ci in c) for c in comps])
            qs = q[combos]  # [nS, m]
            mass = (np.prod(qs[:, None, :] ** comps_a[None, :, :], axis=2) * coef).sum(axis=1)
            token_lists.extend(map(tuple, combos))
            masses.append(mass)
        return _rows_from_lists(token_lists, np.concatenate(masses))

    def sample(self, rng):
        return np.array([categorical(rng, self.draft) for _ in range(self.k)], dtype=np.int64)


class WithoutReplacement(Scheme):
    r"""Successive sampling without replacement (the law of Gumbel-top-k order).

    :math:`P(x_1..x_k) = \prod_i q(x_i) / (1 - \sum_{j<i} q(x_j))` for distinct tokens.
    Needs at least k tokens with positive draft mass.
    """

    name = "without_replacement"
    exchangeable = True

    def __init__(self, draft, k: int):
        self.draft = check_law(draft, "draft")
        self.k = check_k(k)
        self.V = self.draft.size
        self.support = np.flatnonzero(self.draft > 0)
        if self.support.size < self.k:
            raise OtmError(
                f"without_replacement needs at least k={self.k} tokens with positive draft mass, "
                f"the draft has {self.support.size}: lower k or use the iid scheme"
            )

    def n_tuples(self) -> int:
        return math.perm(self.support.size, self.k)

    def n_sets(self) -> int:
        return math.comb(self.support.size, self.k)

    def _ordered_probs(self, tuples: np.ndarray) -> np.ndarray:
        q = self.draft
        probs = np.ones(tuples.shape[0])
        for i in range(self.k):
            probs *= q[tuples[:, i]] / _remaining_mass(q, tuples[:, :i])
        return probs

    def _enumerate(self):
        tuples = np.array(list(itertools.permutations(self.support, self.k)), dtype=np.int64).reshape(-1, self.k)
        return tuples, self._ordered_probs(tuples)

    def _sets(self) -> Rows:
        combos = np.array(list(itertools.combinations(self.support, self.k)), dtype=np.int64).reshape(-1, self.k)
        mass = np.zeros(combos.shape[0])
        for perm in itertools.permutations(range(self.k)):
            mass += self._ordered_probs(combos[:, list(perm)])
        return _rows_from_lists(list(map(tuple, combos)), mass)

    def sample(self, rng):
        w = self.draft.copy()
        out = np.empty(self.k, dtype=np.int64)
        for i in range(self.k):
            out[i] = categorical(rng, w)
            w[out[i]] = 0.0
        return out


class Greedy(Scheme):
    r"""Hu et al. (ICLR 2025) greedy drafts: ``D`` = top k-1 tokens of ``draft``
    (fixed), the last draft drawn from ``draft`` restricted to the other tokens:
    :math:`P(D, x) = q(x) / q(\Sigma \setminus D)` for ``x`` not in ``D``.
    """

    name = "greedy"

    def __init__(self, draft, k: int):
        self.draft = check_law(draft, "draft")
        self.k = check_k(k)
        self.V = self.draft.size
        if self.k > self.V:
            raise OtmError(f"greedy needs k <= V, got k={self.k} and V={self.V}")
        order = np.argsort(-self.draft, kind="stable")
        self.fixed = np.sort(order[: self.k - 1]).astype(np.int64)  # D
        rest = np.ones(self.V, dtype=bool)
        rest[self.fixed] = False
        self.rest_mask = rest
        self.rest_mass = float(self.draft[rest].sum())
        if not self.rest_mass > 0:
            raise OtmError(
                f"greedy with k={self.k} needs positive draft mass outside the top {self.k - 1} tokens: "
                "lower k"
            )
        self.last = np.where(rest, self.draft, 0.0) / self.rest_mass  # q' (law of the last draft)

    def n_tuples(self) -> int:
        return support_size(self.last)

    def n_sets(self) -> int:
        return self.n_tuples()

    def _enumerate(self):
        xs = np.flatnonzero(self.last > 0)
        tuples = np.concatenate([np.broadcast_to(self.fixed, (xs.size, self.k - 1)), xs[:, None]], axis=1)
        return tuples.astype(np.int64), self.last[xs]

    def sample(self, rng):
        return np.concatenate([self.fixed, [categorical(rng, self.last)]]).astype(np.int64)


class SpecHub(Scheme):
    r"""SpecHub's two-draft law (Sun et al., EMNLP 2024): with hub ``a = argmax draft``,
    pairs ``(i, a)`` have probability ``q(i)`` and pairs ``(a, i)`` probability
    ``q(a) q(i) / (1 - q(a))``, for ``i != a``.
    """

    name = "spechub"

    def __init__(self, draft, k: int = 2):
        self.draft = check_law(draft, "draft")
        self.k = check_k(k)
        if self.k != 2:
            raise OtmError(f"the spechub scheme has exactly k=2 drafts, got k={self.k}")
        self.V = self.draft.size
        self.hub = int(np.argmax(self.draft))
        others = self.draft.copy()
        others[self.hub] = 0.0
        self.rest_mass = float(others.sum())
        if not self.rest_mass > 0:
            raise OtmError("spechub needs positive draft mass on at least two tokens: use k=1")
        self.others = others / self.rest_mass  # q restricted to tokens != hub

    def n_tuples(self) -> int:
        return 2 * support_size(self.others)

    def n_sets(self) -> int:
        return support_size(self.others)

    def _enumerate(self):
        a, q = self.hub, self.draft
        xs = np.flatnonzero(self.others > 0)
        first = np.stack([xs, np.full_like(xs, a)], axis=1)  # (i, a): x1 = i drawn, x2 = hub
        second = np.stack([np.full_like(xs, a), xs], axis=1)  # (a, i): x1 = hub drawn, x2 ~ others
        probs = np.concatenate([q[xs], q[a] * self.others[xs]])
        return np.concatenate([first, second]).astype(np.int64), probs

    def sample(self, rng):
        x1 = categorical(rng, self.draft)
        x2 = categorical(rng, self.others) if x1 == self.hub else self.hub
        return np.array([x1, x2], dtype=np.int64)


class Top(Scheme):
    r"""Deterministic drafts: the k most probable tokens of ``draft`` with positive mass, in
    decreasing order of draft probability (ties to the lower index); probability 1.

    The drafts of engines that expand a tree with the draft's top candidates (EAGLE-2,
    SGLang, llama.cpp). A rule made for *sampled* drafts is in general not exact on them.
    """

    name = "top"

    def __init__(self, draft, k: int):
        self.draft = check_law(draft, "draft")
        self.k = check_k(k)
        self.V = self.draft.size
        if self.k > support_size(self.draft):
            raise OtmError(
                f"the top scheme needs k <= the draft's support ({support_size(self.draft)} tokens), got k={self.k}"
            )
        self.fixed = np.argsort(-self.draft, kind="stable")[: self.k].astype(np.int64)

    def n_tuples(self) -> int:
        return 1

    def n_sets(self) -> int:
        return 1

    def _enumerate(self):
        return self.fixed[None].copy(), np.ones(1)

    def sample(self, rng):
        return self.fixed.copy()


class Table(Scheme):
    """An explicit joint law over k-tuples of tokens in ``range(V)``."""

    name = "table"

    def __init__(self, tuples, probs, V: int):
        t = np.asarray(tuples)
        if t.ndim != 2 or t.shape[0] == 0:
            raise OtmError(f"table tuples must be a non-empty 2-D array [n, k], got shape {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise OtmError("table tuples must hold integer token ids")
        self.V = int(V)
        if t.min() < 0 or t.max() >= self.V:
            raise OtmError(f"table tokens must lie in 0..{self.V - 1}, got {t.min()}..{t.max()}")
        pr = check_law(probs, "table probabilities")
        if pr.size != t.shape[0]:
            raise OtmError(f"table has {t.shape[0]} tuples but {pr.size} probabilities: give one per tuple")
        self.k = check_k(t.shape[1])
        keep = pr > 0
        acc: dict[tuple[int, ...], float] = {}
        for row, p in zip(map(tuple, t[keep].astype(np.int64)), pr[keep]):
            acc[row] = acc.get(row, 0.0) + float(p)
        self.tuples = np.array(list(acc), dtype=np.int64).reshape(-1, self.k)
        self.probs = np.array(list(acc.values()))
        self.draft = None

    def n_tuples(self) -> int:
        return self.tuples.shape[0]

    def n_sets(self) -> int:
        return self.tuples.shape[0]

    def _enumerate(self):
        return self.tuples.copy(), self.probs.copy()

    def sample(self, rng):
        return self.tuples[categorical(rng, self.probs)].copy()


def check_target(scheme, target) -> np.ndarray:
    """``target`` checked against ``scheme`` (a :class:`Scheme`, over the same V), or a one-line OtmError.

    >>> check_target(IID([0.5, 0.5], 2), [0.2, 0.3, 0.5])
    Traceback (most recent call last):
    ...
    otm.laws.OtmError: target has 3 masses but the iid scheme's draft law has 2: give laws over the same vocabulary
    """
    if not isinstance(scheme, Scheme):
        raise OtmError(
            f"expected a draft scheme from otm.schemes (e.g. IID(draft, k)), got {type(scheme).__name__} "
            f"{scheme!r:.40}: build one with otm.schemes.make_scheme(name, draft, k)"
        )
    return check_law(target, "target", size=scheme.V, size_of=f"the {scheme.name} scheme's draft law")


def make_scheme(name: str, draft, k: int) -> Scheme:
    """Build a scheme by name (``iid``, ``without_replacement``, ``greedy``, ``spechub``, ``top``)."""
    classes = {"iid": IID, "without_replacement": WithoutReplacement, "greedy": Greedy, "spechub": SpecHub, "top": Top}
    if name not in classes:
        raise OtmError(f"unknown scheme {name!r}: choose one of {', '.join(classes)}")
    return classes[name](draft, k)
