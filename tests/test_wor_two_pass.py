"""``analysis/research/wor_two_pass.py`` (research): the two-pass coins rule's law by the
race quadrature equals the enumerated law, and its Gauss-Seidel fit reaches alpha* on small cases."""

from __future__ import annotations


import numpy as np
import pytest

from otm.optimum import optimal_acceptance
from otm.verifiers import optimal_without_replacement as ow
from scripts import load_script

pytestmark = pytest.mark.research  # a research script's check: make test-slow, not make test


@pytest.fixture(scope="module")
def tp():
    return load_script("research/wor_two_pass")


def _cases(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        V, k = int(rng.integers(3, 7)), int(rng.integers(2, 4))
        conc = float(rng.choice([0.1, 0.3, 1.0, 3.0]))
        p, q = rng.dirichlet(np.ones(V) * conc), rng.dirichlet(np.ones(V) * conc)
        if np.count_nonzero(q > 0) > k:
            out.append((p, q, k, rng.uniform(0, 1, V)))
    return out


def test_quadrature_and_formula_match_the_enumerated_rule(tp):
    for p, q, k, theta in _cases(6, 0):
        V = p.size
        tg = ow.build(p, q, k)
        sets, mass = tp.sets_of(q, k)
        order = ow._descending(p, q)
        rank = np.empty(V, dtype=np.int64)
        rank[order] = np.arange(V)
        A, B = tp.enum_AB(sets, mass, tg.layer, rank, theta, V)
        x_coins = tp.selection_by_coins(sets, mass, tg.layer, rank, theta, V)
        assert np.abs(theta * A + (1 - theta) * B - x_coins).max() < 1e-14
        pos = order[q[order] > 0]
        lay = tg.layer[pos]
        starts = np.flatnonzero(np.r_[True, lay[1:] != lay[:-1]])
        rl = tp.RaceLaw(q[pos], np.repeat(starts, np.diff(np.r_[starts, pos.size])), k)
        Aq, Bq, err = rl.sweep(theta[pos].copy())
        assert np.abs(Aq - A[pos]).max() < 1e-12 and np.abs(Bq - B[pos]).max() < 1e-12
        assert err.max() < 1e-10


def test_gauss_seidel_fit_reaches_alpha_star(tp):
    for p, q, k, _ in _cases(5, 1):
        r = tp.fit_race(p, q, k)
        alpha = optimal_acceptance(p, q, k, "without_replacement")
        assert abs(r["x"].sum() - 1) < 1e-12
        assert -1e-12 < alpha - r["acceptance"] < 1e-9, (alpha, r["acceptance"])
