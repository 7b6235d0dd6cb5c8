r"""The one door through which the decoder makes every random choice.

:func:`~otm.decode.decoder.speculative_decode` and :func:`~otm.decode.decoder.autoregressive_decode`
make five kinds of random choice, and only through a :class:`Chance`:

==================================  ==========================================================
choice                              law
==================================  ==========================================================
:meth:`Chance.draft_iid`            k i.i.d. draws per row from the row's draft law (``iid``
                                    rows, and every row's next token below the root)
:meth:`Chance.draft_without_replacement`  k distinct tokens by successive sampling without
                                    replacement (the root of ``without_replacement``)
:meth:`Chance.verify`               the verifier's output token y given (target law, draft
                                    law, drafts) at a node
:meth:`Chance.bonus`                the target's own draw at a leaf (and every autoregressive step)
:meth:`Chance.index`                a draw from an explicit finite law: a whole-tree rule's
                                    decision (block verification's accepted length) and its
                                    residual token (:mod:`otm.decode.tree_rules`)
==================================  ==========================================================

The sampled run makes the same choices in batches that stay on the device: :meth:`Chance.verify_batch` (the
verifier at every node of the tree at once), :meth:`Chance.bonus_batch` (the target's draw at every leaf), and
:meth:`Chance.uniforms` (fresh uniforms with which a whole-tree rule draws its decisions on the host, by the same
inverse CDF); see ``Chance.device_walk``. Each choice still has its own randomness, so the laws are unchanged.

Two doors:

* :class:`Sampled` draws with a ``torch.Generator`` (``ot.sample_iid``, ``ot.sample_without_replacement``,
  the torch verifier with the generator, ``ot.sample_iid`` for the bonus), in the batches above: a seed
  gives the same tokens run after run (not those of the node-by-node walk, which drew fewer numbers).
* :class:`Enumerated` makes each choice one *elementary choice*: a categorical over a finite
  list of options with float64 probabilities, zero-probability options left out. It takes the
  options named by a forced prefix of indices, then option 0, and records every choice's
  option count and the probability of the run (the product of its choices' probabilities).
  :func:`otm.decode.exact_mode.exact_decode` replays the real decoder depth first over every prefix
  to get the exact law of its output.

Elementary choices of :class:`Enumerated` (all float64):

* i.i.d. draft draw: one choice per drawn token over the support of its row's law,
  :math:`P(x) = q(x) / \sum q`;
* draw without replacement of k tokens: k successive choices, choice i over the tokens not yet
  drawn, :math:`P(x_i = x) = q(x) / (\sum q - \sum_{j<i} q(x_j))`. This is the law of the
  order of the k smallest exponential-race keys :math:`E_x / q(x)` that ``sample_without_replacement``
  sorts (Gumbel-top-k: Vieira 2014; Kool et al. ICML 2019, "Stochastic Beams and Where to Find
  Them", Appendix: the top-k of Gumbel-perturbed log-probabilities in order is successive
  sampling without replacement);
* verification: one choice over y with the verifier's exact conditional law
  :math:`\pi(y \mid p, q, \bar x)` (its uniforms integrated out), from
  :func:`exact_law_of`: the numpy twin ``otm.verifiers.<name>.law`` of a built-in torch
  verifier, or the callable's own ``.law`` attribute;
* bonus: one choice over the support of the target law, :math:`P(y) = p(y) / \sum p`;
* index: one choice over the support of the given law, :math:`P(i) = w(i) / \sum w`.

>>> import torch
>>> door = Enumerated([1])
>>> door.draft_iid(torch.tensor([[0.25, 0.0, 0.75]], dtype=torch.float64), 2).tolist()
[[2, 0]]
>>> door.sizes, door.taken, door.probability
([2, 2], [1, 0], 0.1875)
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .. import torch as ot
from ..laws import OtmError


class Chance:
    """Where the decoder's random choices come from (see the module docstring).

    Every method takes the laws as the decoder holds them (float64 by default) and returns
    token ids; subclasses decide how.

    ``device_walk``: whether the decoder keeps a step's decisions on the device (:class:`Sampled`): the
    level-by-level walk then verifies every node of the tree with :meth:`verify_batch` and draws every
    leaf's bonus with :meth:`bonus_batch`, follows the accepted path on the device, and reads the step's
    outcome back once (``otm.decode.tree_rules.LevelByLevel``); otherwise (:class:`Enumerated`) it
    verifies node by node, down the accepted path only.
    """

    device_walk = False

    def draft_iid(self, laws: torch.Tensor, k: int) -> torch.Tensor:
        """``[n, k]`` int64: k i.i.d. draws from each row of ``laws [n, V]``."""
        raise NotImplementedError

    def draft_without_replacement(self, law: torch.Tensor, k: int) -> torch.Tensor:
        """``[1, k]`` int64: k distinct tokens by successive sampling from ``law [1, V]``."""
        raise NotImplementedError

    def verify(self, verifier: Callable, target: torch.Tensor, draft: torch.Tensor, drafts: torch.Tensor) -> int:
        """The output token of ``verifier`` at one node: ``target``, ``draft`` ``[1, V]``, ``drafts [1, m]``."""
        raise NotImplementedError

    def bonus(self, target: torch.Tensor) -> int:
        """A draw from the target law ``[1, V]`` (the bonus token at a leaf, or an autoregressive step)."""
        raise NotImplementedError

    def index(self, law: torch.Tensor) -> int:
        """A draw from an explicit finite law ``[1, n]`` (a whole-tree rule's decision, e.g. block
        verification's accepted length), and from a residual law of such a rule."""
        raise NotImplementedError

    def uniforms(self, n: int, device) -> torch.Tensor | None:
        """``[n]`` float64 uniforms on [0, 1) on ``device``, for a whole-tree rule that draws its decisions on the
        host by inverse CDF (``otm.decode.tree_rules.HostLaws``), or None: the rule asks :meth:`index` and
        :meth:`bonus` instead (the default, and the exact mode's door, which enumerates those choices)."""
        return None

    def verify_batch(self, verifier: Callable, target: torch.Tensor, draft: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """``[B]`` int64 on the laws' device: the output token of ``verifier`` at B nodes, each with its own
        randomness (``target``, ``draft`` ``[B, V]``, ``drafts [B, m]``). By default B calls of :meth:`verify`."""
        out = [self.verify(verifier, target[i : i + 1], draft[i : i + 1], drafts[i : i + 1]) for i in range(target.shape[0])]
        return torch.tensor(out, dtype=torch.int64, device=target.device)

    def bonus_batch(self, target: torch.Tensor) -> torch.Tensor:
        """``[B]`` int64 on the laws' device: one draw from each row of ``target [B, V]``. By default B
        calls of :meth:`bonus`."""
        out = [self.bonus(target[i : i + 1]) for i in range(target.shape[0])]
        return torch.tensor(out, dtype=torch.int64, device=target.device)


class Sampled(Chance):
    """Random draws from a ``torch.Generator`` (what :func:`speculative_decode` does with a seed).

    ``validate`` runs the samplers' and verifiers' value checks (one synchronisation per call).
    The batch calls are one call of the verifier (the sampler) on all B rows: no read of a value.
    """

    device_walk = True

    def __init__(self, generator: torch.Generator, validate: bool = True):
        self.generator, self.validate = generator, validate

    def draft_iid(self, laws, k):
        return ot.sample_iid(laws, k, generator=self.generator, validate=self.validate)  # [n, k]

    def draft_without_replacement(self, law, k):
        return ot.sample_without_replacement(law, k, generator=self.generator, validate=self.validate)  # [1, k]

    def verify(self, verifier, target, draft, drafts):
        return int(verifier(target, draft, drafts, generator=self.generator, validate=self.validate).token[0])

    def bonus(self, target):
        return int(ot.sample_iid(target, 1, generator=self.generator, validate=self.validate)[0, 0])

    def index(self, law):
        return int(ot.sample_iid(law, 1, generator=self.generator, validate=self.validate)[0, 0])

    def uniforms(self, n, device):
        return torch.rand(n, dtype=torch.float64, device=device, generator=self.generator)  # [n]

    def verify_batch(self, verifier, target, draft, drafts):
        return verifier(target, draft, drafts, generator=self.generator, validate=self.validate).token  # [B]

    def bonus_batch(self, target):
        return ot.sample_iid(target, 1, generator=self.generator, validate=self.validate)[:, 0]  # [B]


def _builtin_law(verifier: Callable) -> Callable | None:
    """The numpy exact law of a built-in torch verifier (the registry's record of the same name), else None."""
    from ..verifiers import VERIFIERS as NUMPY_VERIFIERS

    name = next((n for n, fn in ot.VERIFIERS.items() if fn is verifier), None)
    return NUMPY_VERIFIERS[name].module.law if name is not None else None


def exact_law_of(verifier: Callable) -> Callable:
    """The exact conditional law ``law(target [V], draft [V], drafts [m]) -> [V]`` (numpy float64) of a
    torch verifier: its own ``.law`` attribute, else the numpy twin of a built-in
    (``otm.torch.kseq`` -> ``otm.verifiers.kseq.law``, ...). One-line OtmError otherwise."""
    law = getattr(verifier, "law", None)
    if law is None:
        law = _builtin_law(verifier)
    if law is None or not callable(law):
        name = getattr(verifier, "__name__", type(verifier).__name__)
        raise OtmError(
            f"exact mode needs the exact law of verifier {name!r}: give it an attribute "
            ".law(target [V], draft [V], drafts [m]) -> [V] (numpy float64), or certify it statistically"
        )
    return law


def _as_numpy(law: torch.Tensor, name: str) -> np.ndarray:
    """``[V]`` float64 numpy copy of a one-row law, checked finite and non-negative with positive mass."""
    out = law.detach().to(device="cpu", dtype=torch.float64).reshape(-1).numpy()  # [V]
    if not np.isfinite(out).all() or out.min() < 0 or out.sum() <= 0:
        raise OtmError(f"{name} law has a non-finite or negative mass, or no mass: exact mode needs a law")
    return out


class Enumerated(Chance):
    """One run of the decoder with its choices forced, recorded for exact enumeration.

    Choice i takes option ``forced[i]`` (an index into that choice's options, which are the
    tokens of positive probability in increasing id order) while ``i < len(forced)``, then option
    0. After the run: ``sizes[i]`` = the number of options of choice i, ``taken[i]`` = the index
    taken, ``probability`` = the product of the taken options' probabilities.
    """

    def __init__(self, forced: Sequence[int] = (), memo: dict | None = None):
        self.forced = list(forced)
        self.sizes: list[int] = []
        self.taken: list[int] = []
        self.probability = 1.0
        self._laws: dict[int, Callable] = {}
        # exact laws of verifications already computed, shared by the runs of one enumeration
        self._memo = {} if memo is None else memo

    def choose(self, options: np.ndarray, probs: np.ndarray) -> int:
        """One elementary choice among ``options [n]`` with probabilities ``probs [n]`` (all > 0)."""
        i = len(self.taken)
        index = self.forced[i] if i < len(self.forced) else 0
        if index >= options.size:  # the decoder took another path on replay: it is not a function of its choices
            raise RuntimeError(f"choice {i} has {options.size} options on replay, cannot take option {index}")
        self.sizes.append(int(options.size))
        self.taken.append(index)
        self.probability *= float(probs[index])
        return int(options[index])

    def _categorical(self, law: np.ndarray) -> int:
        support = np.flatnonzero(law > 0)  # zero-probability options are never taken
        return self.choose(support, law[support] / law.sum())

    def draft_iid(self, laws, k):
        rows = [_as_numpy(row, "draft") for row in laws]  # n x [V]
        out = [[self._categorical(q) for _ in range(k)] for q in rows]
        return torch.tensor(out, dtype=torch.int64, device=laws.device)  # [n, k]

    def draft_without_replacement(self, law, k):
        q = _as_numpy(law, "draft").copy()  # [V]
        if k > int((q > 0).sum()):
            raise OtmError(f"draft law has {int((q > 0).sum())} tokens of positive mass, cannot draw {k} without replacement")
        out = []
        for _ in range(k):  # successive sampling: each choice over the tokens left, renormalised
            x = self._categorical(q)
            out.append(x)
            q[x] = 0.0
        return torch.tensor([out], dtype=torch.int64, device=law.device)  # [1, k]

    def verify(self, verifier, target, draft, drafts):
        key = id(verifier)
        if key not in self._laws:
            self._laws[key] = exact_law_of(verifier)
        p, q = _as_numpy(target, "target"), _as_numpy(draft, "draft")  # [V], [V]
        d = drafts.detach().cpu().reshape(-1).numpy().astype(np.int64)  # [m]
        memo_key = (key, p.tobytes(), q.tobytes(), d.tobytes())
        if memo_key not in self._memo:
            out = np.asarray(self._laws[key](p, q, d), dtype=np.float64)  # [V]: pi(y | p, q, drafts)
            if out.shape != p.shape or not np.isfinite(out).all() or out.min() < 0 or out.sum() <= 0:
                raise OtmError(f"the exact law of the verifier returned {out.shape} values, not a law over {p.size} tokens")
            support = np.flatnonzero(out > 0)
            self._memo[memo_key] = (support, out[support])
        return self.choose(*self._memo[memo_key])

    def bonus(self, target):
        return self._categorical(_as_numpy(target, "target"))

    def index(self, law):
        return self._categorical(_as_numpy(law, "decision"))


__all__ = ["Chance", "Enumerated", "Sampled", "exact_law_of"]
