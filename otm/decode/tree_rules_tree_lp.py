r"""The tree LP as a verifier: the best lossless verifier of each step's draft tree, for toy LMs.

For one fixed context c, :func:`otm.analysis.tree_optimum.solve_tree_lp` maximises the expected
block length over plans :math:`\pi(S, b)`, S the node set of the step's draft tree and b the emitted
block (a path of the tree plus one token), under the lossless equations
(``docs/tree_optimum.md``):

.. math::

    \max \sum_{S, b} |b|\,\pi(S, b) \quad\text{s.t.}\quad \sum_b \pi(S, b) = \mu(S),\qquad
    G(x) = p(x \mid c),\quad G(s x) = p(x \mid c, s)\,\big(G(s) - g(s)\big),

with :math:`g(b) = \sum_S \pi(S, b)` and :math:`G(s) = \sum_{b \succeq s} g(b)`. Any feasible plan is a
lossless verifier: given the step's node set S, emit b with probability
:math:`\pi(S, b) / \mu(S)`. :class:`TreeLP` is that verifier with an optimal plan, so its expected
tokens per target call in a step is the LP's value, the most any lossless verifier of that step's
tree can reach (a ceiling to plot the published rules against, not a practical rule: the LP needs
the target's and the draft's laws off the tree, so it runs on toy LMs only).

**In the decoder.** :class:`TreeLP` is built with the two models and the sampling the decoder
runs with (it recomputes their laws with :func:`otm.decode.toy.model_law`, cache-free). In
:meth:`TreeLP.walk` it

1. finds the step's context (the committed tokens; :meth:`TreeLP.context`);
2. solves the LP of (context, k, step depth L, scheme) once and keeps the plan
   (:func:`otm.analysis.tree_optimum.solve_tree_plan`, HiGHS' vertex polished to float64
   rounding, cached by the context's token tuple);
3. checks that the decoder's target laws at every node and draft laws at every inner node are the
   laws the plan was built from (to ``law_tolerance``): a rule built for other models, another
   sampling, a wrong context or a stale plan is refused in one line instead of drawing from a wrong plan;
4. draws b from :math:`\pi(S, \cdot)/\mu(S)` with ONE ``dec.chance.index`` (the exact mode enumerates it)
   and returns b and the nodes of its path :math:`b_1..b_{|b|-1}` in the tree.

The next step restarts from :math:`c + b`, a new context with its own LP. Exactness of every step's
block law (the lossless equations hold for the polished plan to 1e-13) makes the whole stream the
target's (induction over the steps, ``docs/tree_optimum.md``).

>>> from otm.decode import Sampling, speculative_decode
>>> from otm.decode.toy import ToyLM
>>> target, draft = ToyLM(3, seed=0), ToyLM(3, seed=1)
>>> rule = TreeLP(target, draft, Sampling())
>>> out = speculative_decode(target, draft, [0, 2], k=2, length=2, verifier=rule, max_new_tokens=6, seed=0)
>>> len(out.tokens), out.stats.method
(6, 'tree_lp iid k=2 L=2')
"""

from __future__ import annotations


import numpy as np

from ..analysis.tree_optimum import MAX_TREES, MAX_VARIABLES, TreePlan, solve_tree_plan
from ..laws import OtmError
from .sampling import Sampling
from .toy import model_law
from .tree_rules import HostLaws, TreeRule

LAW_TOLERANCE = 1e-12
"""Largest difference allowed between the decoder's laws on the tree and the laws the LP is built from."""


def node_prefixes(tree) -> list[tuple[int, ...]]:
    """The token path (depth 1 first) of every node of a :class:`~otm.decode.tree.DraftTree`; node 0: ``()``."""
    tokens, parent = tree.tokens.tolist(), tree.parent.tolist()
    out: list[tuple[int, ...]] = [()]
    for i in range(1, tree.size):  # parents precede children
        out.append(out[parent[i]] + (tokens[i],))
    return out


class TreeLP(TreeRule):
    r"""The tree LP's optimal plan as the decoder's verifier (module docstring).

    Parameters
    ----------
    target_lm, draft_lm : the decoder's target and draft models (toy LMs: the LP enumerates every
        draft tree, ``V^{kL}`` of them).
    sampling : the :class:`~otm.decode.sampling.Sampling` the decoder runs with (default temperature 1).
    max_trees, max_variables : the LP's size limits (:func:`otm.analysis.tree_optimum.solve_tree_lp`).
    law_tolerance : how far the decoder's laws may be from the LP's (checked at every step).

    Attributes
    ----------
    plans : ``{(context, k, L, scheme): TreePlan}``, one LP solved per context and step shape.
    """

    name = "tree_lp"

    def __init__(self, target_lm=None, draft_lm=None, sampling: Sampling | None = None, *, max_trees: int = MAX_TREES,
                 max_variables: int = MAX_VARIABLES, law_tolerance: float = LAW_TOLERANCE):
        if target_lm is None or draft_lm is None:
            raise OtmError("TreeLP needs the run's target and draft models and sampling: TreeLP(target_lm, draft_lm, "
                           "sampling), passed to speculative_decode(verifier=...) as an instance")
        self.target_lm, self.draft_lm = target_lm, draft_lm
        self.sampling = Sampling() if sampling is None else sampling
        self.max_trees, self.max_variables, self.law_tolerance = max_trees, max_variables, law_tolerance
        self.plans: dict[tuple, TreePlan] = {}
        self.sources: dict[tuple, tuple] = {}  # plan key -> the context whose laws the plan was built from
        self._laws: dict[tuple, tuple] = {}  # context -> (target law, draft law), prefix -> [V] float64

    # -- the step's context and plan ------------------------------------------------------------

    def laws(self, context: tuple) -> tuple:
        """``(target, draft)``: ``prefix -> [V]`` float64 laws after ``context`` (memoised)."""
        if context not in self._laws:
            self._laws[context] = (model_law(self.target_lm, list(context), self.sampling),
                                   model_law(self.draft_lm, list(context), self.sampling))
        return self._laws[context]

    def plan_key(self, context: tuple, k: int, L: int, scheme: str, delay: int = 0) -> tuple:
        """The cache key of a step's plan: the context's tokens and the step's shape."""
        return (tuple(context), k, L, scheme, delay)

    def plan(self, context: tuple, k: int, L: int, scheme: str, delay: int = 0) -> tuple[TreePlan, tuple]:
        """``(plan, source)``: the optimal plan of the step from ``context`` with k rows of depth L (after a
        shared path of ``delay`` tokens: a delayed tree) (solved once, then cached) and the context whose
        laws it was built from (checked by :meth:`check_laws`)."""
        key = self.plan_key(context, k, L, scheme, delay)
        if key not in self.plans:
            target, draft = self.laws(tuple(context))
            self.plans[key] = solve_tree_plan(target, draft, k, L, scheme, max_trees=self.max_trees,
                                              max_variables=self.max_variables, delay=delay)
            self.sources[key] = tuple(context)
        return self.plans[key], self.sources[key]

    def context(self, dec, tree) -> tuple[int, ...]:
        """The committed tokens of the step (prompt and every token emitted so far; the last is the root):
        the step context's ``committed`` (:class:`otm.decode.step_context.StepContext`), checked against the tree."""
        context = tuple(int(t) for t in dec.committed)
        if not context or context[-1] != int(tree.tokens[0]):
            raise OtmError(f"TreeLP was given a context that does not end at the tree's root ({len(context)} tokens): "
                           "run it inside the decoder")
        return context

    def check_laws(self, dec, tree, drafts, target_laws, context: tuple, prefixes: list[tuple]) -> None:
        """Refuse (one line) a step whose laws on the tree are not the laws after ``context`` (the plan's source)."""
        target, draft = self.laws(context)
        host = dec.host_laws  # the step's laws read back in one copy (HostLaws), else read here
        host = host if host is not None and host.tree is tree else HostLaws(dec, tree, drafts, target_laws, draws=0)
        for node, prefix in enumerate(prefixes):
            gap = float(np.abs(host.target[node] - target(prefix)).max())
            if gap > self.law_tolerance:
                raise OtmError(f"the decoder's target law at node {node} differs from TreeLP's by {gap:.3g}: build "
                               "TreeLP with the decoder's target, draft and sampling")
            if tree.children[node]:
                gap = float(np.abs(host.draft[node] - draft(prefix)).max())
                if gap > self.law_tolerance:
                    raise OtmError(f"the decoder's draft law at node {node} differs from TreeLP's by {gap:.3g}: build "
                                   "TreeLP with the decoder's target, draft and sampling")

    def node_set(self, tree, prefixes: list[tuple]) -> frozenset:
        """The step's node set S: the token paths of every non-root node (what the LP's plan is indexed by)."""
        return frozenset(prefixes[1:])

    def conditional(self, plan: TreePlan, node_set: frozenset) -> tuple:
        """``(blocks, weights)``: the plan's law of the block given the step's node set."""
        found = plan.conditional.get(node_set)
        if found is None:
            raise OtmError(f"the decoder drew a draft tree the tree LP gives no mass ({len(node_set)} nodes): check "
                           "TreeLP's models and the decoder's scheme")
        return found

    # -- the walk ---------------------------------------------------------------------------------

    def walk(self, dec, tree, drafts, target_laws):
        context = self.context(dec, tree)
        prefixes = node_prefixes(tree)
        L = int(drafts.rows.shape[1])  # the step's depth (cut near max_new_tokens)
        k, delay = dec.k, int(getattr(tree, "delay", 0))
        if delay >= L:  # a delayed step cut to its shared path near max_new_tokens: one chain, one draw per node
            k, delay = 1, 0
        plan, source = self.plan(context, k, L, dec.scheme if k > 1 else "iid", delay)
        host = HostLaws(dec, tree, drafts, target_laws, draws=1)  # one read of the laws and of the uniform
        self.check_laws(dec, tree, drafts, target_laws, source, prefixes)
        blocks, weights = self.conditional(plan, self.node_set(tree, prefixes))
        i = host.index(np.asarray(weights, dtype=np.float64))
        block = blocks[i]
        node_of = {prefix: node for node, prefix in enumerate(prefixes)}
        path = [node_of[block[:d]] for d in range(1, len(block))]  # b_1..b_{m-1}: a path of the tree
        depth = len(path)
        dec.count_path(depth, limit=L)  # depths reached, as Block counts them
        return list(block), path


_SHARED: list[TreeLP] = []
SHARED_RULES = 4
"""How many :func:`shared_tree_lp` instances are kept (the most recently used)."""


def shared_tree_lp(target_lm, draft_lm, sampling: Sampling | None = None) -> TreeLP:
    """One :class:`TreeLP` per (target, draft, sampling), reused across runs so each context's LP is solved once.

    For a caller that builds the rule afresh for every run (the decoder making a registered rule by
    name: :func:`otm.decode.exact_mode.exact_decode` runs the decoder once per enumerated run). The
    last :data:`SHARED_RULES` instances are kept (they hold their models, so an ``id`` is never reused
    while cached).
    """
    sampling = Sampling() if sampling is None else sampling
    for i, rule in enumerate(_SHARED):
        if rule.target_lm is target_lm and rule.draft_lm is draft_lm and rule.sampling == sampling:
            _SHARED.insert(0, _SHARED.pop(i))
            return rule
    rule = TreeLP(target_lm, draft_lm, sampling)
    _SHARED.insert(0, rule)
    del _SHARED[SHARED_RULES:]
    return rule


__all__ = ["LAW_TOLERANCE", "SHARED_RULES", "TreeLP", "node_prefixes", "shared_tree_lp"]
