"""otm.testing.membership_cells: the exact (token, is-a-draft) cell law the sampler tests use."""

from __future__ import annotations

import numpy as np

from otm.schemes import IID
from otm.testing import membership_cells


def test_membership_cells_of_a_draft_blind_rule():
    """A rule that ignores the drafts and outputs the target: cell (y, member) has mass
    p(y) P(y among the k iid drafts) = p(y) (1 - (1 - q(y))^k)."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.6, 0.0, 0.3])
    k = 3
    cells = membership_cells(lambda drafts: p, IID(q, k), 4)
    member = 1 - (1 - q) ** k
    np.testing.assert_allclose(cells[4:], p * member, atol=1e-15)
    np.testing.assert_allclose(cells[:4], p * (1 - member), atol=1e-15)
    assert abs(cells.sum() - 1) < 1e-15


def test_membership_cells_of_always_first_draft():
    """Returning the first draft puts all mass on member cells, with the draft law."""
    q = np.array([0.25, 0.25, 0.5])

    def first(drafts):
        out = np.zeros(3)
        out[drafts[0]] = 1.0
        return out

    cells = membership_cells(first, IID(q, 2), 3)
    np.testing.assert_allclose(cells[:3], 0.0, atol=0)
    np.testing.assert_allclose(cells[3:], q, atol=1e-15)
