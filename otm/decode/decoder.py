r"""The multi-draft speculative decoder (SpecTr's tree decoder) and its baselines.

One *step* (SpecTr, Sun et al. NeurIPS 2023, §2.3):

1. **draft**: feed the draft model the committed tokens it has not seen (batch 1), giving
   :math:`q(\cdot|c)`; draw k first tokens (scheme ``iid``: i.i.d.; ``without_replacement``:
   k distinct tokens by successive sampling); then extend the k rows autoregressively to
   length L in one batch-k forward per depth, each row's next token drawn from
   :math:`q(\cdot|c, x_{<t})`. Rows that share a prefix draw from one law, computed once for
   the prefix (the law of its first row), so the law the verifier is given is the law the
   drafts were drawn from, bit for bit;
   With ``delay`` = L1 > 0 (the *delayed tree* of DDTE, Thomas, Kitanovski, Goldblum & Pal, arXiv
   2602.16994): first ONE shared path of L1 tokens, each drawn once from the draft at batch 1, then
   the k rows (either scheme) drawn from the law at the path's end and extended to the total depth L
   at batch k (draft calls: the feed, L1 at batch 1, L - L1 - 1 at batch k);
2. **tree**: merge the k rows into a prefix tree (:class:`~otm.decode.tree.DraftTree`; on a delayed
   tree a shared node's ``rows_through`` is row 0 alone: the one draw made there);
3. **target pass**: ONE target forward over the pending tokens and every tree node, with a 4D
   tree attention mask and explicit ``position_ids`` (:func:`~otm.decode.tree.tree_inputs`),
   giving :math:`p(\cdot|\text{node})` at the root and at every node;
4. **walk**: from the root, verify the children of the current node with the verifier
   (drafts = the next tokens of the rows through the node, with multiplicity, in row order;
   target and draft laws = the node's); emit its token y; if y is a child, move there and go
   on, else stop (y was the correction token). At a node without children (a leaf at depth L)
   emit the bonus token :math:`y \sim p(\cdot|\text{leaf})`. The sampled run verifies every node at once
   and follows the path on the device, reading the step's outcome back once
   (:class:`~otm.decode.tree_rules.LevelByLevel`; the reads per step: docs/decode.md, "Syncs per step");
5. **rollback**: both caches go back to the committed tokens (target: keep the accepted
   path's keys and values and crop the rest of the tree, or crop the whole tree and feed the
   path again with the next tree; draft: keep the row that carries the accepted path and crop
   it after the path).

Exactness (each emitted token follows the target's processed law given the tokens before it):

* ``iid`` (SpecTr Theorem 2): given everything decided at a node (its token, the draws and
  uniforms of the levels above), the rows through the node continue with independent draws
  from :math:`q(\cdot|\text{node})`; their next tokens are m i.i.d. drafts, m = the number of
  rows through the node (a function of the past only). A verifier valid for m i.i.d. drafts
  (``kseq`` with :math:`\rho^*` recomputed for m, ``rrs``, ``optimal`` with its plan built for m)
  then emits y with law
  :math:`p(\cdot|\text{node})` whatever m is, and y's own children are again i.i.d. given y.
  Acceptance is read by value (is y a child?), which the argument allows whatever branch of the
  rule produced y.
* ``without_replacement``: the root's k first tokens are distinct (successive sampling without
  replacement from :math:`q(\cdot|c)`, k reduced to the support size of the law if smaller,
  a function of the law only), verified by ``rrs_without_replacement``, valid for that scheme.
  Below the root each row is a single chain: given the accepted child, its one continuation is a
  single draw from :math:`q(\cdot|\text{child})`, independent of the root's verification, so
  single-draft speculative sampling (``speculative``) is exact at depths >= 1.
* delayed trees: a node of the shared path has one child drawn once from its draft law (a single
  i.i.d. draft, m = 1, for every rule above; ``rows_through`` holds it once), and the branching node at
  depth L1 has the k draws of the scheme, which the rules treat as they treat the root's (the
  without-replacement verifier runs there: :attr:`DraftTree.delay`); the argument above then holds
  node by node (``spectr_gbv`` verifies its k rows from the branching node, then the shared path); a
  rule that cannot take a delay refuses it in one line (:attr:`TreeRuleSpec.no_delay
  <otm.decode.tree_registry.TreeRuleSpec>`); ``tree_lp`` solves the LP of the delayed shape.
* the bonus token after a fully accepted path and the correction token are the target's own
  law given the path (the correction is part of the verifier's rule).

Baselines through the same code: :func:`autoregressive_decode` (every step has no drafts: the
root alone, y ~ target) and ``k = 1`` (a single chain: ordinary speculative sampling, Leviathan
et al. 2023). Near ``max_new_tokens`` the depth is cut to ``remaining - 1`` (a function of the
past, so still exact) and no token beyond the limit is drafted.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..laws import OtmError
from ..torch import _rho
from .caches import cache_keyword, returned_cache  # noqa: F401  (re-exported: the decoder's public names)
from .arguments import (  # noqa: F401  (SCHEMES, VERIFIERS, check_delay and the resolvers: the decoder's public names)
    SCHEMES, VERIFIERS, chance_door, check_delay, check_models, check_positive, eos_set, prompt_ids, resolve_rule,
    resolve_verifiers)
from .chance import Chance
from .drafting import Drafts, FeatureDrafter, PlainDrafter
from .runner import FeatureRunner, Runner, device_and_dtype, is_feature_draft_model, vocab_size
from .sampling import Sampling, next_token_laws
from .step_context import StepContext
from .tree import DraftTree, tree_inputs

ROLLBACKS = ("gather", "refeed")
"""How the target cache returns to the accepted path (see :func:`speculative_decode`)."""


# -- measurements -----------------------------------------------------------------------


@dataclass
class DecodeStats:
    """Measurements of one decoding run.

    ``block_efficiency`` = new tokens / target calls (SpecTr's block efficiency; the prompt's
    prefill is part of the first call, so autoregressive decoding has 1.0). Acceptance at depth
    d (1-based) = share of the verifications at depth d whose token was one of the drafts
    (membership acceptance, docs/theory.md).
    """

    method: str
    prompt_tokens: int
    new_tokens: int = 0
    steps: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    verified_by_depth: list[int] = field(default_factory=list)
    accepted_by_depth: list[int] = field(default_factory=list)
    host_reads: dict = field(default_factory=dict)  # phase -> reads of tensor values (count_host_reads=True)
    wall_seconds: float = 0.0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    stopped: str = ""

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def acceptance_by_depth(self) -> list[float]:
        return [a / v if v else float("nan") for a, v in zip(self.accepted_by_depth, self.verified_by_depth)]

    def summary(self) -> str:
        # a depth never reached (every path rejected above it) has no acceptance: shown as "-"
        acc = " ".join("-" if a != a else f"{a:.2f}" for a in self.acceptance_by_depth) or "-"
        return (
            f"{self.method}: {self.new_tokens} tokens in {self.target_calls} target calls "
            f"(block efficiency {self.block_efficiency:.2f}), {self.draft_calls} draft calls, "
            f"acceptance by depth [{acc}], {self.wall_seconds:.2f} s ({self.tokens_per_second:.1f} tokens/s; "
            f"target {self.target_seconds:.2f} s, draft {self.draft_seconds:.2f} s, verify {self.verify_seconds:.2f} s), "
            f"stopped at {self.stopped}"
        )


@dataclass
class Generation:
    """The new tokens of one run (prompt excluded) and its measurements."""

    tokens: list[int]
    stats: DecodeStats


# -- the decoder ------------------------------------------------------------------------


class _Decoder:
    """State of one decoding run: both runners (model + cache), pending tokens, randomness, stats."""

    def __init__(self, target, draft, prompt, *, k, length, scheme, verifier, sampling, max_new_tokens, eos,
                 chance: Chance, law_dtype, method, target_rollback="gather", compile=None, static: bool = False,
                 max_cache: int | None = None, prompt_length: int = 0, delay: int = 0):
        # a feature draft (EAGLE) reads the target's features: the head inputs of each target pass
        self.features = draft is not None and is_feature_draft_model(draft)
        self.static = static or compile is not None
        if self.static:  # the static-shape step (otm.decode.static): fixed caches, padded forwards, compiled
            from .static import static_runners

            self.target, self.draft = static_runners(
                target, draft, k=k, length=length, refeed=target_rollback == "refeed", compile=compile,
                capacity=max_cache or prompt_length + max_new_tokens, features=self.features)
            for runner in (self.target, self.draft):  # every shape compiled before the run: its clock and its
                if runner is not None:  # live figures never include compilation (nothing when already compiled)
                    runner.warm()
        else:
            self.target = Runner(target, "target")
            runner = FeatureRunner if self.features else Runner
            self.draft = runner(draft, "draft") if draft is not None else None
        # the draft side of the step (otm.decode.drafting): what the draft is fed, its rows' state, its rollback
        self.drafter = None if self.draft is None else (FeatureDrafter if self.features else PlainDrafter)(self.draft, prompt)
        self.k, self.L, self.scheme = k, length, scheme
        self.delay = delay  # DDTE's delayed tree: a shared path of this length, then the k rows branch
        self.rule = verifier  # a TreeRule (otm.decode.tree_rules); None for the autoregressive baseline
        self.sampling, self.law_dtype = sampling, law_dtype
        self.max_new, self.eos = max_new_tokens, eos
        self.chance = chance  # every random choice goes through it (otm.decode.chance)
        self.target_rollback = target_rollback
        self.committed = list(prompt)  # every committed token (prompt and output so far; the last is the root)
        self.pending_target = list(prompt)  # committed tokens not in the target cache (last = root)
        self.V = None
        self.stats = DecodeStats(
            method=method, prompt_tokens=len(prompt), verified_by_depth=[0] * length, accepted_by_depth=[0] * length
        )
        self.reads = None  # an otm.decode.host_reads.HostReads while counting (count_host_reads=True)
        # a door that keeps decisions on the device (the sampled run, off the CPU): the laws' checks wait for the
        # step's reads. On the CPU a read costs nothing and the node-by-node walk verifies fewer nodes, so the CPU
        # keeps it (faster there: docs/decode.md, "Syncs per step"), unless the device path is forced
        # (otm.torch._rho.FORCE_DEVICE_PATH: what a GPU runs, for the sync counts and their tests)
        self.device_walk = bool(getattr(chance, "device_walk", False)) and (
            self.target.device.type != "cpu" or _rho.FORCE_DEVICE_PATH)
        self.defer_target = self.device_walk  # read with the step's outcome, or with its laws (a numpy tree rule)
        self.checks: list[tuple] = []  # (all finite [] bool tensor, role, logits) of laws not yet checked
        self.host_laws = None  # the step's otm.decode.tree_rules.HostLaws (a whole-tree rule with numpy arithmetic)
        self.context = StepContext(self)  # what a tree rule sees of this decoder (otm.decode.step_context)

    def phase(self, name: str) -> None:
        """The part of the step now running, for the host-read count (nothing when not counting)."""
        if self.reads is not None:
            self.reads.phase = name

    def laws(self, logits: torch.Tensor, role: str, defer: bool = False) -> torch.Tensor:
        """Processed laws of ``logits [n, V]`` from the ``role`` model ("target" or "draft"), checked first:
        a NaN or +inf logit, or a row with no finite logit, is that model's fault, named in one line.

        ``defer``: the check waits for the step's next read (:meth:`read`, which raises the same line), so it
        costs no read of its own; meanwhile a faulty row gets the uniform law, so that nothing fails first."""
        top = logits.amax(-1)  # [n]: NaN if a logit is NaN, +inf if one is +inf, -inf if all are -inf
        finite = torch.isfinite(top)  # [n]
        if defer:
            self.checks.append((finite.all(), role, logits))
            logits = torch.where(finite[:, None], logits, torch.zeros_like(logits))  # [n, V]
        elif not bool(finite.all()):  # one reduction; the full scan only to name the fault
            self.fail_laws(role, logits)
        if self.V is None:
            self.V = logits.shape[-1]
        elif logits.shape[-1] != self.V:
            raise OtmError(
                f"{role} gives {logits.shape[-1]} logits per position and the other model {self.V}: "
                "both models must share one vocabulary"
            )
        return next_token_laws(logits, self.sampling, dtype=self.law_dtype)

    def fail_laws(self, role: str, logits: torch.Tensor):
        bad = torch.isnan(logits) | torch.isposinf(logits)  # [n, V]
        what = "NaN or +inf logits" if bool(bad.any()) else "a position where every logit is -inf"
        raise OtmError(f"the {role} model returned {what}: check its weights and dtype (a float16 overflow?) "
                       "before decoding")

    def read(self, values: torch.Tensor, phase: str = "accept") -> list[int]:
        """``values`` (whole numbers) as host ints, with the deferred checks of the laws (:meth:`laws`), in ONE
        read of the device (a sync on a GPU), counted in ``phase``: "draft" for the drafted rows (the tree is
        built on the host), "accept" for the step's outcome."""
        self.phase(phase)
        flat = values.reshape(-1).to(torch.int64)
        checks, self.checks = self.checks, []
        if checks:
            flat = torch.cat([flat, torch.stack([c[0] for c in checks]).to(device=flat.device, dtype=torch.int64)])
        out = flat.tolist()
        n = values.numel()
        for ok, (_, role, logits) in zip(out[n:], checks):
            if not ok:
                self.fail_laws(role, logits)
        return out[:n]

    def read_array(self, values: torch.Tensor, phase: str = "laws"):
        """``values`` as a float64 numpy array, with the deferred checks of the laws, in ONE read (a sync on a
        GPU) counted in ``phase``: a whole-tree rule's copy of the step's laws (``otm.decode.tree_rules.HostLaws``).
        The count goes back to the phase it interrupted."""
        before = self.reads.phase if self.reads is not None else None
        self.phase(phase)
        flat = values.reshape(-1).to(torch.float64)
        checks, self.checks = self.checks, []
        if checks:
            flat = torch.cat([flat, torch.stack([c[0] for c in checks]).to(flat)])
        out = flat.numpy(force=True)  # [n + checks]: one copy to the host
        n = values.numel()
        for ok, (_, role, logits) in zip(out[n:], checks):
            if not ok:
                self.fail_laws(role, logits)
        if before is not None:
            self.phase(before)
        return out[:n]

    # 1. drafting ---------------------------------------------------------------------------
    def draft_rows(self, L: int, delay: int = 0) -> Drafts:
        """The k rows of one step, drawn through ``self.chance`` (:class:`~otm.decode.drafting.Drafts`).

        ``laws[0]`` = q(.|c) ``[1, V]``; ``laws[t]`` is the law the rows' token t + 1 was drawn from:
        ``[1, V]`` for t <= ``delay`` (the shared path, one draw per depth, and the law at its end, from
        which the k branch tokens are drawn), else ``[k', V]`` (row j's law: the law of the first row
        with the same prefix). k' = k, or the support size of the branching law if smaller
        (``without_replacement``); 1 when ``delay == L`` (the step is the shared path alone).
        """
        d = self.drafter
        logits = d.start()  # [1, V]: the root's, after the committed tokens the draft has not seen
        law = self.laws(logits, "draft", self.device_walk)  # [1, V]: the law at the current node of the shared path
        context = self.draft.length()
        out = Drafts(None, [law], [logits], context)

        def advance(tokens: torch.Tensor, t: int) -> torch.Tensor:
            """Draft logits ``[b, V]`` after feeding ``tokens [b, 1]`` (each row's token t) at position ``context + t - 1``."""
            positions = torch.full((tokens.shape[0], 1), context + t - 1, dtype=torch.int64, device=self.draft.device)
            return d.advance(tokens, positions)

        path = []  # the shared path (DDTE's delayed tree): one draw per depth, at batch 1
        for t in range(delay):
            if t:
                logits = advance(path[-1], t)  # [1, V]
                law = self.laws(logits, "draft", self.device_walk)
                out.laws.append(law)
                out.logits.append(logits)
            path.append(self.chance.draft_iid(law, 1))  # [1, 1]
        if delay == L:  # no branching left in this step (depth cut near the limit): the path is the one row
            out.rows = torch.cat(path, 1)  # [1, L]
            return out
        if delay:  # the law at the path's end, from which the k branch tokens are drawn
            logits = advance(path[-1], delay)  # [1, V]
            law = self.laws(logits, "draft", self.device_walk)
            out.laws.append(law)
            out.logits.append(logits)
        if self.scheme == "iid":
            first = self.chance.draft_iid(law, self.k)  # [1, k]
        elif self.device_walk and not getattr(self.chance, "validate", True):
            # k draws, no read here; the rows past the support size (zero mass, drawn last) are cut at the rows' read
            # (a validating door checks the support first, as below: its check would refuse k > support)
            first = self.chance.draft_without_replacement(law, self.k)  # [1, k]
            out.positive = law[0, first[0]] > 0  # [k]
        else:
            k = min(self.k, int((law > 0).sum()))  # the scheme needs k tokens of positive mass
            first = self.chance.draft_without_replacement(law, k)  # [1, k']
        k = first.shape[1]
        rows = torch.empty((k, L), dtype=torch.int64, device=first.device)  # [k', L]
        for t, x in enumerate(path):
            rows[:, t] = x[0, 0]
        rows[:, delay] = first[0]
        out.rows = rows
        if L - delay > 1:
            d.branch(k)
        for t in range(delay + 1, L):
            # the first row of each row's prefix (on the device: no read)
            same = (rows[:, None, delay:t] == rows[None, :, delay:t]).all(-1)  # [k', k']
            representative = same.to(torch.int64).argmax(-1)  # [k']: argmax takes the first maximum
            logits = advance(rows[:, t - 1 : t], t)[representative]  # [k', V]: one per distinct prefix
            d.pick(representative)
            laws = self.laws(logits, "draft", self.device_walk)  # [k', V]
            rows[:, t] = self.chance.draft_iid(laws, 1)[:, 0]
            out.laws.append(laws)
            out.logits.append(logits)
        return out

    # 2. tree -------------------------------------------------------------------------------------
    def host_rows(self, drafts: Drafts) -> list[list[int]]:
        """The drafted rows as host ints (the tree is built on the host), in one read with the drafts' deferred
        checks; without replacement on the device, the rows past the support size are cut here."""
        k, L = drafts.rows.shape
        values = drafts.rows.reshape(-1)
        if drafts.positive is not None:
            values = torch.cat([values, drafts.positive.to(torch.int64)])
        out = self.read(values, "draft") if self.device_walk else values.tolist()
        rows = [out[j * L : (j + 1) * L] for j in range(k)]
        if drafts.positive is not None:
            keep = sum(out[k * L :])  # the positive-mass tokens come first (their race keys are finite)
            drafts.rows, rows = drafts.rows[:keep], rows[:keep]
        return rows

    # 3. target pass --------------------------------------------------------------------------
    def score(self, tree: DraftTree) -> torch.Tensor:
        """Target laws ``[N, V]`` at every node (one target forward)."""
        t = self.target
        past = t.length()
        ids, positions, mask = tree_inputs(tree, self.pending_target, past, dtype=t.dtype, device=t.device)
        d = self.drafter
        keep = tree.size if d is None else d.before_target(ids.shape[1], tree.size)
        logits = t.forward(ids, positions, mask, keep=keep)[0, -tree.size :]  # [N, V]: the root and the nodes
        if d is not None:
            d.after_target(t, self.static, tree.size)
        return self.laws(logits, "target", self.defer_target)

    # 4. walk ---------------------------------------------------------------------------------
    def node_draft_law(self, tree: DraftTree, node: int, drafts: Drafts) -> torch.Tensor:
        """``[1, V]``: the law the node's children tokens were drawn from (the law of the rows through it)."""
        depth = tree.depth[node]
        return drafts.laws[depth][tree.rows_through[node][0] if depth else 0][None]

    def bonus(self, tree: DraftTree, node: int, target_laws: torch.Tensor) -> int:
        """The target's own draw at a node without children (a leaf at depth L, or a root without drafts)."""
        return self.chance.bonus(target_laws[node : node + 1])

    def walk(self, tree: DraftTree, drafts: Drafts | None, target_laws) -> tuple[list[int], list[int]]:
        """Emitted tokens and the accepted path (its nodes, depth 1 first): the run's tree rule."""
        if not tree.children[0]:  # no drafts this step (autoregressive, or a feature draft's first step)
            if self.device_walk:
                return self.read(self.chance.bonus_batch(target_laws[:1])), []
            return [self.bonus(tree, 0, target_laws)], []
        return self.rule.walk(self.context, tree, drafts, target_laws)

    # 5. rollback -------------------------------------------------------------------------------
    def rollback_target(self, committed: int, emitted: list[int], path: list[int]) -> None:
        """Target cache back to the committed tokens; sets the next pending chain.

        ``committed`` = the cache length up to and including the root. ``gather``: keep the
        accepted path's keys and values (node i sits at cache position ``committed - 1 + i``), the
        last emitted token is the next root; ``refeed``: drop the tree and feed every emitted
        token again with the next tree.
        """
        if self.target_rollback == "gather":
            self.target.keep_path(committed, [committed - 1 + node for node in path])
            self.pending_target = [emitted[-1]]
        else:
            self.target.truncate(committed)
            self.pending_target = list(emitted)

    def draft_row_kept(self, tree: DraftTree, end: int) -> int:
        """The draft cache row kept after a step: one row through the accepted path's end node."""
        return tree.rows_through[end][0] if end else 0

    def depth(self, remaining: int) -> int:
        """Draft depth of a step with ``remaining`` tokens to go: L, cut so that no token beyond the limit is drafted."""
        return min(self.L, remaining - 1) if self.draft is not None else 0

    # one step ----------------------------------------------------------------------------------
    def step(self, remaining: int) -> list[int]:
        L = self.depth(remaining)
        if self.drafter is not None and not self.drafter.ready:
            L = 0  # a feature draft waits for the target's features of the prompt: the first step drafts nothing
        root = self.pending_target[-1]
        self.host_laws = None
        t0 = time.perf_counter()
        self.phase("draft")
        delay = min(self.delay, L)  # the shared path, cut with the depth near the limit
        if L >= 1:
            drafts = self.draft_rows(L, delay)
            tree = DraftTree.from_rows(self.host_rows(drafts), root, delay=delay)
        else:
            drafts, tree = None, DraftTree.root_only(root)
        t1 = time.perf_counter()
        self.phase("target")
        past = self.target.length()
        target_laws = self.score(tree)  # [N, V]
        t2 = time.perf_counter()
        self.phase("verify")
        emitted, path = self.walk(tree, drafts, target_laws)
        if self.checks:  # a rule that read nothing back (a user's tree rule): the target's check, one read
            self.read(torch.zeros(0, dtype=torch.int64), "accept")
        self.committed.extend(emitted)
        t3 = time.perf_counter()
        self.phase("rollback")
        # 5. rollback. Target: keep the committed context and the accepted path, or refeed it.
        self.rollback_target(past + len(self.pending_target), emitted, path)
        # draft: back to the committed tokens, keeping a cache row through the accepted path
        if self.drafter is not None:
            self.drafter.rollback(drafts, L, delay, emitted, path, self.draft_row_kept(tree, path[-1] if path else 0))
        self.stats.draft_seconds += t1 - t0
        self.stats.target_seconds += t2 - t1
        self.stats.verify_seconds += t3 - t2
        self.stats.steps += 1
        self.phase("other")
        return emitted

    def run(self, on_tokens, count_host_reads: bool = False) -> Generation:
        out: list[int] = []
        start = time.perf_counter()
        stopped = "max_new_tokens"
        if count_host_reads:
            from .host_reads import HostReads

            self.reads = HostReads()
        counting = self.reads if self.reads is not None else contextlib.nullcontext()
        # a feature draft reads the target's features (its head's inputs) during the target's passes
        hook = contextlib.nullcontext() if self.drafter is None else self.drafter.capture(self.target, self.static)
        with torch.inference_mode(), hook, counting:
            while len(out) < self.max_new:
                new = self.step(self.max_new - len(out))[: self.max_new - len(out)]
                hit = next((i for i, t in enumerate(new) if t in self.eos), None)
                if hit is not None:
                    new = new[: hit + 1]
                out.extend(new)
                if on_tokens is not None:
                    on_tokens(new)
                if hit is not None:
                    stopped = "eos"
                    break
        s = self.stats
        s.wall_seconds = time.perf_counter() - start
        s.new_tokens = len(out)
        s.target_calls = self.target.calls
        s.draft_calls = self.draft.calls if self.draft is not None else 0
        s.stopped = stopped
        if self.reads is not None:
            s.host_reads = dict(self.reads.counts)
        return Generation(out, s)


def speculative_decode(
    target,
    draft,
    input_ids,
    *,
    k: int = 4,
    length: int = 4,
    verifier="kseq",
    scheme: str = "iid",
    sampling: Sampling | None = None,
    max_new_tokens: int = 64,
    eos_token_id=None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    law_dtype: torch.dtype = torch.float64,
    validate: bool = True,
    target_rollback: str = "gather",
    on_tokens: Callable[[list[int]], None] | None = None,
    chance: Chance | None = None,
    count_host_reads: bool = False,
    static: bool = False,
    compile: str | None = None,
    max_cache: int | None = None,
    delay: int = 0,
) -> Generation:
    """Multi-draft speculative decoding of one prompt; the new tokens follow the target's law.

    Parameters
    ----------
    target, draft : causal LMs with the transformers interface (``model(input_ids=,
        position_ids=, attention_mask=4D, past_key_values=, use_cache=True)`` returning ``.logits``
        and a ``Cache`` with ``crop``, ``batch_repeat_interleave``, ``batch_select_indices``),
        sharing one vocabulary, on one device. The draft may instead be a
        :class:`otm.decode.feature_draft.FeatureDraft` built for this target: it then reads the
        target's features (its head's inputs in each target pass), and the first step drafts
        nothing (the prompt's features come from that step's target pass).
    input_ids : list of int, or tensor ``[n]`` / ``[1, n]`` (batch size 1).
    k : drafts per position (rows of the tree), >= 1.
    length : draft depth L, >= 1 (the tree's total depth, with or without a delay).
    verifier : name in :data:`VERIFIERS` for the scheme, a callable with the signature of
        :data:`otm.torch.VERIFIERS` (run level by level), or an instance of
        :class:`~otm.decode.tree_rules.TreeRule` (a whole-tree rule of your own).
    scheme : ``"iid"`` or ``"without_replacement"``.
    sampling : :class:`~otm.decode.sampling.Sampling` for both models (default temperature 1).
    max_new_tokens : >= 1;  eos_token_id : int, list of int or None (stop after emitting one).
    generator, seed : randomness (a torch.Generator on the models' device, or a seed).
    law_dtype : float64 (default) or float32, the dtype of both models' laws. In float64 the
        samplers (``sample_without_replacement`` always normalises in float64) and the verifiers
        see the very same numbers; float32 differs from that by rounding only.
    validate : run the verifiers' value checks (one synchronisation per call).
    target_rollback : ``"gather"`` (keep the accepted path's keys and values: needs a
        ``DynamicCache`` of full-attention layers) or ``"refeed"`` (crop the tree, feed the
        emitted tokens with the next tree: any cache with ``crop``). Same law, same call count.
    on_tokens : called with each step's new tokens (streaming).
    chance : the door of every random choice (:mod:`otm.decode.chance`); default
        ``Sampled(generator or seed, validate)``. :func:`otm.decode.exact_mode.exact_decode` passes an
        ``Enumerated`` door to enumerate the runs of this very code.
    count_host_reads : count the reads of tensor values back to the host (a device sync each on a GPU) by
        the phase of the step, into ``stats.host_reads`` (:mod:`otm.decode.host_reads`; slows the run).
    static : the static-shape step (:mod:`otm.decode.static`): caches of fixed shape, forwards padded to
        two sizes per model, rollback by slot. Same laws; needs models whose attention takes a 4D
        additive mask (transformers' causal LMs, the toy LMs, feature drafts).
    compile : None, or a ``torch.compile`` mode (``"default"``, ``"max-autotune"``, ``"reduce-overhead"``):
        the static step compiled, once per shape and process (implies ``static``).
    max_cache : positions of the static caches (default: the prompt plus ``max_new_tokens``).
    delay : the delayed tree of DDTE (Thomas, Kitanovski, Goldblum & Pal, arXiv 2602.16994): a single
        shared draft path of ``delay`` tokens (L1) from the root, drafted at batch 1, then the k rows
        branch from its end with ``length - delay`` tokens each (L2; scheme ``without_replacement``:
        their k first tokens are distinct). ``0 <= delay < length``; 0 (default) is the usual tree of k
        rows from the root. Near ``max_new_tokens`` the depth is cut first: a step of depth <= delay is
        the shared path alone. Every rule stays exact (the tree holds one draw per shared node:
        :class:`~otm.decode.tree.DraftTree`), except those refused in one line (:attr:`TreeRuleSpec.no_delay <otm.decode.tree_registry.TreeRuleSpec>`).

    Returns
    -------
    Generation(tokens, stats)
    """
    k = check_positive(k, "k", "drafts per position")
    length = check_positive(length, "length", "draft depth L")
    max_new_tokens = check_positive(max_new_tokens, "max_new_tokens", "tokens to generate")
    delay = check_delay(delay, length, verifier)
    sampling = Sampling() if sampling is None else sampling
    rule = resolve_rule(verifier, scheme, k, target=target, draft=draft, sampling=sampling)
    if target_rollback not in ROLLBACKS:
        raise OtmError(f"target_rollback must be one of {', '.join(ROLLBACKS)}, got {target_rollback!r}")
    check_models(target, draft)
    prompt = prompt_ids(input_ids, vocab_size(target))
    device = device_and_dtype(target)[0]
    decoder = _Decoder(
        target, draft, prompt, k=k, length=length, scheme=scheme, verifier=rule, sampling=sampling,
        max_new_tokens=max_new_tokens, eos=eos_set(eos_token_id), chance=chance_door(chance, generator, seed, device, validate),
        law_dtype=law_dtype, method=f"{rule.name} {scheme} k={k} L={length}" + (f" delay={delay}" if delay else ""),
        target_rollback=target_rollback, static=static, compile=compile, max_cache=max_cache, prompt_length=len(prompt),
        delay=delay,
    )
    return decoder.run(on_tokens, count_host_reads)


def autoregressive_decode(
    target,
    input_ids,
    *,
    sampling: Sampling | None = None,
    max_new_tokens: int = 64,
    eos_token_id=None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    law_dtype: torch.dtype = torch.float64,
    on_tokens: Callable[[list[int]], None] | None = None,
    chance: Chance | None = None,
    count_host_reads: bool = False,
    static: bool = False,
    compile: str | None = None,
    max_cache: int | None = None,
    validate: bool = True,
) -> Generation:
    """Autoregressive sampling from the target through the decoder's own code (steps without drafts).

    Each step is one target call on the pending tokens and one inverse-CDF draw from the
    processed law (``chance.bonus``); block efficiency is 1. ``static``, ``compile``, ``max_cache``,
    ``validate``: as :func:`speculative_decode` (the same static step, compiled or not, so ratios compare
    like with like; ``validate`` checks the law before each draw, one synchronisation per step).
    """
    max_new_tokens = check_positive(max_new_tokens, "max_new_tokens", "tokens to generate")
    sampling = Sampling() if sampling is None else sampling
    prompt = prompt_ids(input_ids, vocab_size(target))
    device = device_and_dtype(target)[0]
    decoder = _Decoder(
        target, None, prompt, k=1, length=0, scheme="iid", verifier=None, sampling=sampling,
        max_new_tokens=max_new_tokens, eos=eos_set(eos_token_id), chance=chance_door(chance, generator, seed, device, validate),
        law_dtype=law_dtype, method="autoregressive", static=static, compile=compile, max_cache=max_cache,
        prompt_length=len(prompt),
    )
    return decoder.run(on_tokens, count_host_reads)
