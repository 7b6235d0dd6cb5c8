r"""The engines' own chain-kernel tests, their procedures ported (not their code) to kernels of the
layout "flashinfer" (:mod:`otm.certify.chain_bugs`), so that ``docs/audit.md`` can measure which
realistic bugs each would catch.

Each suite is ``suite(kernel, *, seed) -> (passed, detail)``, at the engine's own sample budget and
thresholds, seeded (the engines' tests draw their inputs unseeded, except TileOPs'). What each ports:

* :func:`vllm_suite` -- vLLM ``tests/v1/sample/test_rejection_sampler.py``,
  ``test_rejection_sampling_approximates_target_distribution`` (vllm-project/vllm at
  004fce2d0b6ad5146fa0f32b5e777dc8f5112d80): V = 10, k = 2 drafts drawn i.i.d. from one draft law,
  the same target law at every position; the emitted tokens of the k draft columns (the bonus column
  dropped; ``-1`` outside the histogram's range, an id V inside its closed last bin) at
  n = 10, 100, ..., 100,000 rows; L2 distance to the target must shrink more than 20 times as much,
  from n = 10 to n = 100,000, as the mean distance to 100 random reference laws.
* :func:`flashinfer_suite` -- FlashInfer ``tests/utils/test_sampling.py::test_chain_speculative_sampling``
  and ``tests/trace/test_chain_speculative_sampling_reference_correctness.py`` (flashinfer-ai/flashinfer
  at fb28d7242b3506a2348265962041acc1fb56cca4): batch {1, 99, 989} x V {111, 32000, 128256} x
  L {1, 3, 5, 7} x one-hot target or not, 10 calls each. Random ``rand``-normalised laws with
  uniformly random draft ids: every id in [0, V), mismatches with the drafts contiguous and ``-1``
  after the first; one-hot targets that agree with the drafts: the output equals them exactly.
  No statistical check exists in that version (nor in the history of its test files). The CPU
  cannot hold [989, 8, 128256] in float64: the batch is cut so that B (L + 1) V <= ``max_elements``
  (4,194,304 by default), which keeps every case and cuts rows at V >= 32000.
* :func:`tileops_suite` -- TileOPs ``tests/ops/test_sampling.py::test_chain_speculative_sampling``
  (tile-ai/TileOPs at 00a6672450253e0dd61bfb0190b1abdd444ae971): 65,536 rows, N = 2 drafts drawn
  from their draft rows, V = 16, rows ``rand^3`` normalised; per-bin ``|count - n p| <= 6 sigma + 5``
  (0 for p = 0) on: the drawn token after each stop (residual, or row N after a whole chain), the
  first token (row 0), and the accepted count (law of the products of ``sum min(p, q)``); the accepted
  prefix equals the drafts, ``-1`` after the drawn token; the same seed gives the same output.
* :func:`transformers_suite` -- transformers ``tests/generation/test_utils.py``
  ``UtilsFunctionsTest::test_speculative_sampling`` (huggingface/transformers at
  cf63921b9648e760a9a72a3c84bf797f17d1e140): one fixed case, V = 10, three near-one-hot candidates
  1, 4, 5 where the target agrees on 1 and 4 and puts all its mass on 8 at the third position:
  the output must be [1, 4, 8] (n_matches = 2).

A suite whose kernel raises fails with the exception as its detail.
"""

from __future__ import annotations

import math
from typing import Callable

from ..laws import OtmError


def _call(kernel: Callable, draft_probs, draft_ids, target_probs, generator):
    out = kernel(draft_probs, draft_ids, target_probs, generator=generator)
    return out[0] if isinstance(out, tuple) else out


def _guard(suite):
    def run(kernel, *, seed: int = 0, **options):
        try:
            return suite(kernel, seed=seed, **options)
        except OtmError:
            raise
        except Exception as exc:  # a crash of the kernel (or of the test on its output) fails the suite
            return False, f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    run.__name__ = suite.__name__
    run.__doc__ = suite.__doc__
    return run


# -- vLLM ---------------------------------------------------------------------------------------------


def _vllm_inputs(g, V: int, n_ref: int):
    import torch

    draft = torch.softmax(torch.rand(V, generator=g), dim=-1)
    target = torch.softmax(torch.rand(V, generator=g), dim=-1)
    reference = torch.softmax(torch.rand(n_ref, V, generator=g), dim=-1)
    return draft, target, reference


@_guard
def vllm_suite(kernel, *, seed: int = 0, sample_sizes=(10, 100, 1_000, 10_000, 100_000)):
    """vLLM's distance-shrinks test (module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    kg = torch.Generator().manual_seed(seed + 1)
    V, k, n_ref = 10, 2, 100
    draft, target, reference = _vllm_inputs(g, V, n_ref)
    d_target, d_reference = [], []
    for n in sample_sizes:
        ids = torch.multinomial(draft.expand(n, V), k, replacement=True, generator=g)
        out = _call(kernel, draft.expand(n, k, V).contiguous(), ids, target.expand(n, k + 1, V).contiguous(), kg)
        tokens = out[:, :-1].flatten().to(torch.float32)
        est = torch.histogram(tokens, bins=V, range=(0.0, float(V)), density=True).hist
        d_reference.append(torch.dist(reference, est).item() / n_ref)
        d_target.append(torch.dist(target, est).item())
    gain_target = d_target[0] / d_target[-1]
    gain_reference = d_reference[0] / d_reference[-1]
    passed = bool(gain_target > 20 * gain_reference)
    return passed, (f"L2 to target {d_target[0]:.4f} -> {d_target[-1]:.5f} (x{gain_target:.1f}), to references "
                    f"x{gain_reference:.2f}; needs > 20 x {gain_reference:.2f}")


# -- FlashInfer ---------------------------------------------------------------------------------------


def _flashinfer_case(kernel, B, V, L, onehot, trials, g, kg) -> str | None:
    import torch

    draft = torch.rand(B, L, V, generator=g)
    draft = draft / draft.sum(-1, keepdim=True)
    ids = torch.randint(V, (B, L), generator=g)
    if not onehot:
        target = torch.rand(B, L + 1, V, generator=g)
        target = target / target.sum(-1, keepdim=True)
    else:
        target_ids = torch.randint(V, (B, L + 1), generator=g)
        target_ids[:, :L] = ids
        target = torch.zeros(B, L + 1, V)
        target.scatter_(2, target_ids.unsqueeze(-1), 1.0)
    for _ in range(trials):
        out = _call(kernel, draft, ids, target, kg)
        if tuple(out.shape) != (B, L + 1):
            return f"shape {tuple(out.shape)} != {(B, L + 1)}"
        if onehot:
            if not torch.equal(out.long(), target_ids):
                return f"one-hot target: output {out[0].tolist()} != {target_ids[0].tolist()} (B={B} V={V} L={L})"
            continue
        if not bool((out[out >= 0] < V).all()):
            return f"id {int(out.max())} >= V = {V} (B={B} L={L})"
        mismatch = out[:, :-1].long() != ids
        for row in range(B):
            idx = torch.nonzero(mismatch[row]).flatten()
            if idx.numel():
                if not bool((idx[1:] == idx[:-1] + 1).all()):
                    return f"mismatches not contiguous: {out[row].tolist()} vs drafts {ids[row].tolist()}"
                if not bool((out[row, idx[0] + 1:] == -1).all()):
                    return f"no -1 after the first mismatch: {out[row].tolist()}"
    return None


def _flashinfer_trace_case(kernel, B, L, V, g, kg) -> str | None:
    import torch

    ids = torch.randint(V, (B, L), generator=g)
    bonus = torch.randint(V, (B,), generator=g)
    draft = torch.zeros(B, L, V).scatter_(2, ids.unsqueeze(-1), 1.0)
    target_ids = torch.cat([ids, bonus.unsqueeze(1)], dim=1)
    target = torch.zeros(B, L + 1, V).scatter_(2, target_ids.unsqueeze(-1), 1.0)
    out = _call(kernel, draft, ids, target, kg)
    if not torch.equal(out.long(), target_ids):
        return f"one-hot draft and target: {out[0].tolist()} != {target_ids[0].tolist()}"
    return None


@_guard
def flashinfer_suite(kernel, *, seed: int = 0, batches=(1, 99, 989), vocabs=(111, 32000, 128256),
                     lengths=(1, 3, 5, 7), trials: int = 10, max_elements: int = 2 ** 22):
    """FlashInfer's structural chain tests (module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    kg = torch.Generator().manual_seed(seed + 1)
    rows = 0
    for B in batches:
        for V in vocabs:
            for L in lengths:
                for onehot in (False, True):
                    b = max(1, min(B, max_elements // ((L + 1) * V)))
                    fault = _flashinfer_case(kernel, b, V, L, onehot, trials, g, kg)
                    rows += b * trials
                    if fault:
                        return False, fault
    for B, L, V in ((3, 4, 128), (2, 3, 96)):
        fault = _flashinfer_trace_case(kernel, B, L, V, g, kg)
        if fault:
            return False, fault
    return True, f"{rows} rows structurally valid (ids < V, contiguous mismatches, -1 after); one-hot cases exact"


# -- TileOPs ------------------------------------------------------------------------------------------


def _follows(samples, probs) -> str | None:
    """Each index's count within ``6 sigma + 5`` of its expectation (0 for p = 0); ids outside
    [0, len(probs)) fail."""
    import torch

    n = samples.numel()
    if n == 0:
        return None
    s = samples.long()
    if bool(((s < 0) | (s >= probs.numel())).any()):
        return f"id {int(s[(s < 0) | (s >= probs.numel())][0])} outside [0, {probs.numel()})"
    count = torch.bincount(s, minlength=probs.numel()).double()
    p = probs.double()
    bound = 6 * (n * p * (1 - p)).sqrt() + 5 * (p > 0)
    bad = (count - n * p).abs() > bound
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        return f"bin {i}: count {int(count[i])} vs expected {n * float(p[i]):.1f} (bound {float(bound[i]):.1f}, n={n})"
    return None


def _tileops_inputs(g, N: int, V: int):
    import torch

    draft = torch.rand(N, V, generator=g) ** 3
    draft /= draft.sum(-1, keepdim=True)
    target = torch.rand(N + 1, V, generator=g) ** 3
    target /= target.sum(-1, keepdim=True)
    return draft, target


@_guard
def tileops_suite(kernel, *, seed: int = 0, rows: int = 65_536):
    """TileOPs' chain test (module docstring)."""
    import torch

    n, N, V = rows, 2, 16
    g = torch.Generator().manual_seed(seed)
    draft, target = _tileops_inputs(g, N, V)
    ids = torch.multinomial(draft, n, replacement=True, generator=g).T.contiguous()
    a0, a1 = torch.minimum(draft, target[:N]).sum(-1).double()
    inputs = (draft.expand(n, N, V).contiguous(), ids, target.expand(n, N + 1, V).contiguous())
    out = _call(kernel, *inputs, torch.Generator().manual_seed(seed + 1))
    again = _call(kernel, *inputs, torch.Generator().manual_seed(seed + 1))
    if out.dtype != torch.int32:
        return False, f"output dtype {out.dtype}, not int32"
    num = (out != -1).sum(1) - 1
    pos = torch.arange(N + 1).unsqueeze(0)
    prefix = pos[:, :-1] < num.unsqueeze(1)
    if not torch.equal(out[:, :-1][prefix].long(), ids[prefix]):
        return False, "accepted prefix differs from the drafts"
    if not bool((out[pos > num.unsqueeze(1)] == -1).all()):
        return False, "a token after the drawn one is not -1"
    for stop in range(N + 1):
        w = target[stop] if stop == N else (target[stop] - draft[stop]).clamp_min(0)
        fault = _follows(out[num == stop, stop], w / w.sum())
        if fault:
            return False, f"token after {stop} accepted: {fault}"
    fault = _follows(out[:, 0], target[0])
    if fault:
        return False, f"first token: {fault}"
    fault = _follows(num, torch.stack([1 - a0, a0 * (1 - a1), a0 * a1]))
    if fault:
        return False, f"accepted count: {fault}"
    if not torch.equal(out, again):
        return False, "the same seed gave a different output"
    return True, f"{n} rows: per-bin 6 sigma + 5 on 5 laws, structure, determinism"


# -- transformers -------------------------------------------------------------------------------------


def _transformers_inputs():
    import torch

    lo, hi, inf = -10.0, 10.0, math.inf

    def row(token, fill=lo, value=hi):
        r = [fill] * 10
        if token is not None:
            r[token] = value
        return r

    candidate_logits = torch.tensor([[row(1), row(4), row(5)]])
    new_logits = torch.tensor([[row(1), row(4), row(8, fill=-inf), row(None)]])
    return torch.softmax(candidate_logits, dim=-1), torch.softmax(new_logits, dim=-1)


def suite_rows(suite: str, seed: int = 0):
    """``(target_rows [L + 1, V], draft_rows [L, V])`` (float64 numpy) of a suite's instance at
    ``seed``: the laws by position its statistical check looks at (vLLM: the same row everywhere)."""
    import torch

    if suite == "vllm":
        draft, target, _ = _vllm_inputs(torch.Generator().manual_seed(seed), 10, 100)
        return target.expand(3, 10).double().numpy(), draft.expand(2, 10).double().numpy()
    if suite == "tileops":
        draft, target = _tileops_inputs(torch.Generator().manual_seed(seed), 2, 16)
        return target.double().numpy(), draft.double().numpy()
    if suite == "transformers":
        draft, target = _transformers_inputs()
        return target[0].double().numpy(), draft[0].double().numpy()
    raise OtmError(f"no row instance for suite {suite!r}: vllm, tileops or transformers")


@_guard
def transformers_suite(kernel, *, seed: int = 0):
    """transformers' one fixed case (module docstring)."""
    import torch

    draft, target = _transformers_inputs()
    ids = torch.tensor([[1, 4, 5]])
    out = _call(kernel, draft, ids, target, torch.Generator().manual_seed(seed))
    got = out[0].tolist()
    n_matches = sum(1 for t in got if t != -1) - 1
    passed = got[:3] == [1, 4, 8] and n_matches == 2
    return passed, f"output {got}, n_matches {n_matches} (expected [1, 4, 8, -1], 2)"


SUITES: dict[str, Callable] = {
    "vllm": vllm_suite,
    "flashinfer": flashinfer_suite,
    "tileops": tileops_suite,
    "transformers": transformers_suite,
}
"""The four ported suites by engine."""

__all__ = ["SUITES", "flashinfer_suite", "suite_rows", "tileops_suite", "transformers_suite", "vllm_suite"]
