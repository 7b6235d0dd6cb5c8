"""The device path of ``otm.torch.optimal`` (``otm.torch._optimal_device``: fixed ratio groups, no host read).

* Exact law, set-up: for hypothesis pairs (V = 2-6, zeros, tiny masses, identical, disjoint and point laws) and
  k = 1-4, the race with the set-up's own arrays (each token's pass-1 probability and its group's two keys, read
  by ``otm.verifiers.optimal.selection_law``, enumerating every draft tuple) selects exactly the law ``x`` the
  set-up reports (1e-9), and the canonical form on it (accept ``min(1, p/x)``, else ``norm((p - x)_+)``) gives
  the target (1e-9); the same on laws whose ratios cluster in single buckets, where groups hold several tokens
  and give each its own pass-1 probability.
* Exact law, decisions: the verifier's own decisions (:func:`decide`) fed uniforms at the midpoints of every
  cell on which they are constant (pass of each position, the accept test, the residual draw), weighted by the
  cells' widths, give the target (1e-9) and mark ``accepted`` as a draft index exactly when the token is one;
  with the selection law 10% high at one token (planted) they miss it by more than 1e-3. The verifier itself
  (forced device path) is ``decide`` after ``setup``: token by token on a batch. Negative control of the
  enumeration: a reported law that ignores the second pass is off the race's by more than 0.01.
* Statistical: N = 20,000 rows of one instance (V = 6, k = 3, both passes in use) through the device
  decisions; counts of (token, token is a draft) against the exact cells of the device rule by the calibrated
  chi-square (ALPHA = 1e-3). Planted bug: the selection law used by the accept test and the residual 10% high
  at token 0 (TV 0.0167); the test's power against it is asserted >= 0.99 and the bug's samples rejected.
* Acceptance: equal to alpha* (1e-9) on small random laws, where the groups are single tokens; equal to the
  numpy rule's (1e-9) on peaked rows of V = 4096 (the gap at V = 49152: analysis/optimal_device_gap.py). At
  V = 4096 the token rule agrees with the group race (pass-1 masses, selection law by group) to 1e-15. Negative
  control: without the refinement round a row loses more than 1e-6.
* The CPU keeps the host path unless forced; the set-up of a batch is its rows' set-ups.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import otm.torch as ot
from otm.optimum import optimal_acceptance
from otm.schemes import IID
from otm.testing import chi2_gof, chi2_power, membership_cells
from otm.torch import _optimal_device as od
from otm.torch import _rho
from otm.torch._core import normalised
from otm.verifiers import optimal as npo

from hyp import examples
from strategies import pair
from test_torch_verifiers import ALPHA, DRAFT, MIN_POWER, N, TARGET, V, cell_counts, t

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

K = 3
TOL = 1e-9


def device_setup(p, q, k):
    """The set-up of one row (float64 numpy laws) and the normalised target, as the verifier builds them."""
    P, Q = (normalised(t(np.asarray(a)[None]), torch.float64) for a in (p, q))
    return od.setup(P, Q, k), P


def as_plan(s: od.Setup, p: np.ndarray) -> npo.RacePlan:
    """The set-up's row 0 as the numpy rule's ``RacePlan``: per token its pass-1 probability and its group's keys."""
    g = s.group[0]
    x = s.x[0].numpy()
    return npo.RacePlan(x, s.theta[0].numpy(), s.key1[0][g].numpy(), s.key2[0][g].numpy(),
                    float(np.minimum(x, p).sum()), np.maximum(p - x, 0.0))


def enumerated(plan: npo.RacePlan, p, q, k):
    """``(selection law, output law)`` of the race on ``plan`` and the canonical form, over every draft tuple."""
    size = p.size
    sel, out = np.zeros(size), np.zeros(size)
    for tup in itertools.product(range(size), repeat=k):
        w = float(np.prod(q[list(tup)]))
        if w > 0:
            d = np.array(tup)
            sel += w * npo.selection_law(plan, d)
            out += w * npo._law(plan, p, d)
    return sel, out


# -- exact law: the set-up ---------------------------------------------------------------------------


@settings(max_examples=examples(60))
@given(pair(2, 6), st.integers(1, 4))
@example((np.array([0.3, 0.0, 0.2, 0.1, 0.25, 0.15]), np.array([0.1, 0.2, 0.0, 0.3, 0.25, 0.15])), 4)  # the largest
def test_setup_selects_the_law_it_reports_and_the_output_is_the_target(laws, k):
    p, q = laws
    s, P = device_setup(p, q, k)
    p = P[0].numpy()  # the target as the verifier normalises it (the same numbers up to rounding)
    q = q / q.sum()
    plan = as_plan(s, p)
    sel, out = enumerated(plan, p, q, k)
    assert np.abs(sel - plan.x).max() < TOL, (p, q, k)
    assert np.abs(out - p).max() < TOL, (p, q, k)
    assert abs(float(od.acceptance(s, P)[0]) - plan.acceptance) < 1e-15


def test_exact_law_where_groups_spread_theta_over_their_tokens():
    """Laws whose ratios cluster inside single buckets (ratio = 0.5, 1 or 2 times 1 + 0.05 u), so that groups hold
    several tokens and spread their pass-1 probability over them (numpy's step 3, theta_i of its own): in at least
    half of 40 cases; the race with those arrays selects the reported x and the output is the target (1e-9)."""
    rng = np.random.default_rng(0)
    spread = 0
    for _ in range(40):
        size, k = int(rng.integers(4, 8)), int(rng.integers(2, 4))
        q = rng.dirichlet(np.ones(size))
        p = q * rng.choice([0.5, 1.0, 2.0], size=size) * (1 + 0.05 * rng.random(size))
        s, P = device_setup(p / p.sum(), q, k)
        plan = as_plan(s, P[0].numpy())
        sel, out = enumerated(plan, P[0].numpy(), q, k)
        assert np.abs(sel - plan.x).max() < TOL and np.abs(out - P[0].numpy()).max() < TOL, (p, q, k)
        spread += bool((s.theta != s.theta_groups.gather(1, s.group)).any())
    assert spread >= 20, spread


def test_the_race_check_catches_a_wrong_reported_law():
    """Negative control of the check above: a set-up whose reported x ignores the second pass (the plain
    priority's law, theta = 1) while the race keeps its thetas is caught (selection law off by > 0.01)."""
    s, P = device_setup(TARGET, DRAFT, K)
    plan = as_plan(s, P[0].numpy())
    assert 0 < plan.theta.min() < 1  # both passes in use
    wrong = dataclasses.replace(plan, x=npo.selection_law(dataclasses.replace(plan, theta=np.ones(V)), np.arange(V)))
    sel, _ = enumerated(plan, P[0].numpy(), DRAFT, K)
    assert np.abs(sel - wrong.x).max() > 0.01


# -- exact law: the decisions at cell midpoints ---------------------------------------------------------


def cells(edges):
    """``(midpoints, widths)`` of the cells of [0, 1) cut at ``edges``."""
    e = np.unique(np.concatenate([[0.0], np.clip(edges, 0.0, 1.0), [1.0]]))
    return (e[:-1] + e[1:]) / 2, np.diff(e)


def midpoint_law(p, q, k, bug=None):
    """Exact law of ``decide`` on ``setup`` (``bug(setup)`` when given): every draft tuple, pass pattern, accept
    cell and residual cell at its midpoint (each decision is constant on its cell), weighted; returns
    (law, membership acceptance, rows checked, normalised target)."""
    s, P = device_setup(p, q, k)
    s = bug(s) if bug else s
    p = P[0].numpy()
    q = q / q.sum()
    size = p.size
    theta, x = s.theta[0].numpy(), s.x[0].numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(x > 0, p / x, 1.0)
    acc_u, acc_w = cells(ratio[x > 0])  # u * x(y) < p(y) is constant on these cells for every y
    res = np.maximum(p - x, 0.0)
    res_u, res_w = cells(np.cumsum(res)[:-1] / res.sum()) if res.sum() > 0 else (np.array([0.5]), np.array([1.0]))
    rows, weights = [], []
    for tup in itertools.product(range(size), repeat=k):
        wq = float(np.prod(q[list(tup)]))
        if wq == 0:
            continue
        per = [[(th / 2, th), ((1 + th) / 2, 1 - th)] if 0 < th < 1 else [(0.5, 1.0)] for th in theta[list(tup)]]
        for passes in itertools.product(*per):
            wp = float(np.prod([w for _, w in passes]))
            for ua, wa in zip(acc_u, acc_w):
                for ur, wr in zip(res_u, res_w):
                    rows.append((tup, [u for u, _ in passes] + [ua, ur]))
                    weights.append(wq * wp * wa * wr)
    d = torch.tensor([r[0] for r in rows], dtype=torch.int64)
    u = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    n = d.shape[0]
    out = od.decide(P.expand(n, size), od.Setup(*(f.expand(n, *f.shape[1:]) for f in s)), d, u)
    hit = out.accepted >= 0
    assert torch.equal(hit, (d == out.token[:, None]).any(1))
    assert torch.equal(d[hit].gather(1, out.accepted[hit, None])[:, 0], out.token[hit])
    w = np.array(weights)
    law = np.bincount(out.token.numpy(), weights=w, minlength=size)
    return law, float(w[hit.numpy()].sum()), n, p


@settings(max_examples=examples(25))
@given(pair(2, 4), st.integers(1, 3))
@example((np.array([0.4, 0.0, 0.35, 0.25]), np.array([0.1, 0.3, 0.2, 0.4])), 3)  # the largest
def test_decisions_at_cell_midpoints_give_the_target(laws, k):
    law, _, _, p = midpoint_law(*laws, k)
    assert np.abs(law - p).max() < TOL, (laws, k)


def test_decisions_at_cell_midpoints_use_both_passes():
    """The fixed instance of the statistical test: both passes in use, law exact, and the decisions' membership
    acceptance is the set-up's sum min(x, p) (no gap here: the residual never lands on a draft)."""
    s, P = device_setup(TARGET, DRAFT, K)
    assert 0 < float(s.theta[0].min()) < 1
    law, member, n, p = midpoint_law(TARGET, DRAFT, K)
    assert np.abs(law - p).max() < TOL and n > 1000
    assert abs(member - float(od.acceptance(s, P)[0])) < TOL


def test_decisions_at_cell_midpoints_catch_a_planted_bug():
    """Negative control: with the selection law used by the accept test and the residual 10% high at token 0
    (``_x_off``), the midpoint law is off the target by more than 1e-3."""
    law, _, _, p = midpoint_law(TARGET, DRAFT, K, bug=_x_off)
    assert np.abs(law - p).max() > 1e-3


def test_the_verifier_is_decide_after_setup(monkeypatch):
    """The forced device path of ``ot.optimal`` gives, row by row, ``decide`` on the rows' ``setup`` (float32 and
    float64 laws, rows of different laws); a batch's set-up is its rows' set-ups."""
    monkeypatch.setattr(_rho, "FORCE_DEVICE_PATH", True)
    rng = np.random.default_rng(4)
    rows, size, k = 12, 30, 4
    p, q = rng.dirichlet(np.full(size, 0.3), rows), rng.dirichlet(np.full(size, 0.3), rows)
    p[::4, 3] = 0.0
    p /= p.sum(1, keepdims=True)
    for dtype in (torch.float32, torch.float64):
        P, Q = t(p, dtype), t(q, dtype)
        d = ot.sample_iid(Q, k, generator=torch.Generator().manual_seed(1))
        u = torch.rand(rows, k + 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        out = ot.optimal(P, Q, d, uniforms=u)
        Pn, Qn = normalised(P, torch.float64), normalised(Q, torch.float64)
        batch = od.setup(Pn, Qn, k)
        for r in range(rows):
            one = od.setup(Pn[r : r + 1], Qn[r : r + 1], k)
            assert all(torch.equal(a[r : r + 1], b) for a, b in zip(batch, one)), r
            want = od.decide(Pn[r : r + 1], one, d[r : r + 1], u[r : r + 1])
            assert (int(out.token[r]), int(out.accepted[r])) == (int(want.token), int(want.accepted))


def test_the_cpu_keeps_the_host_path(monkeypatch):
    calls = []
    monkeypatch.setattr(od, "setup", lambda *a: calls.append(1))
    ot.optimal(t(TARGET[None]), t(DRAFT[None]), torch.tensor([[0, 1, 2]]))
    assert not calls


# -- statistical: the device decisions, with a planted bug ----------------------------------------------


def _x_off(s: od.Setup) -> od.Setup:
    """Bug: the selection law used by the accept test and the residual 10% high at token 0."""
    x = s.x.clone()
    x[:, 0] *= 1.1
    return s._replace(x=x)


def test_law_by_chi_square_and_a_planted_bug():
    scheme = IID(DRAFT, K)
    s, P = device_setup(TARGET, DRAFT, K)
    plan = as_plan(s, P[0].numpy())
    assert 0 < plan.theta.min() < 1  # both passes in use: the race uniforms matter
    p0 = membership_cells(lambda d: npo._law(plan, TARGET, np.asarray(d)), scheme, V)
    assert np.abs(p0[:V] + p0[V:] - TARGET).max() < 1e-12
    bad_plan = as_plan(_x_off(s), P[0].numpy())
    p1 = membership_cells(lambda d: npo._law(bad_plan, TARGET, np.asarray(d)), scheme, V)
    tv = 0.5 * np.abs(p0 - p1).sum()
    assert 0.01 < tv < 0.05, tv  # 0.0167 (power 1 - 2e-10)
    power = chi2_power(N, p0, p1, alpha=ALPHA)
    assert power >= MIN_POWER, power
    tuples, probs = scheme.enumerate()
    d = torch.as_tensor(tuples[np.random.default_rng(5).choice(len(probs), size=N, p=probs)])
    u = torch.rand(N, K + 2, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    rows = lambda s: od.Setup(*(f.expand(N, *f.shape[1:]) for f in s))  # noqa: E731 (the row's set-up, N times)
    out = od.decide(P.expand(N, V), rows(s), d, u)
    result = chi2_gof(cell_counts(out.token, d), p0, alpha=ALPHA)
    assert not result.reject, str(result)
    bad = od.decide(P.expand(N, V), rows(_x_off(s)), d, u)
    control = chi2_gof(cell_counts(bad.token, d), p0, alpha=ALPHA)
    assert control.reject, f"x_off not caught: {control}"


# -- acceptance -------------------------------------------------------------------------------------------


def test_acceptance_is_alpha_star_on_small_laws():
    rng = np.random.default_rng(8)
    for _ in range(60):
        size, k = int(rng.integers(2, 14)), int(rng.integers(2, 9))
        a = rng.choice([0.1, 0.3, 1.0, 3.0])
        p, q = rng.dirichlet(np.full(size, a)), rng.dirichlet(np.full(size, a))
        s, P = device_setup(p, q, k)
        assert abs(optimal_acceptance(p, q, k) - float(od.acceptance(s, P)[0])) < TOL, (p, q, k)


def peaked_rows(seed, rows=4, size=4096):
    """Rows like an LLM pair's: a log-normal target, the draft its noisy copy."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, size)) * 3.0
    p = np.exp(z - z.max(1, keepdims=True))
    q = np.exp(z + rng.standard_normal((rows, size)) - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_acceptance_equals_the_numpy_rules_on_peaked_rows(k):
    """Rows of V = 4096: the numpy rule's acceptance (its own gap to alpha* is below 1e-12 on such rows) to 1e-9.
    Without the refinement round (``REFINE_ROUNDS = 0``) two of these rows lose 1.1e-5 (k = 2) and 8.1e-7
    (k = 8): whole buckets beside the cut straddle (the negative control below)."""
    p, q = peaked_rows(k)
    P, Q = t(p), t(q)
    got = od.acceptance(od.setup(P, Q, k), P).numpy()
    want = np.array([npo.acceptance(a, b, k) for a, b in zip(p, q)])
    assert np.all(np.abs(want - got) < TOL), want - got


def test_without_the_refinement_round_a_straddling_bucket_is_seen(monkeypatch):
    """Negative control of the test above: its check sees the acceptance lost when no group is refined."""
    monkeypatch.setattr(od, "REFINE_ROUNDS", 0)
    p, q = peaked_rows(2)
    P = t(p)
    got = float(od.acceptance(od.setup(P[2:3], t(q[2:3]), 2), P[2:3])[0])
    assert npo.acceptance(p[2], q[2], 2) - got > 1e-6


def test_the_token_rule_agrees_with_the_group_race_at_real_sizes():
    """What makes ``x`` exact at any size (the enumeration above reaches V = 6 only): in every group the tokens'
    pass-1 draft mass sums to the group's (``sum q_i theta_i = theta_G Q_G``), their selection law to the
    group's, and ``x`` sums to 1; on rows of V = 4096 where groups spread their theta over their tokens."""
    p, q = peaked_rows(2, rows=4)
    P, Q = t(p), t(q)
    s = od.setup(P, Q, 4)
    by_group = lambda v: torch.zeros_like(s.x_groups).scatter_add_(1, s.group, v)  # noqa: E731
    Qg = by_group(Q)
    assert (by_group(Q * s.theta) - s.theta_groups * Qg).abs().max() < 1e-15
    assert (by_group(s.x) - s.x_groups).abs().max() < 1e-15
    assert (s.x.sum(-1) - 1).abs().max() < 1e-12
    spread = (s.theta != s.theta_groups.gather(1, s.group)) & (Q > 0)
    assert int(spread.sum()) > 100  # tokens whose theta is their own, not their group's
