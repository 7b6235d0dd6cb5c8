"""The exact mode of the chain certification (:mod:`otm.certify.chain`) for transformers' code: the
kernel's randomness (``torch.rand_like``, ``torch.multinomial``) is fed, every draft chain, first
rejection and multinomial token enumerated, so one call's law is computed exactly.
"""

from __future__ import annotations

import inspect
import re
from unittest import mock

import numpy as np

from ..laws import OtmError
from .chain_layouts import Malformed, logits, row_problem, transformers_options

# -- exact mode for transformers' code ----------------------------------------------------------------


def exact_capable(kernel) -> bool:
    """True when ``kernel`` is transformers' code whose uniforms enter only as ``r_i <= probability_ratio``
    (rand_like's argument) and through the count of leading accepts: the exact mode is then exact."""
    try:
        src = inspect.getsource(kernel)
    except (OSError, TypeError):
        return False
    code = "\n".join(line.split("#")[0] for line in src.splitlines())
    return ("r_i = torch.rand_like(probability_ratio)" in code and "is_accepted = r_i <= probability_ratio" in code
            and "((~is_accepted).cumsum(dim=-1) < 1).sum()" in code and len(re.findall(r"\br_i\b", code)) == 2
            and len(re.findall(r"\bis_accepted\b", code)) == 2 and code.count("torch.rand") == 1)


class _Feeder:
    """Answers rand_like / multinomial by forced choices, then by the first possible option (recorded)."""

    def __init__(self, forced: tuple):
        self.forced, self.path, self.weight, self.branches = forced, [], 1.0, []

    def _choose(self, weights: list[float]) -> int:
        d = len(self.path)
        if d < len(self.forced):
            c = self.forced[d]
        else:
            options = [i for i, w in enumerate(weights) if w > 0]
            if not options:
                raise OtmError("the kernel asked for a draw from a law of zero mass")
            c = options[0]
            self.branches.append((d, options[1:]))
        self.path.append(c)
        self.weight *= weights[c]
        return c

    def rand_like(self, ratio, *args, **kwargs):
        import torch

        r = ratio.detach().to(torch.float64).reshape(-1).numpy()
        a = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0)
        n = a.size
        weights = [float(np.prod(a[:j]) * (1.0 - a[j]) if j < n else np.prod(a)) for j in range(n + 1)]
        j = self._choose(weights)
        u = np.full(n, 0.5)
        u[:j] = a[:j] / 2
        if j < n:
            u[j] = (1.0 + a[j]) / 2
        return torch.from_numpy(u).to(ratio.dtype).reshape(ratio.shape)

    def multinomial(self, probs, num_samples=1, *args, **kwargs):
        import torch

        p = probs.detach().to(torch.float64).reshape(-1).numpy()
        if not np.isfinite(p).all() or (p < 0).any() or p.sum() <= 0:
            raise RuntimeError("invalid multinomial distribution (nan, inf, negative or zero mass)")
        t = self._choose(list(p / p.sum()))
        return torch.full((*probs.shape[:-1], num_samples), t, dtype=torch.long)


def exact_call_law(kernel, target, draft, context: tuple, L: int) -> dict[tuple, float]:
    """Exact law of one call of transformers' code: every draft chain, first rejection and multinomial token."""
    import torch

    V = target(context).size
    extra = transformers_options(kernel)
    out: dict[tuple, float] = {}
    chains = [((), 1.0)]
    for _ in range(L):
        chains = [(c + (int(x),), w * q) for c, w in chains for x, q in enumerate(draft(context + c)) if q > 0]
    for chain, w_chain in chains:
        dp = np.stack([draft(context + chain[:i]) for i in range(L)])[None]
        tp = np.stack([target(context + chain[:i]) for i in range(L + 1)])[None]
        q_logits, p_logits = logits(dp), logits(tp)
        ids = torch.tensor([list(context) + list(chain)], dtype=torch.long)
        stack = [()]
        while stack:
            feeder = _Feeder(stack.pop())
            with mock.patch.object(torch, "rand_like", feeder.rand_like), \
                    mock.patch.object(torch, "multinomial", feeder.multinomial):
                tokens, n = kernel(ids, q_logits, L, p_logits, **extra)[:2]
            for d, alts in feeder.branches:
                stack.extend(tuple(feeder.path[:d]) + (a,) for a in alts)
            row = np.full(L + 1, -1, dtype=np.int64)
            tokens = tokens.reshape(-1).to(torch.int64).numpy()
            n = int(n)
            if tokens.size != n + 1 or not 0 <= n <= L:
                raise Malformed(f"transformers' kernel returned {tokens.size} tokens with n_matches = {n}")
            row[: n + 1] = tokens
            why = row_problem(row, np.array(chain), V)
            if why is not None:
                raise Malformed(why + f" (row {row.tolist()}, drafts {list(chain)})")
            seq = tuple(int(t) for t in tokens)
            out[seq] = out.get(seq, 0.0) + w_chain * feeder.weight
    return out



__all__ = ["exact_call_law", "exact_capable"]
