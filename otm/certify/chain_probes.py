"""The chain certification's probes (:mod:`otm.certify.chain`), run in every layout: a uniform of
exactly 0, a drafted token of zero draft mass, and vocabularies at tile edges (real uniforms and
uniforms at the largest float32 below 1), each a :class:`Case`.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np

from .chain_layouts import Malformed, row_problem
from .report import Case

BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))  # 1 - 2^-24, the largest float32 uniform

# -- probes -------------------------------------------------------------------------------------------


@contextmanager
def _uniforms(value: float, record: list):
    """torch.rand / rand_like / Tensor.uniform_ answer ``value`` (record notes each use)."""
    import torch

    def rand(*size, generator=None, dtype=None, device=None, **kw):
        record.append("rand")
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return torch.full(tuple(shape), value, dtype=dtype or torch.get_default_dtype(), device=device)

    def rand_like(t, *a, dtype=None, **kw):
        record.append("rand_like")
        return torch.full_like(t, value, dtype=dtype or t.dtype)

    def uniform_(self, *a, **kw):
        record.append("uniform_")
        return self.fill_(value)

    with mock.patch.object(torch, "rand", rand), mock.patch.object(torch, "rand_like", rand_like), \
            mock.patch.object(torch.Tensor, "uniform_", uniform_):
        yield


def _probe_call(call, kernel, contexts, dp, ids, tp, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return call(kernel, contexts, dp, ids, tp, gen, np.random.default_rng(seed))


def boundary_probe(call, kernel, L: int, notes: list) -> Case:
    """u = 0 exactly; drafts of zero target mass (must not be accepted) and of zero draft mass (reported)."""
    case = Case("boundary u = 0", "chain", 1, setting={"length": L})
    V = 4
    p = np.array([0.0, 0.5, 0.5, 0.0])
    q = np.array([0.7, 0.1, 0.1, 0.1])
    dp = np.broadcast_to(q, (1, L, V)).copy()
    tp = np.broadcast_to(p, (1, L + 1, V)).copy()
    ids = np.zeros((1, L), dtype=np.int64)  # token 0: p = 0 < q
    used: list = []
    try:
        with _uniforms(0.0, used):
            out = _probe_call(call, kernel, [(1,)], dp, ids, tp, 7)
        why = row_problem(out[0], ids[0], V)
        if why is not None:
            case.passed, case.reason = False, f"u = 0: {why}"
        elif (out[0] != -1).sum() >= 2:  # the first draft was accepted
            case.passed, case.reason = False, ("a uniform of exactly 0 accepts a draft of zero target mass "
                                               "(the u <= ratio bug: accept only u < p/q)")
        elif p[out[0, 0]] - q[out[0, 0]] <= 0:
            case.passed, case.reason = False, f"u = 0: recovered token {int(out[0, 0])} has zero residual mass"
        if not used:
            notes.append("boundary probe: the kernel drew no uniform through torch.rand / rand_like / uniform_, "
                         "so u = 0 could not be fed (the probe ran with its own randomness)")
    except Malformed as exc:
        case.passed, case.reason = False, f"u = 0: {exc}"
    except Exception as exc:  # noqa: BLE001 - a crash on a legal input is a finding
        case.passed, case.reason = False, f"u = 0: the kernel raised {type(exc).__name__}: {str(exc)[:120]}"
    return case


def zero_draft_probe(call, kernel, L: int, notes: list) -> Case:
    """q = 0 at the drafted token (never produced by sampled drafts): reported; refutes only when a token of
    zero target mass is emitted."""
    case = Case("zero draft mass q = 0", "chain", 1, setting={"length": L})
    V = 4
    ids = np.zeros((1, L), dtype=np.int64)
    for label, pz in (("p > 0 = q", np.array([0.2, 0.4, 0.4, 0.0])), ("p = q = 0", np.array([0.0, 0.5, 0.5, 0.0]))):
        qz = np.array([0.0, 0.3, 0.3, 0.4])
        dpz = np.broadcast_to(qz, (1, L, V)).copy()
        tpz = np.broadcast_to(pz, (1, L + 1, V)).copy()
        try:
            out = _probe_call(call, kernel, [(1,)], dpz, ids, tpz, 8)
            why = row_problem(out[0], ids[0], V)
            if why is not None:
                what = f"returns a malformed row: {why}"
                case.passed, case.reason = False, f"a draft of zero draft mass ({label}): {why}"
            else:
                what = "accepts it" if (out[0] != -1).sum() >= 2 else f"rejects it, emits {int(out[0, 0])}"
            if why is None and ((out[0] != -1).sum() >= 2 and pz[0] == 0 or pz[out[0, 0]] == 0):
                case.passed = False
                case.reason = f"a draft of zero draft mass ({label}): emits a token of zero target mass"
        except Exception as exc:  # noqa: BLE001
            what = f"raises {type(exc).__name__}: {str(exc)[:80]}"
        notes.append(f"zero-mass draft (q = 0 at the drafted token, {label}): the kernel {what}")
    return case


def tile_probe(call, kernel, L: int, vocabs, seed: int) -> Case:
    """Vocabularies at tile edges: every id in [0, V) or -1, padding well formed (real and near-1 uniforms)."""
    import torch

    case = Case("tile edges V=" + ",".join(str(v) for v in vocabs), "chain", 1, setting={"length": L})
    B = 4
    for V in vocabs:
        g = torch.Generator().manual_seed(seed + V)
        # peaked random laws (full support) with mass at the top ids, where an inverse CDF that overruns lands
        logits = torch.rand(B, 2 * L + 1, V, generator=g) * 12
        logits[:, : L + 1, -3:] += 6
        laws = torch.softmax(logits, -1).to(torch.float64).numpy()
        tp, dp = np.ascontiguousarray(laws[:, : L + 1]), np.ascontiguousarray(laws[:, L + 1:])
        ids = torch.randint(V, (B, L), generator=g).numpy()
        for kind in ("real uniforms", "uniforms 1 - 2^-24"):
            try:
                if kind == "real uniforms":
                    out = _probe_call(call, kernel, [(0,)] * B, dp, ids, tp, seed + V)
                else:
                    with _uniforms(BELOW_ONE, []):
                        out = _probe_call(call, kernel, [(0,)] * B, dp, ids, tp, seed + V)
                for b in range(B):
                    why = row_problem(out[b], ids[b], V)
                    if why is not None:
                        case.passed, case.reason = False, f"V = {V}, {kind}: {why}"
                        return case
            except Malformed as exc:
                case.passed, case.reason = False, f"V = {V}, {kind}: {exc}"
                return case
            except Exception as exc:  # noqa: BLE001
                case.passed = False
                case.reason = f"V = {V}, {kind}: the kernel raised {type(exc).__name__}: {str(exc)[:100]}"
                return case
    return case



__all__ = ["BELOW_ONE", "boundary_probe", "tile_probe", "zero_draft_probe"]
