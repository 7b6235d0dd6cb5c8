r"""The draft side of a decoder step: what the draft model is fed, how its rows grow, how its cache goes back.

The decoder (:mod:`otm.decode.decoder`) draws every draft token itself, through its chance door; a
*drafter* owns the draft model's runner and its state between steps, and answers four questions of the
step (gpt-fast's split: draft, score, walk, rollback):

* :meth:`~PlainDrafter.start`: the logits at the root, after feeding the committed tokens the draft has
  not seen; :meth:`~PlainDrafter.advance`: the logits after each row's next token; :meth:`~PlainDrafter.branch`
  and :meth:`~PlainDrafter.pick`: the cache (and state) going from one row to k, and each row taking
  the state of the first row with its prefix;
* :meth:`~PlainDrafter.before_target` and :meth:`~PlainDrafter.after_target`: what the drafter needs
  from the target's pass (a feature draft: the target's features, its head's inputs);
* :meth:`~PlainDrafter.rollback`: the draft cache back to the committed tokens after the walk.

:class:`PlainDrafter` drives a causal LM; :class:`FeatureDrafter` a draft that reads the target's
features (EAGLE, :mod:`otm.decode.feature_draft`): it guesses the features of the tokens it drafts,
and after each step feeds the accepted tokens again with the target's true features; its first step
drafts nothing (the prompt's features come from that step's target pass).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..laws import OtmError


@dataclass
class Drafts:
    """The draft rows of one step and the laws they were drawn from."""

    rows: torch.Tensor  # [k', L] int64: row j's tokens 1..L (a delayed tree: the first delay columns are equal)
    laws: list[torch.Tensor]  # laws[0] [1, V] = q(.|c); laws[t] [k', V] ([1, V] for t <= delay): the law of token t + 1
    logits: list[torch.Tensor]  # the draft logits each law was processed from (same shapes; the raw law of peers' bug #47932)
    context: int  # draft cache length before the rows (|c|)
    positive: torch.Tensor | None = None  # [k] bool, without_replacement on the device: whether row j's first token has mass


class PlainDrafter:
    """A causal-LM draft (:class:`~otm.decode.runner.Runner` or a static runner): fed the committed tokens
    it has not seen, then the rows, one batch forward per depth."""

    def __init__(self, runner, prompt: list[int]):
        self.runner = runner
        self.pending = list(prompt)  # committed tokens not in the draft cache

    @property
    def ready(self) -> bool:
        """Whether this step may draft (a feature draft waits for the prompt's features)."""
        return True

    def start(self) -> torch.Tensor:
        """``[1, V]`` logits at the root, after feeding the pending committed tokens."""
        logits = self.runner.feed(self.pending)
        self.pending = []
        return logits

    def advance(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[b, V]`` logits after each row's token ``tokens [b, 1]`` at ``positions [b, 1]``."""
        return self.runner.forward(tokens, positions)[:, -1]

    def branch(self, k: int) -> None:
        """The cache goes from one row to k (each a copy)."""
        self.runner.cache.batch_repeat_interleave(k)

    def pick(self, representative: torch.Tensor) -> None:
        """Row j continues from row ``representative[j]``'s state (the logits were picked by the caller)."""

    def before_target(self, inputs: int, nodes: int) -> int:
        """Called right before the target pass: how many of its ``inputs`` positions to keep logits of (the
        tree's ``nodes``)."""
        return nodes

    def capture(self, target_runner, static: bool) -> contextlib.AbstractContextManager:
        """A context in which the target's passes leave what the drafter needs (nothing here)."""
        return contextlib.nullcontext()

    def after_target(self, target_runner, static: bool, nodes: int) -> None:
        """Read what the drafter needs from the target pass just run (nothing here)."""

    def rollback(self, drafts: Drafts | None, L: int, delay: int, emitted: list[int], path: list[int], row: int) -> None:
        """Draft cache back to the committed tokens: keep cache row ``row`` (one through the accepted path) and
        its tokens up to the path's end; the emitted tokens it has not seen become pending."""
        if L < 1:
            self.pending.extend(emitted)
            return
        if L - delay > 1:  # the cache was expanded to the k rows: keep one that carries the accepted path
            self.runner.cache.batch_select_indices(torch.tensor([row], device=self.runner.device))
        kept = min(len(path), L - 1)  # the row holds its tokens 1..L-1
        self.runner.truncate(drafts.context + kept)
        self.pending = emitted[kept:]


class FeatureDrafter(PlainDrafter):
    """A draft that reads the target's features (:class:`~otm.decode.runner.FeatureRunner`, or a static
    runner built with ``features=True``): each element it is fed reads the target's feature before it;
    a drafted token's element reads the draft's own guess of that feature."""

    def __init__(self, runner, prompt: list[int]):
        super().__init__(runner, prompt)
        self.pending_features = None  # [n, H] features before each pending token; None before the first pass
        self.guess = None  # [b, H] the draft's guesses of the features before each row's next token
        self.captured: list[torch.Tensor] = []  # the target head's inputs in its last pass
        self.tree_features = self.prompt_features = None

    @property
    def ready(self) -> bool:
        return self.pending_features is not None

    def start(self) -> torch.Tensor:
        h_root = self.runner.feed(self.pending, self.pending_features)  # [1, H]: the guess of the root's feature
        self.pending = []
        self.guess = h_root
        return self.runner.logits(h_root)  # [1, V]

    def advance(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.guess = self.runner.forward(tokens, positions, self.guess[:, None])[:, -1]  # [b, H]
        return self.runner.logits(self.guess)

    def branch(self, k: int) -> None:
        super().branch(k)
        self.guess = self.guess.expand(k, -1)  # [k, H]

    def pick(self, representative: torch.Tensor) -> None:
        self.guess = self.guess[representative]

    def before_target(self, inputs: int, nodes: int) -> int:
        self.captured.clear()  # the head's calls before this pass (the draft's own logits, when it shares the head)
        # the first pass needs the features of every prompt position, later ones the nodes'
        return inputs if self.pending_features is None else nodes

    def capture(self, target_runner, static: bool) -> contextlib.AbstractContextManager:
        if static:  # the static target returns its head's inputs itself (after_target reads them)
            return contextlib.nullcontext()
        head = target_runner.model.get_output_embeddings()  # a hook handle removes itself on exit
        return head.register_forward_hook(lambda _m, inputs, _o: self.captured.append(inputs[0]))

    def after_target(self, target_runner, static: bool, nodes: int) -> None:
        if static:
            self.captured.append(target_runner.last_features)
        if not self.captured:
            raise OtmError("the target's head was not called in its forward: a feature draft needs a causal LM "
                           "whose output embedding module turns features into logits")
        last = self.captured[-1]
        feats = last[0].to(torch.promote_types(last.dtype, torch.float32))  # [q', H]
        self.tree_features = feats[-nodes:]  # [N, H] by node
        self.prompt_features = feats[:-nodes]  # the pending tokens before the root (first pass: the prompt)

    def rollback(self, drafts: Drafts | None, L: int, delay: int, emitted: list[int], path: list[int], row: int) -> None:
        # emitted token i was drawn from the law at node [root] + path: the target's feature there goes with it
        emitted_features = self.tree_features[[0] + path]  # [len(emitted), H]
        if self.pending_features is None:  # first pass: the prompt's tokens get zeros, f_0 .. f_{n-2}
            self.pending_features = torch.cat([self.tree_features.new_zeros((1, emitted_features.shape[1])),
                                               self.prompt_features])
        if L >= 1:  # the drafted elements read guessed features: drop them, feed the accepted tokens again
            if L - delay > 1:  # the cache was expanded to the k rows at the branching point
                self.runner.cache.batch_select_indices(torch.tensor([0], device=self.runner.device))
            self.runner.truncate(drafts.context)
            self.pending, self.pending_features = list(emitted), emitted_features
        else:
            self.pending.extend(emitted)
            self.pending_features = torch.cat([self.pending_features, emitted_features])


__all__ = ["Drafts", "PlainDrafter", "FeatureDrafter"]
