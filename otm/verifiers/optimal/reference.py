"""The token-level construction (every token its own race key) and the exact selection law of a
plan by enumeration of the race: the references the grouped rule is checked against."""

from __future__ import annotations

import numpy as np

from ...laws import check_k, check_law
from .layout import RacePlan, layout


def build_tokens(target, draft, k: int) -> RacePlan:
    """The token-level construction (module docstring): O(V log V), every token its own race key.

    The reference the grouped :func:`build` reduces to when every group is one token; at
    V = 49152 it costs 10-200 ms (the Newton passes over the tokens of large layers).
    """
    p = check_law(target, "target")
    q = check_law(draft, "draft", size=p.size)
    k = check_k(k)
    x, theta, key1, key2, _ = layout(p, q, k)
    acc = float(np.minimum(x, p).sum())
    return RacePlan(x, theta, key1, key2, acc, np.maximum(p - x, 0.0))



def selection_law(plan: RacePlan, drafts: np.ndarray) -> np.ndarray:
    """Exact P(selected = y | drafts): each position's key is its token's pass-1 key w.p. theta,
    else its pass-2 key; the smallest key wins, the first position on ties (as ``argmin``)."""
    d = np.asarray(drafts, dtype=np.int64).reshape(-1)
    th = plan.theta[d]
    keys = np.stack([plan.key1[d], plan.key2[d]], 1)  # [k, 2]
    probs = np.stack([th, 1.0 - th], 1)  # [k, 2]
    pos = np.arange(d.size)[:, None]
    out = np.zeros(plan.x.size)
    for j in range(d.size):
        for s in range(2):
            if probs[j, s] == 0:
                continue
            kk = keys[j, s]
            loses_to = (keys > kk) | ((keys == kk) & (pos > j))  # [k, 2]: options of l that j beats
            survive = (probs * loses_to).sum(1)
            survive[j] = 1.0
            out[d[j]] += probs[j, s] * float(np.prod(survive))
    return out

