r"""A correct chain kernel in FlashInfer's layout and a catalogue of realistic chain-kernel bugs, each
with its exact law: the negative controls by which ``docs/audit.md`` ("How strong are the engines'
own tests?") measures the engines' own test suites (:mod:`otm.certify.engine_suites`) and
``otm certify`` (:func:`otm.certify.chain.certify_chain`).

Layout "flashinfer" (``docs/certify.md``; FlashInfer's ``chain_speculative_sampling`` has this shape)::

    kernel(draft_probs [B, L, V] float32, draft_token_ids [B, L] int, target_probs [B, L + 1, V]
           float32, *, generator=None) -> output_token_ids [B, L + 1] int32

``target_probs[:, i]`` is the target's law at position ``i`` given the draft tokens before ``i``
(row ``L`` gives the bonus token); the output holds the accepted drafts, then the recovered or bonus
token, then ``-1``. The kernel draws its own uniforms from ``generator``.

:func:`reference_chain` accepts draft ``i`` when ``u * q_i(d_i) < p_i(d_i)`` (float64, ``u`` in
[0, 1): never a token of target probability 0), draws the recovered token from the normalised
residual ``(p_i - q_i)_+`` and the bonus token from row ``L``, by inverse CDF in float64.

:data:`CHAIN_BUGS` maps each bug's name to a :class:`ChainBug`: its kernel (the reference with one
realistic fault), a one-line description, where an engine shipped it (``docs/audit.md`` sources), and
its exact law (:func:`law_given_path`). :func:`tv_first_tokens` gives the total variation, exact,
between a kernel's law and the target's on a :class:`ChainInstance` (a target and a draft model over
all prefixes, so ``target_probs[:, i]`` depends on the drafted prefix as it does in an engine).

Exact here means: the laws are computed from the float32 inputs in float64; the two float32 bugs
(``u_le_ratio``, ``tile_edge_recovered_id``) by counting the float32 grid of ``torch.rand``
(multiples of 2^-24), so their stated TV includes the float32 effects.

>>> inst = random_instance(V=6, L=2, seed=0)
>>> bool(tv_first_tokens("reference", inst) < 1e-12)
True
>>> bool(tv_first_tokens("ratio_of_previous_position", inst) > 0.01)
True
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..laws import OtmError

GRID32 = 2 ** 24
"""``torch.rand(..., dtype=torch.float32)`` draws k / 2^24, k uniform in [0, 2^24)."""


# -- the kernels (torch) ------------------------------------------------------------------------------


def _check(draft_probs, draft_token_ids, target_probs) -> tuple[int, int, int]:
    if draft_probs.dim() != 3:
        raise OtmError(f"draft_probs must be [B, L, V], got shape {tuple(draft_probs.shape)}")
    B, L, V = draft_probs.shape
    if tuple(draft_token_ids.shape) != (B, L):
        raise OtmError(f"draft_token_ids must be [B, L] = [{B}, {L}], got {tuple(draft_token_ids.shape)}")
    if tuple(target_probs.shape) != (B, L + 1, V):
        raise OtmError(f"target_probs must be [B, L + 1, V] = [{B}, {L + 1}, {V}], got {tuple(target_probs.shape)}")
    if L < 1:
        raise OtmError("a chain needs L >= 1 draft tokens")
    return B, L, V


def serial_cdf32(weights32: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``weights32 / weights32.sum()`` as a one-thread-per-row loop computes them in
    float32: normalised in float32, then summed one token after another in float32 (numpy's
    ``cumsum`` of float32 accumulates in float32, unlike torch's CPU ``cumsum``, which uses float64).
    Once the running sum nears 1, a token below half a float32 ulp of it (3e-8) adds nothing."""
    w = np.asarray(weights32, dtype=np.float32)
    total = w.sum(axis=-1, dtype=np.float32, keepdims=True)
    total = np.where(total > 0, total, np.float32(1))
    return np.cumsum(w / total, axis=-1, dtype=np.float32)


def _inverse_cdf64(weights, u, *, normalise: bool = True):
    """Token index ``i`` with ``c[i - 1] <= x < c[i]``, ``c`` the float64 cumulative sums of ``weights``
    and ``x = u * c[-1]`` (``x = u`` when ``normalise`` is False: the "not renormalised" fault). An
    ``x`` at or past ``c[-1]`` (rounding, or the fault) gives the last token of positive weight."""
    import torch

    c = torch.cumsum(weights, dim=-1)
    x = u * c[:, -1] if normalise else u
    idx = torch.searchsorted(c, x.unsqueeze(1).contiguous(), right=True).squeeze(1)
    V = weights.shape[-1]
    last = V - 1 - torch.argmax((weights.flip(-1) > 0).to(torch.int8), dim=-1)
    return torch.where(idx >= V, last, idx)


def _chain(draft_probs, draft_token_ids, target_probs, generator, bug: str | None):
    import torch

    B, L, V = _check(draft_probs, draft_token_ids, target_probs)
    q = draft_probs.to(torch.float64)
    p = target_probs.to(torch.float64)
    d = draft_token_ids.long()
    rows = torch.arange(B)
    pd = p[:, :L].gather(2, d.unsqueeze(2)).squeeze(2)
    qd = q.gather(2, d.unsqueeze(2)).squeeze(2)

    # -- acceptance of each draft position --
    if bug == "u_le_ratio":
        u = torch.rand(B, L, generator=generator, dtype=torch.float32)
        p32 = target_probs[:, :L].float().gather(2, d.unsqueeze(2)).squeeze(2)
        q32 = draft_probs.float().gather(2, d.unsqueeze(2)).squeeze(2)
        accept = u <= p32 / q32
    else:
        if bug == "shared_uniform":
            u = torch.rand(B, 1, generator=generator, dtype=torch.float64).expand(B, L)
        else:
            u = torch.rand(B, L, generator=generator, dtype=torch.float64)
        if bug == "draft_prob_wrong_token":
            qd = q.amax(dim=2)
        if bug == "ratio_of_previous_position":
            pd = torch.cat([pd[:, :1], pd[:, :-1]], dim=1)
            qd = torch.cat([qd[:, :1], qd[:, :-1]], dim=1)
        accept = u * qd < pd
    n = accept.long().cumprod(dim=1).sum(dim=1)  # leading accepted drafts
    stop = n < L
    n_row = n.clamp(max=L - 1)

    # -- the law of the last emitted token (recovered at n < L, bonus at n = L) --
    if bug == "tile_edge_recovered_id":
        p32 = target_probs.float()
        q32 = draft_probs.float()
        res32 = (p32[rows, n_row] - q32[rows, n_row]).clamp(min=0)
        w32 = torch.where(stop.unsqueeze(1), res32, p32[rows, n]).numpy()
        c = torch.from_numpy(serial_cdf32(w32))
        u_last = torch.rand(B, 1, generator=generator, dtype=torch.float32)
        token = torch.searchsorted(c, u_last, right=True).squeeze(1)  # V when u_last >= c[-1]
    else:
        nxt = n_row + 1 if bug == "residual_wrong_position" else n_row
        res = (p[rows, nxt] - q[rows, n_row]).clamp(min=0)
        if bug == "recovered_from_target":
            res = p[rows, n_row]
        bonus_row = L - 1 if bug == "bonus_from_last_accepted" else L
        fallback = p[rows, nxt]
        res = torch.where(res.sum(dim=1, keepdim=True) > 0, res, fallback)
        w = torch.where(stop.unsqueeze(1), res, p[:, bonus_row])
        u_last = torch.rand(B, generator=generator, dtype=torch.float64)
        token = _inverse_cdf64(w, u_last, normalise=bug != "residual_not_renormalised")

    out = torch.full((B, L + 1), -1, dtype=torch.int32)
    pos = torch.arange(L + 1).unsqueeze(0)
    dpad = torch.cat([d, torch.zeros(B, 1, dtype=torch.long)], dim=1)
    out = torch.where(pos < n.unsqueeze(1), dpad.to(torch.int32), out)
    out[rows, n] = token.to(torch.int32)
    return out


def reference_chain(draft_probs, draft_token_ids, target_probs, *, generator=None):
    """The correct chain kernel (layout "flashinfer"): accept ``d_i`` iff ``u_i * q_i(d_i) < p_i(d_i)``,
    then the recovered token from ``norm((p_n - q_n)_+)`` or the bonus token from ``p_L``, ``-1``
    after it. Float64 arithmetic, uniforms ``torch.rand(B, L)`` and ``torch.rand(B)`` (float64) from
    ``generator``."""
    return _chain(draft_probs, draft_token_ids, target_probs, generator, None)


def _bug_kernel(name: str) -> Callable:
    def kernel(draft_probs, draft_token_ids, target_probs, *, generator=None):
        return _chain(draft_probs, draft_token_ids, target_probs, generator, name)

    kernel.__name__ = kernel.__qualname__ = f"chain_{name}"
    kernel.__doc__ = f"The reference chain kernel with the planted bug {name!r} (otm.certify.chain_bugs)."
    return kernel


# -- exact laws (numpy) -------------------------------------------------------------------------------


def _accept_probs(bug: str | None, P: np.ndarray, Q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """P(stop after exactly n accepted drafts), n = 0..L, given the drafted path ``d``."""
    L = d.size
    idx = np.arange(L)
    pd = P[idx, d]
    qd = Q[idx, d]
    if bug == "u_le_ratio":
        r32 = (P[idx, d].astype(np.float32) / Q[idx, d].astype(np.float32)).astype(np.float64)
        a = np.minimum(GRID32, np.floor(r32 * GRID32) + 1) / GRID32
    else:
        if bug == "draft_prob_wrong_token":
            qd = Q.max(axis=1)
        if bug == "ratio_of_previous_position":
            pd = np.concatenate([pd[:1], pd[:-1]])
            qd = np.concatenate([qd[:1], qd[:-1]])
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(qd > 0, pd / np.where(qd > 0, qd, 1.0), np.where(pd > 0, np.inf, 0.0))
        a = np.minimum(1.0, r)
    if bug == "shared_uniform":  # one u: draft i accepted iff u < min(r_0..r_i)
        reach = np.concatenate([[1.0], np.minimum.accumulate(a)])
    else:
        reach = np.concatenate([[1.0], np.cumprod(a)])
    stops = reach[:-1] - reach[1:]
    return np.concatenate([stops, reach[-1:]])


def _grid_law32(weights32: np.ndarray) -> np.ndarray:
    """Exact law over V + 1 cells (the last: id V) of ``searchsorted(serial_cdf32(w), u, right=True)``
    for ``u`` on the float32 grid of ``torch.rand``."""
    c = serial_cdf32(weights32[None])[0].astype(np.float64)
    below = np.minimum(GRID32, np.ceil(c * GRID32))  # grid points u < c[i]
    counts = np.diff(np.concatenate([[0.0], below, [GRID32]]))
    return counts / GRID32


def _normalised(w: np.ndarray) -> np.ndarray:
    return w / w.sum()


def _last_law(bug: str | None, P: np.ndarray, Q: np.ndarray, d: np.ndarray, n: int) -> np.ndarray:
    """Law over V + 1 cells (the last: an id V) of the last emitted token after ``n`` accepted drafts."""
    L, V = d.size, P.shape[1]
    out = np.zeros(V + 1)
    if bug == "tile_edge_recovered_id":
        w = (P[n].astype(np.float32) - Q[n].astype(np.float32)).clip(min=0) if n < L else P[L].astype(np.float32)
        return _grid_law32(w)
    if n == L:
        out[:V] = P[L - 1 if bug == "bonus_from_last_accepted" else L]
        return out
    nxt = n + 1 if bug == "residual_wrong_position" else n
    res = np.clip(P[nxt] - Q[n], 0, None)
    if bug == "recovered_from_target":
        res = P[n].copy()
    if res.sum() <= 0:
        res = P[nxt].copy()
    if bug == "residual_not_renormalised":
        c = np.cumsum(res)
        law = np.diff(np.concatenate([[0.0], np.minimum(c, 1.0)]))
        last = int(np.flatnonzero(res > 0)[-1])
        law[last] += 1.0 - law.sum()
        out[:V] = law
        return out
    out[:V] = _normalised(res)
    return out


def law_given_path(bug: str | None, P: np.ndarray, Q: np.ndarray, d) -> np.ndarray:
    """Exact law of a kernel's output given its inputs: ``law[n, t]`` = P(n drafts accepted, then token
    ``t``), ``t = V`` standing for an out-of-range id. ``P`` [L + 1, V] and ``Q`` [L, V] are the rows
    passed as ``target_probs[b]`` and ``draft_probs[b]``, ``d`` the drafted tokens; ``bug`` a name of
    :data:`CHAIN_BUGS` or None / "reference"."""
    bug = None if bug == "reference" else bug
    P = np.asarray(P, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    d = np.asarray(d, dtype=np.int64)
    stops = _accept_probs(bug, P, Q, d)
    return np.stack([stops[n] * _last_law(bug, P, Q, d, n) for n in range(d.size + 1)])


# -- instances: a target and a draft model over all prefixes ------------------------------------------


def _grid_row(w: np.ndarray) -> np.ndarray:
    """``w`` normalised and rounded to multiples of 2^-24 summing to exactly 1: exact in float32, and
    the float64 law the float32 tensor holds is the law itself."""
    k = np.floor(_normalised(w) * GRID32)
    k[np.argmax(k)] += GRID32 - k.sum()
    return k / GRID32


@dataclass(frozen=True)
class ChainInstance:
    """A target ``P[prefix]`` for every prefix of length 0..L and a draft ``Q[prefix]`` for length
    0..L-1 over V tokens (rows exact in float32, summing to 1)."""

    V: int
    L: int
    P: dict
    Q: dict

    def rows(self, d) -> tuple[np.ndarray, np.ndarray]:
        d = tuple(int(x) for x in d)
        return (np.stack([self.P[d[:i]] for i in range(self.L + 1)]),
                np.stack([self.Q[d[:i]] for i in range(self.L)]))

    def tensors(self, paths) -> tuple:
        """``(draft_probs, draft_token_ids, target_probs)`` for the drafted ``paths`` [B, L]."""
        import torch

        paths = np.asarray(paths, dtype=np.int64).reshape(-1, self.L)
        unique, inverse = np.unique(paths, axis=0, return_inverse=True)
        Ps, Qs = zip(*(self.rows(path) for path in unique))
        inverse = inverse.reshape(-1)
        return (torch.tensor(np.stack(Qs)[inverse], dtype=torch.float32), torch.tensor(paths),
                torch.tensor(np.stack(Ps)[inverse], dtype=torch.float32))

    @classmethod
    def from_rows(cls, target_rows, draft_rows) -> "ChainInstance":
        """The instance whose laws depend on the position only (as in the engines' suites): target row
        ``i`` at every prefix of length ``i``, each row rounded to the 2^-24 grid (a change of at most
        6e-8 per probability)."""
        P_rows = np.asarray(target_rows, dtype=np.float64)
        Q_rows = np.asarray(draft_rows, dtype=np.float64)
        L, V = Q_rows.shape
        if P_rows.shape != (L + 1, V):
            raise OtmError(f"target rows must be [L + 1, V] = [{L + 1}, {V}], got {P_rows.shape}")
        P = {prefix: _grid_row(P_rows[n]) for n in range(L + 1) for prefix in itertools.product(range(V), repeat=n)}
        Q = {prefix: _grid_row(Q_rows[n]) for n in range(L) for prefix in itertools.product(range(V), repeat=n)}
        return cls(V, L, P, Q)

    def draft_paths(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draft chains drawn from Q, [n, L]."""
        out = np.empty((n, self.L), dtype=np.int64)
        for b in range(n):
            prefix: tuple = ()
            for i in range(self.L):
                prefix += (int(rng.choice(self.V, p=self.Q[prefix])),)
            out[b] = prefix
        return out


def random_instance(V: int = 6, L: int = 2, seed: int = 0, masked: int = 1, closeness: float = 0.0) -> ChainInstance:
    """Rows ``rand^3 + 0.001`` normalised (TileOPs' recipe: peaked, unlike a flat ``rand``), each
    target row with its ``masked`` least likely tokens at probability 0 (a top-k-masked target);
    draft rows ``closeness * P + (1 - closeness) * rand^3`` normalised, with full support (a good
    draft has ``closeness`` near 1)."""
    if not 0 <= closeness < 1:
        raise OtmError(f"closeness must lie in [0, 1), got {closeness!r}")
    rng = np.random.default_rng(seed)
    P, Q = {}, {}
    for length in range(L + 1):
        for prefix in itertools.product(range(V), repeat=length):
            w = rng.random(V) ** 3 + 1e-3
            if masked:
                w[np.argsort(w)[:masked]] = 0.0
            P[prefix] = _grid_row(w)
            if length < L:
                own = _normalised(rng.random(V) ** 3 + 1e-3)
                Q[prefix] = _grid_row(closeness * P[prefix] + (1 - closeness) * own)
    return ChainInstance(V, L, P, Q)


def law_first_tokens(bug: str | None, inst: ChainInstance) -> dict:
    """Exact law of the first ``L + 1`` tokens a decoder emits when one kernel call on a chain drafted
    from Q is completed by sampling the target: ``{tokens: prob}``, a token ``V`` for an
    out-of-range id (after which nothing is continued)."""
    V, L = inst.V, inst.L
    law: dict = {}

    def add(seq: tuple, mass: float) -> None:
        if len(seq) == L + 1 or (seq and seq[-1] == V):
            law[seq] = law.get(seq, 0.0) + mass
            return
        row = inst.P[seq]
        for t in np.flatnonzero(row):
            add(seq + (int(t),), mass * row[t])

    for d in itertools.product(range(V), repeat=L):
        w = 1.0
        for i in range(L):
            w *= inst.Q[d[:i]][d[i]]
        if w == 0:
            continue
        P, Q = inst.rows(d)
        out = law_given_path(bug, P, Q, np.array(d))
        for n, t in zip(*np.nonzero(out)):
            add(tuple(d[:n]) + (int(t),), w * out[n, t])
    return law


def target_first_tokens(inst: ChainInstance) -> dict:
    """The target's law of the first ``L + 1`` tokens."""
    law: dict = {}
    for seq in itertools.product(range(inst.V), repeat=inst.L + 1):
        m = 1.0
        for i in range(inst.L + 1):
            m *= inst.P[seq[:i]][seq[i]]
        if m > 0:
            law[seq] = m
    return law


def tv_first_tokens(bug: str | None, inst: ChainInstance) -> float:
    """Total variation, exact, between the first ``L + 1`` tokens under ``bug`` (one kernel call
    completed by the target) and under the target."""
    a, b = law_first_tokens(bug, inst), target_first_tokens(inst)
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


# -- the tile-edge bug at a realistic vocabulary -----------------------------------------------------


def long_tail_rows(V: int = 128_256, head: int = 17, head_mass: float = 0.99, seed: int = 0) -> np.ndarray:
    """A realistic peaked next-token law over a Llama-3 vocabulary: ``head_mass`` on a frequent
    (low-id) token, the rest spread over every other token with log-normal weights (most below 1e-7)."""
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 1.5, V)
    w[head] = 0.0
    w *= (1 - head_mass) / w.sum()
    w[head] = head_mass
    return w.astype(np.float32)


def tile_edge_firing(weights32: np.ndarray) -> float:
    """Exact probability that the serial float32 inverse CDF of ``tile_edge_recovered_id`` returns id V
    (the uniform at or above the last cumulative sum) on the law ``weights32``."""
    return float(_grid_law32(np.asarray(weights32, dtype=np.float32))[-1])


# -- the catalogue ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainBug:
    name: str
    description: str
    shipped: str
    kernel: Callable

    def law(self, P, Q, d) -> np.ndarray:
        return law_given_path(self.name, P, Q, d)


_CATALOGUE = [
    ("residual_wrong_position",
     "recovered token drawn from (p_{i+1} - q_i)_+: the target row one position too far (a logits-slice off by one)",
     "TensorRT-LLM EAGLE-3 sampling, output-distribution bug 'wrong logits slice' (fixed 2026-06)"),
    ("bonus_from_last_accepted",
     "bonus token drawn from p_{L-1}, the last draft position's law, instead of p_L",
     ""),
    ("u_le_ratio",
     "float32 uniforms compared with u <= p/q: a draft of target probability 0 is accepted when u == 0 (2^-24)",
     "SGLang #35771 (coin <= prob, fixed by PR #35798); the same <= / >= in vLLM V1, transformers, gpt-fast"),
    ("residual_not_renormalised",
     "(p - q)_+ handed to an inverse-CDF sampler for normalised laws: u past its mass Z lands on the last "
     "token of positive residual",
     "vLLM v0 clamped the residual instead of handling it exactly ('introduces some drift', its docstring)"),
    ("draft_prob_wrong_token",
     "the ratio divides by the draft's top-token probability max q_i instead of q_i(d_i)",
     "transformers #47932 / #32867: q does not describe the token the draft sampled"),
    ("ratio_of_previous_position",
     "draft i accepted with the ratio of position i - 1 (a loop-carried ratio read before its update)",
     ""),
    ("shared_uniform",
     "one acceptance uniform per request shared by all positions (the recovered-token noise trick applied "
     "to acceptance)",
     "vLLM V1 shares one Exp(1) vector per request for recovered tokens (correct there); TP ranks' randomness "
     "vllm #17498"),
    ("tile_edge_recovered_id",
     "a serial float32 inverse CDF for the recovered/bonus token: once the running sum nears 1, tail tokens "
     "add nothing and a uniform above the last sum returns id V",
     "vLLM GHSA-8wr5-jm2h-8r4f (PR #44744): recovered id >= vocab size at the vocabulary's tail tile"),
    ("recovered_from_target",
     "after a rejection the recovered token is drawn from p_i itself instead of the residual (p_i - q_i)_+",
     "vllm-ascend #7808: block verification's recovered tokens came from the wrong distribution"),
]

CHAIN_BUGS: dict[str, ChainBug] = {name: ChainBug(name, desc, shipped, _bug_kernel(name))
                                   for name, desc, shipped in _CATALOGUE}
"""The planted bugs, in the order of ``docs/audit.md``'s table."""

def diluted_kernel(name: str, eps: float) -> Callable:
    """A kernel that runs bug ``name`` on a fraction ``eps`` of its rows (chosen by its own uniforms)
    and the reference on the rest: its per-call law is ``(1 - eps) ref + eps bug``, so its TV to the
    target is exactly ``eps`` times the bug's (the law is linear in the per-call law). For measuring
    the smallest TV a test detects."""
    if not 0 < eps <= 1:
        raise OtmError(f"eps must lie in (0, 1], got {eps!r}")
    bug = CHAIN_BUGS[name].kernel

    def kernel(draft_probs, draft_token_ids, target_probs, *, generator=None):
        import torch

        pick = torch.rand(draft_probs.shape[0], generator=generator, dtype=torch.float64) < eps
        good = reference_chain(draft_probs, draft_token_ids, target_probs, generator=generator)
        bad = bug(draft_probs, draft_token_ids, target_probs, generator=generator)
        return torch.where(pick.unsqueeze(1), bad, good)

    kernel.__name__ = kernel.__qualname__ = f"chain_{name}_x{eps:g}"
    return kernel


KERNELS: dict[str, Callable] = {"reference": reference_chain, **{b.name: b.kernel for b in CHAIN_BUGS.values()}}
"""Every kernel of this module by name: the reference first."""


__all__ = ["CHAIN_BUGS", "KERNELS", "ChainBug", "ChainInstance", "GRID32", "diluted_kernel", "law_first_tokens",
           "law_given_path", "long_tail_rows", "random_instance", "reference_chain", "serial_cdf32",
           "target_first_tokens", "tile_edge_firing", "tv_first_tokens"]
