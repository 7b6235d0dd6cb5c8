r"""Certify a tree-verification kernel in an engine's own array layout, inside the real decoder.

:func:`certify_tree` wraps a kernel as a :class:`~otm.decode.tree_rules.TreeRule` (:class:`KernelRule`): at
every decoding step its walk writes the decoder's draft tree, the target's law at every node and the
draft laws into the layout's arrays, calls the kernel once, and reads the emitted tokens and the
accepted path back from the kernel's outputs (checked: a path from the root whose tokens are the
emitted ones, a token of the vocabulary). :func:`otm.certify.decoder.certify_decoder` then judges the
law of the first T tokens on its toy settings (:data:`TREE_SETTINGS`).

Layouts (:data:`LAYOUTS`):

* ``"generic"``: ``kernel(parents, tokens, draft_probs, target_probs, generator) -> (emitted, accepted)``
  on the tree of draws. Node 0 is the root (the last committed token); every other node is ONE draw of
  a token at its parent, so the siblings are the parent's draws in the order drawn (i.i.d. draws may
  repeat a token: the first draw of a token carries the subtree of every row that drew it, a later
  repeat is a leaf; :class:`otm.tree_verification.VerificationTree`); nodes are breadth first, a parent
  before its children. ``parents [N]`` int64 (-1 at the root), ``tokens [N]`` int64,
  ``draft_probs [N, V]`` float64 (row n: the law node n's children were drawn from; zeros where n has
  no children; under ``top_k`` drafting the draft model's law at n, which the drafts were NOT drawn
  from), ``target_probs [N, V]`` float64 (the target's law after the path to n), ``generator``
  a ``torch.Generator``, the kernel's only source of randomness. It returns the emitted tokens (the
  accepted path's tokens, then one correction or bonus token) and the accepted nodes (depth 1 first),
  lists or 1-D tensors. A kernel is written for one drafting: certify it with that ``scheme``.
* ``"sglang"``: SGLang's ``tree_speculative_sampling_target_only`` (sgl-kernel) and its arrays, batch 1,
  called positionally as ``kernel(predicts, accept_index, accept_token_num, candidates, retrive_index,
  retrive_next_token, retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling,
  target_probs[, draft_probs])`` (``draft_probs`` only when the callable names such a parameter:
  sgl-kernel's wrapper has had both signatures); thresholds and ``deterministic`` are the kernel's own
  defaults (bind others with ``functools.partial``). Inputs: ``candidates [1, N]`` int64 (the node
  tokens, the root at 0), ``retrive_index [1, N]`` = 0..N-1, ``retrive_next_token [1, N]`` (first
  child, -1 at a leaf) and ``retrive_next_sibling [1, N]`` (next sibling, -1 for the last) int64: the
  decoder's merged tree, whose siblings are distinct tokens, in draw order; ``uniform_samples [1, N]``
  and ``uniform_samples_for_final_sampling [1]`` float32 U(0, 1) drawn here from the run's generator;
  ``target_probs [1, N, V]`` float32; ``draft_probs [1, N, V]`` float32 zeros (what SGLang's caller
  passes: "target only"). Outputs, written in place: ``accept_token_num [1]`` int32 (accepted draft
  tokens a), ``accept_index [1, D + 1]`` int32 (D the tree's depth: the root's index, then the accepted
  nodes' indices), ``predicts [N]`` int32 (the token after each accepted position: the next accepted
  token, at the last one the correction or bonus token). The emitted tokens are
  ``predicts[accept_index[0, 0..a]]``.

Schemes (:data:`SCHEMES`): the decoder's ``"iid"`` and ``"without_replacement"``, and ``"top_k"``, the
engines' drafting (SGLang's EAGLE drafter, llama.cpp): deterministic distinct siblings, the draft's k
most likely first tokens (ties to the lower id), each continued by its most likely token
(:class:`TopKDrafts`; a shape of EAGLE's top-k tree: top-k at the root, greedy below it). A rule that
never reads the draft law (SGLang's) is judged under ``top_k``; the drafted tokens do not depend on
the verification's uniforms under any scheme.

Why statistical: the kernels take their randomness as inputs (a generator, or SGLang's uniforms), but
their output is known to be constant on cells of those inputs only by reading their code, which is
what is being judged. So the judge is :func:`~otm.certify.decoder.certify_decoder`'s calibrated
statistical mode: chi-square on the T-token sequences, with power 0.99 against every law at TV >= ``tv``.
Our own readings of the rules do have exact laws (:class:`SGLangRuleLaw`, :func:`exact_walk`): they
state the exact TV of SGLang's lossy thresholds and of the planted bugs (:data:`PLANTED`).

The ``sglang`` layout also gets two hand-made boundary calls (:func:`sglang_boundary_probes`: every coin
exactly 0 with a child of target probability 0; the final coin at the largest float32 below 1), whose
findings go to the report's notes. The command line names ``top_k`` ``--scheme top``.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from ..decode.chance import Sampled
from ..decode.tree_rules import TreeRule
from ..laws import OtmError
from ..tree_verification import VerificationTree
from .decoder import DEFAULT_DECODER_TV, SETTINGS, certify_decoder
from .report import Report

LAYOUTS = ("generic", "sglang")
"""Array layouts of :func:`certify_tree` (module docstring)."""

SCHEMES = ("iid", "without_replacement", "top_k")
"""Draftings a tree kernel is judged under: the decoder's two schemes and the engines' top-k."""

MAX_K, MAX_LENGTH = 4, 3
"""Largest trees judged (k rows of depth L): the toy settings' runs grow with the tree."""

TREE_SETTINGS = SETTINGS + (
    dict(name="depth 3, V=3 T=4", V=3, seeds=(61, 62), prompt=(1, 2), T=4, temperature=1.0, top_k=0, top_p=1.0,
         rollback="gather"),
    dict(name="4 siblings, V=5", V=5, seeds=(51, 52), prompt=(1, 2), T=3, temperature=1.0, top_k=0, top_p=1.0,
         rollback="refeed"),
)
"""The decoder's toy settings (:data:`otm.certify.decoder.SETTINGS`, T = 3: trees of depth <= 2, at most 3
distinct siblings) and two more: T = 4, so the first step drafts depth 3 when L = 3; V = 5, so a node
can have 4 distinct siblings (top-k with k = 4) and a residual."""

SGLANG_READ = ("sgl-project/sglang sgl-kernel/csrc/speculative/speculative_sampling.cuh "
               "(TreeSpeculativeSamplingTargetOnly) and speculative_sampling.cu, read at commit 120affb9613c; "
               "the Python wrapper sgl_kernel/speculative.py read at commit 01fe7c22269d (no draft_probs argument "
               "there; older wrappers take one)")
"""Where the SGLang rewrite's semantics were read (the sgl-kernel version number at that commit was not read)."""


# -- drafting ---------------------------------------------------------------------------------------------


class HostDraws(Sampled):
    """The decoder's own sampled draws, node by node (``device_walk`` off: a kernel reads its arrays on the host
    and each step's draft rows are cut to the support size before the kernel sees them)."""

    device_walk = False


class TopKDrafts(HostDraws):
    """The engines' deterministic drafting through the decoder's door (scheme ``without_replacement``):
    the root's k draws are the draft's k most likely tokens (descending, ties to the lower id; k cut to
    the support), every row's next token is its law's most likely token. Verification draws are sampled
    from the generator as usual."""

    def draft_without_replacement(self, law, k):
        order = sorted(range(law.shape[-1]), key=lambda t: (-float(law[0, t]), t))
        top = [t for t in order[:k] if float(law[0, t]) > 0]
        return torch.tensor([top], dtype=torch.int64, device=law.device)  # [1, k]

    def draft_iid(self, laws, k):
        if k != 1:
            raise OtmError("top-k drafting continues each row with one token: use scheme top_k with the decoder's "
                           "without-replacement root")
        return laws.argmax(-1, keepdim=True)  # [n, 1]: the first maximum, the lower id on ties


# -- the layouts ------------------------------------------------------------------------------------------


def _ints(x, what: str) -> list[int]:
    try:
        if isinstance(x, torch.Tensor):
            return [int(v) for v in x.detach().cpu().reshape(-1).tolist()]
        return [int(v) for v in x]
    except (TypeError, ValueError) as exc:
        raise OtmError(f"the kernel's {what} is not a list of token/node ids ({exc}): return lists or 1-D tensors")


def generic_arrays(dec, tree, drafts, target_laws):
    """The generic layout's inputs ``(parents, tokens, draft_probs, target_probs)`` and the draw tree
    (:class:`~otm.tree_verification.VerificationTree`, whose ``node`` maps a draw to the decoder's node)."""
    vt = VerificationTree.from_tree(tree)
    n, V = len(vt.node), target_laws.shape[-1]
    device = target_laws.device
    target = target_laws[vt.node].to(torch.float64)  # [N, V]
    draft = torch.zeros((n, V), dtype=torch.float64, device=device)  # [N, V]
    for v in range(n):
        if vt.children[v]:
            draft[v] = dec.node_draft_law(tree, vt.node[v], drafts)[0].to(device=device, dtype=torch.float64)
    parents = torch.tensor(vt.parent, dtype=torch.int64, device=device)
    tokens = torch.tensor(vt.token, dtype=torch.int64, device=device)
    return parents, tokens, draft, target, vt


def _check_path(emitted: list[int], path: list[int], parents: list[int], tokens: list[int], V: int, what: str):
    if len(emitted) != len(path) + 1:
        raise OtmError(f"the kernel emitted {len(emitted)} tokens for {len(path)} accepted nodes ({what}): a step "
                       "emits the accepted path's tokens and one more")
    previous = 0
    for node, token in zip(path, emitted):
        if not 0 < node < len(parents) or parents[node] != previous:
            raise OtmError(f"the kernel accepted node {node}, not a child of node {previous} ({what})")
        if tokens[node] != token:
            raise OtmError(f"the kernel emitted token {token} for accepted node {node} of token {tokens[node]} "
                           f"({what})")
        previous = node
    if not 0 <= emitted[-1] < V:
        raise OtmError(f"the kernel emitted token {emitted[-1]} outside the vocabulary of {V} tokens ({what})")


def _call(kernel, *args):
    try:
        return kernel(*args)
    except OtmError:
        raise
    except Exception as exc:  # noqa: BLE001 - a kernel's crash is a failing case, named in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise OtmError(f"the kernel raised {type(exc).__name__}: {first}") from None


def _takes_draft_probs(kernel) -> bool:
    try:
        return "draft_probs" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):  # a builtin or an op without a signature: pass it (the older convention)
        return True


def sglang_arrays(tree, target_laws, generator):
    """SGLang's inputs and zeroed outputs for the decoder's merged tree (module docstring), as a dict."""
    n, V = tree.size, target_laws.shape[-1]
    device = target_laws.device
    depth = max(tree.depth)
    first = [-1] * n
    sibling = [-1] * n
    for node, kids in enumerate(tree.children):
        if kids:
            first[node] = kids[0]
            for a, b in zip(kids, kids[1:]):
                sibling[a] = b

    def ids(values):
        return torch.tensor([values], dtype=torch.int64, device=device)  # [1, N]

    u = torch.rand((1, n + 1), generator=generator, dtype=torch.float32, device=generator.device).to(device)
    return dict(
        predicts=torch.full((n,), -1, dtype=torch.int32, device=device),
        accept_index=torch.full((1, depth + 1), -1, dtype=torch.int32, device=device),
        accept_token_num=torch.zeros((1,), dtype=torch.int32, device=device),
        candidates=ids([int(t) for t in tree.tokens]),
        retrive_index=ids(list(range(n))),
        retrive_next_token=ids(first),
        retrive_next_sibling=ids(sibling),
        uniform_samples=u[:, :n].contiguous(),
        uniform_samples_for_final_sampling=u[0, n:].contiguous(),
        target_probs=target_laws.to(torch.float32)[None].contiguous(),  # [1, N, V]
        draft_probs=torch.zeros((1, n, V), dtype=torch.float32, device=device),
    )


SGLANG_ORDER = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
                "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs")
"""The positional order of SGLang's arguments (``draft_probs`` after them where the kernel takes it)."""


def sglang_outputs(arrays: dict, tree) -> tuple[list[int], list[int]]:
    """``(emitted tokens, accepted path nodes)`` read from SGLang's outputs after the call, checked."""
    a = _ints(arrays["accept_token_num"], "accept_token_num")[0]
    index = _ints(arrays["accept_index"], "accept_index")
    predicts = _ints(arrays["predicts"], "predicts")
    if not 0 <= a < len(index):
        raise OtmError(f"accept_token_num = {a} does not fit accept_index of {len(index)} entries")
    if index[0] != 0:
        raise OtmError(f"accept_index starts at {index[0]}, not at the root's index 0")
    path = index[1 : a + 1]
    if any(not 0 <= i < len(predicts) for i in index[: a + 1]):
        raise OtmError(f"accept_index {index[: a + 1]} points outside the {len(predicts)} draft positions")
    emitted = [predicts[i] for i in index[: a + 1]]
    parents = [int(x) for x in tree.parent]
    V = arrays["target_probs"].shape[-1]
    _check_path(emitted, path, parents, [int(t) for t in tree.tokens], V, "sglang layout")
    return emitted, path


class KernelRule(TreeRule):
    """A tree kernel in one of :data:`LAYOUTS`, run by the decoder as its tree rule (module docstring)."""

    def __init__(self, kernel, layout: str, name: str = "tree kernel"):
        self.kernel, self.layout, self.name = kernel, layout, name
        self.draft_probs = layout == "sglang" and _takes_draft_probs(kernel)

    def walk(self, dec, tree, drafts, target_laws):
        generator = getattr(dec.chance, "generator", None)
        if generator is None:
            raise OtmError("a tree kernel draws its own randomness: it is certified statistically (exact=False)")
        if self.layout == "generic":
            parents, tokens, draft, target, vt = generic_arrays(dec, tree, drafts, target_laws)
            out = _call(self.kernel, parents, tokens, draft, target, generator)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise OtmError("a generic-layout kernel returns (emitted tokens, accepted nodes)")
            emitted, path = _ints(out[0], "emitted tokens"), _ints(out[1], "accepted nodes")
            _check_path(emitted, path, vt.parent, vt.token, target.shape[-1], "generic layout")
            path = [vt.node[v] for v in path]
        else:
            arrays = sglang_arrays(tree, target_laws, generator)
            args = [arrays[name] for name in SGLANG_ORDER] + ([arrays["draft_probs"]] if self.draft_probs else [])
            _call(self.kernel, *args)
            emitted, path = sglang_outputs(arrays, tree)
        dec.count_path(len(path))
        return emitted, path


# -- SGLang's rule: a rewrite of the kernel, and its exact law --------------------------------------------


def sglang_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                       draft_probs=None, threshold_single: float = 1.0, threshold_acc: float = 1.0,
                       deterministic: bool = True) -> None:
    r"""A CPU torch **rewrite** (our code, from the kernel's semantics as read: :data:`SGLANG_READ`) of
    sgl-kernel's ``tree_speculative_sampling_target_only``, in its layout and float32 arithmetic.

    Per request b: from the root, with the coin ``u = uniform_samples[b, node]`` of the current node,
    visit the children in sibling order adding their target probabilities to a running sum s; accept
    a child when ``u <= s / max(threshold_acc, 1e-9)`` or its own probability is ``>= threshold_single``
    (then move there with its coin and a fresh sum), else set ``draft_probs[child token] = p(child)``
    at the current node and try the next sibling; stop when every sibling is rejected, at a leaf, or
    after ``accept_index.shape[1] - 1`` tokens. The last token is the inverse-CDF draw, with
    ``uniform_samples_for_final_sampling[b]``, from ``relu(p - draft_probs)`` at the node reached
    (from p when all ``accept_index.shape[1] - 1`` tokens were accepted), counting only positive
    entries (the last positive one if rounding leaves the coin above the sum). With both thresholds 1
    a child is accepted iff a single draw y ~ p, the children first in the order, equals it: lossless
    for distinct siblings. ``deterministic`` (the block scan's mode) changes nothing on one thread.
    ``draft_probs`` (``[B, N, V]`` zeros, mutated as the kernel does) may be omitted (the newer wrapper).
    """
    B, N = candidates.shape
    V = target_probs.shape[-1]
    steps = accept_index.shape[1]
    acc = max(float(threshold_acc), 1e-9)
    single = torch.tensor(float(threshold_single), dtype=torch.float32)
    for b in range(B):
        p_all = target_probs[b].to(torch.float32)  # [N, V]
        dp = draft_probs[b] if draft_probs is not None else torch.zeros((N, V), dtype=torch.float32)
        node, accepted = 0, 0
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        coin = uniform_samples[b, 0].to(torch.float32)
        for _ in range(1, steps):
            child = int(retrive_next_token[b, node])
            s = torch.zeros((), dtype=torch.float32)
            moved = False
            while child != -1:
                token = int(candidates[b, child])
                p_single = p_all[node, token]
                s = s + p_single
                if bool(coin <= s / acc) or bool(p_single >= single):
                    predicts[last] = token
                    accepted += 1
                    last = int(retrive_index[b, child])
                    accept_index[b, accepted] = last
                    node, coin, moved = child, uniform_samples[b, child].to(torch.float32), True
                    break
                dp[node, token] = p_single
                child = int(retrive_next_sibling[b, child])
            if not moved:
                break
        accept_token_num[b] = accepted
        p = p_all[node]
        residual = p if accepted == steps - 1 else torch.clamp(p - dp[node].to(torch.float32), min=0.0)  # [V]
        u = uniform_samples_for_final_sampling[b].to(torch.float32) * residual.sum()
        cdf = torch.cumsum(residual, 0)  # [V] float32
        hits = torch.nonzero((cdf > u) & (residual > 0)).flatten()
        positive = torch.nonzero(residual > 0).flatten()
        predicts[last] = int(hits[0]) if hits.numel() else (int(positive[-1]) if positive.numel() else V - 1)


class SGLangRuleLaw(TreeRule):
    r"""SGLang's rule (our reading, :func:`sglang_target_only`) with its decisions drawn from their exact
    laws through the decoder's door of chance, so the decoder's exact mode gives its exact law of T tokens.

    At a node with children :math:`c_1..c_m` (sibling order), :math:`S_i = \sum_{j \le i} p(c_j)` and the
    first child with :math:`p(c_i) \ge` ``threshold_single`` at :math:`i^*` (m + 1 if none), child
    :math:`i \le i^*` is accepted with probability :math:`\min(1, S_i/t) - \min(1, S_{i-1}/t)` (t =
    ``threshold_acc``; child :math:`i^*`: :math:`1 - \min(1, S_{i^*-1}/t)`), all rejected with
    :math:`1 - \min(1, S_m/t)`, then a token from p without the children; at a leaf of depth L a token
    from p. With both thresholds 1 this is y ~ p at every node: exactly lossless.
    """

    def __init__(self, threshold_single: float = 1.0, threshold_acc: float = 1.0):
        self.ts, self.ta = float(threshold_single), max(float(threshold_acc), 1e-9)
        self.name = f"sglang law (threshold_single {self.ts:g}, threshold_acc {threshold_acc:g})"

    def walk(self, dec, tree, drafts, target_laws):
        node, path = 0, []
        depth_max = max(tree.depth)
        law64 = target_laws.to(torch.float64)
        while True:
            kids = tree.children[node]
            p = law64[node]
            if not kids or len(path) == depth_max:
                dec.count_path(len(path))
                return [int(t) for t in tree.tokens[path]] + [dec.bonus(tree, node, target_laws)], path
            probs, s_prev = [], 0.0
            for c in kids:
                pc = float(p[int(tree.tokens[c])])
                s = s_prev + pc
                if pc >= self.ts:
                    probs.append(1.0 - min(1.0, s_prev / self.ta))
                    s_prev = math.inf
                    break
                probs.append(min(1.0, s / self.ta) - min(1.0, s_prev / self.ta))
                s_prev = s
            residual = p.clone()
            residual[tree.tokens[kids]] = 0.0
            reject = 0.0 if (s_prev == math.inf or float(residual.sum()) <= 0) else 1.0 - min(1.0, s_prev / self.ta)
            choice = dec.chance.index(torch.tensor([probs + [0.0] * (len(kids) - len(probs)) + [reject]],
                                                   dtype=torch.float64, device=p.device))
            if choice == len(kids):
                dec.count_path(len(path))
                return [int(t) for t in tree.tokens[path]] + [dec.chance.index(residual[None])], path
            node = kids[choice]
            path.append(node)


# -- a correct generic kernel and planted bugs ------------------------------------------------------------


def rrs_walk(parents, tokens, draft_probs, target_probs, draw, *, without_replacement: bool = False,
             bug: str | None = None) -> tuple[list[int], list[int]]:
    r"""Level-by-level recursive rejection sampling on the tree of draws (generic layout): at node n,
    with :math:`\tilde p = p_n` and :math:`\tilde q = q_n`, try the children (the draws at n) in order,
    accepting child x with probability :math:`\min(1, \tilde p(x)/\tilde q(x))`, after a rejection
    :math:`\tilde p \leftarrow \mathrm{norm}(\tilde p - \tilde q)_+` (and, for draws without
    replacement, :math:`\tilde q \leftarrow \mathrm{norm}(\tilde q` without x)); an accepted child is
    walked the same way; when all are rejected emit a token of :math:`\tilde p`; at a leaf a token of
    :math:`p_{leaf}`. Exact for i.i.d. draws (SpecTr; Yang et al. 2024) and, with
    ``without_replacement``, for draws without replacement (Jeon et al. 2024); drafts without a
    sampling law (top-k) are outside both.

    ``draw(weights [n] float64) -> index`` is the only randomness. ``bug`` plants one realistic fault
    (:data:`PLANTED`).
    """
    parents = [int(x) for x in parents]
    toks = [int(x) for x in tokens]
    children: list[list[int]] = [[] for _ in parents]
    for v, u in enumerate(parents):
        if u >= 0:
            children[u].append(v)
    node, path = 0, []
    while True:
        kids = children[node]
        p = target_probs[node].to(torch.float64)
        if not kids:
            law = target_probs[parents[node]] if (bug == "bonus_from_parent" and node) else p
            return [toks[v] for v in path] + [draw(law.to(torch.float64))], path
        q = draft_probs[node].to(torch.float64).clone()
        pt = p.clone()  # the residual target law after the rejected siblings
        moved = False
        for c in kids:
            x = toks[c]
            tested = p if bug == "residual_not_updated" else pt  # the bug: every sibling tested against p
            if float(tested[x]) <= 0:
                ratio = 0.0  # never accept a token the (residual) target law cannot emit
            else:
                ratio = 1.0 if float(q[x]) <= 0 else min(1.0, float(tested[x]) / float(q[x]))
            if ratio >= 1.0 or (ratio > 0.0 and draw(torch.tensor([1.0 - ratio, ratio], dtype=torch.float64)) == 1):
                node, moved = c, True
                path.append(c)
                break
            res = torch.clamp(pt - q, min=0.0)
            pt = res / res.sum() if float(res.sum()) > 0 else pt
            if without_replacement:
                q[x] = 0.0
                q = q / q.sum() if float(q.sum()) > 0 else q
        if not moved:
            law = p if bug == "correction_from_target" else pt
            return [toks[v] for v in path] + [draw(law)], path


def _sampler(generator):
    def draw(weights):
        return int(torch.multinomial(weights.to(torch.float64), 1, generator=generator))
    return draw


def generic_rrs(parents, tokens, draft_probs, target_probs, generator):
    """A correct generic-layout kernel for i.i.d. drafting: :func:`rrs_walk` with the generator."""
    return rrs_walk(parents, tokens, draft_probs, target_probs, _sampler(generator))


def generic_rrs_without_replacement(parents, tokens, draft_probs, target_probs, generator):
    """A correct generic-layout kernel for drafting without replacement (scheme ``without_replacement``)."""
    return rrs_walk(parents, tokens, draft_probs, target_probs, _sampler(generator), without_replacement=True)


PLANTED = {
    "residual_not_updated": "a sibling tested against the node's target law, not the residual left by the "
                            "rejected siblings before it",
    "bonus_from_parent": "the bonus token after a fully accepted path drawn from the parent's law, not the leaf's",
    "correction_from_target": "the correction token drawn from the target law, not the residual",
}
"""Planted tree bugs of the generic layout (:func:`rrs_walk`'s ``bug``)."""


def planted_kernel(bug: str):
    """A generic-layout kernel with one planted bug of :data:`PLANTED` (a negative control)."""
    if bug not in PLANTED:
        raise OtmError(f"unknown planted tree bug {bug!r}: choose one of {', '.join(PLANTED)}")

    def kernel(parents, tokens, draft_probs, target_probs, generator):
        return rrs_walk(parents, tokens, draft_probs, target_probs, _sampler(generator), bug=bug)

    kernel.__name__ = f"planted_{bug}"
    return kernel


class _ExactWalk(TreeRule):
    """:func:`rrs_walk` on the decoder's tree with every draw through the door of chance (exact mode)."""

    def __init__(self, bug, without_replacement):
        self.bug, self.wor = bug, without_replacement
        self.name = f"rrs walk ({bug or 'correct'})"

    def walk(self, dec, tree, drafts, target_laws):
        parents, tokens, draft, target, vt = generic_arrays(dec, tree, drafts, target_laws)
        emitted, path = rrs_walk(parents, tokens, draft, target, lambda w: dec.chance.index(w[None]),
                                 without_replacement=self.wor, bug=self.bug)
        dec.count_path(len(path))
        return emitted, [vt.node[v] for v in path]


def exact_walk(bug: str | None = None, *, without_replacement: bool = False) -> TreeRule:
    """The generic walk (correct, or with a planted bug) as a tree rule with exact decision laws: the decoder's
    exact mode gives its exact law, hence the exact TV of each planted bug (``certify_decoder(exact_walk(bug))``)."""
    return _ExactWalk(bug, without_replacement)


# -- boundary probes (sglang layout) ----------------------------------------------------------------------

BELOW_ONE = 1.0 - 2.0 ** -24
"""The largest float32 uniform below 1."""


def _probe_tree():
    """Root (token 0) with children 1 then 2; child 1 has target probability 0 at the root."""
    from ..decode.tree import DraftTree

    return DraftTree.from_rows([[1], [2]], root_token=0)


def sglang_boundary_probes(kernel, takes_draft_probs: bool) -> list[str]:
    """Findings of two hand-made calls (empty when none): with every coin exactly 0, a child of target
    probability 0 must not be accepted (``coin <= prob_acc`` accepts it: sgl-project/sglang#35771); with the
    final coin at the largest float32 below 1 the emitted token must have positive mass (the block scan's
    fallback). Each event has probability about 2^-24 per float32 coin: reported, not refuting."""
    tree = _probe_tree()
    target = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.5, 0.0, 0.5]],
                          dtype=torch.float64)  # [N, V]: the root's law gives child 1 no mass
    found = []
    for what, coins, final in (("every coin 0", 0.0, 0.5), ("final coin 1 - 2^-24", 0.3, BELOW_ONE)):
        gen = torch.Generator()
        arrays = sglang_arrays(tree, target, gen)
        arrays["uniform_samples"].fill_(coins)
        arrays["uniform_samples_for_final_sampling"].fill_(final)
        args = [arrays[name] for name in SGLANG_ORDER] + ([arrays["draft_probs"]] if takes_draft_probs else [])
        try:
            _call(kernel, *args)
            emitted, path = sglang_outputs(arrays, tree)
        except OtmError as exc:
            found.append(f"boundary probe ({what}): {exc}")
            continue
        laws = [0] + path
        zero = [(t, n) for t, n in zip(emitted, laws) if float(target[n, t]) <= 0]
        if zero:
            t, n = zero[0]
            found.append(f"boundary probe ({what}): emitted token {t} of target probability 0 at node {n}"
                         + (" (coin <= prob_acc accepts a zero-probability child at coin 0: sgl-project/sglang#35771)"
                            if what == "every coin 0" else ""))
    return found


# -- the judge --------------------------------------------------------------------------------------------

TREE_KERNELS = {"sglang": ("sglang", sglang_target_only), "rrs": ("generic", generic_rrs),
                "rrs_without_replacement": ("generic", generic_rrs_without_replacement)}
"""Built-in tree kernels by name: (layout, kernel). ``sglang`` is the rewrite of SGLang's kernel."""


def _whole(value, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OtmError(f"{name} must be a whole number from {low} to {high} for a tree kernel, got {value!r}")
    return value


def _kernel_name(kernel) -> str:
    if isinstance(kernel, functools.partial):  # thresholds bound by functools.partial: name them
        bound = ", ".join(f"{key}={value!r}" for key, value in kernel.keywords.items())
        return f"{_kernel_name(kernel.func)}({bound})"
    module, qualname = getattr(kernel, "__module__", None), getattr(kernel, "__qualname__", "")
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"{module}:{qualname}"  # MODULE:FN, as the command line names it
    return getattr(kernel, "__name__", type(kernel).__name__)


def certify_tree(kernel, *, layout: str, k: int = 2, length: int = 2, tv: float = DEFAULT_DECODER_TV,
                 alpha: float = 0.001, seed: int = 0, scheme: str = "iid") -> Report:
    """Certify a tree kernel in ``layout`` inside the decoder, statistically (module docstring).

    Parameters
    ----------
    kernel : a callable in the layout's signature, or a name of :data:`TREE_KERNELS`.
    layout : one of :data:`LAYOUTS`.
    k, length : rows of the draft tree (1..4) and its depth L (1..3).
    tv, alpha : total variation detected with power >= 0.99 on every toy setting; family-wise level.
    seed : seed of the runs.
    scheme : the drafting (:data:`SCHEMES`); ``top_k`` is the engines' (SGLang's) deterministic top-k.
    """
    if layout not in LAYOUTS:
        raise OtmError(f"unknown tree layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    if scheme not in SCHEMES:
        raise OtmError(f"unknown drafting scheme {scheme!r} for a tree kernel: choose one of {', '.join(SCHEMES)}")
    k, length = _whole(k, "k", 1, MAX_K), _whole(length, "length", 1, MAX_LENGTH)
    name = kernel if isinstance(kernel, str) else _kernel_name(kernel)
    if isinstance(kernel, str):
        if kernel not in TREE_KERNELS:
            raise OtmError(f"unknown tree kernel {kernel!r}: give a callable (MODULE:FN) or one of "
                           f"{', '.join(TREE_KERNELS)}")
        own, kernel = TREE_KERNELS[kernel]
        if own != layout:
            raise OtmError(f"the built-in tree kernel {name!r} is in the {own} layout: give --layout {own}")
    elif not callable(kernel):
        raise OtmError(f"a tree kernel must be a callable in the {layout} layout, got {type(kernel).__name__}")
    rule = KernelRule(kernel, layout, name)
    report = certify_decoder(rule, scheme="without_replacement" if scheme == "top_k" else scheme, k=k, length=length,
                             tv=tv, alpha=alpha, seed=seed, exact=False, name=name,
                             chance=TopKDrafts if scheme == "top_k" else HostDraws, settings=TREE_SETTINGS)
    report.kind, report.scheme = "tree", scheme
    for case in report.cases:
        case.scheme = scheme
        case.setting["layout"] = layout
    drafting = ("the engines' top-k drafting (k most likely first tokens, greedy continuations)" if scheme == "top_k"
                else f"the decoder's {scheme} drafting")
    report.method = f"{layout} layout, {drafting}; " + report.method
    if layout == "sglang":
        report.notes += sglang_boundary_probes(kernel, rule.draft_probs)
    cli_scheme = "top" if scheme == "top_k" else scheme  # the command line's name of the top-k drafting
    report.command = (f"otm certify {name} --kind tree --layout {layout} --scheme {cli_scheme} -k {k} "
                      f"--length {length} "
                      f"--tv {tv:g} --seed {seed}")
    return report


__all__ = ["BELOW_ONE", "LAYOUTS", "MAX_K", "MAX_LENGTH", "PLANTED", "SCHEMES", "SGLANG_ORDER", "SGLANG_READ",
           "TREE_KERNELS", "TREE_SETTINGS", "certify_tree", "exact_walk", "generic_arrays", "generic_rrs",
           "generic_rrs_without_replacement", "HostDraws", "KernelRule", "planted_kernel", "rrs_walk",
           "sglang_arrays", "sglang_boundary_probes", "sglang_outputs", "sglang_target_only", "SGLangRuleLaw",
           "TopKDrafts"]
