r"""Layer verification in the decoder: a single-step verifier lifted to the whole draft tree.

The rule, its proof of exactness and what is reconstructed (only the abstract of Cha, Cho & Yun,
"Layer Verification Accelerates Speculative Tree Decoding", AdaptFM @ ICML 2026, was readable) are in
:mod:`otm.tree_verifiers.layer`, with the float64 numpy arithmetic this rule runs.

Use: ``speculative_decode(..., verifier="layer")`` lifts the ``optimal`` single-step verifier
(``optimal_embedded`` at a root drafted without replacement); any other single-step verifier is
chosen by instance, ``speculative_decode(..., verifier=Layer(step="kseq"))`` (``kseq``, ``rrs``,
``optimal``, ``speculative`` for ``iid``; their without-replacement counterparts, or the same
names, for ``without_replacement``).
"""

from __future__ import annotations

from ..laws import OtmError
from ..tree_verifiers.layer import layer_plan, step_laws
from .tree_rules import HostLaws, TreeRule


class Layer(TreeRule):
    """Layer verification with the single-step verifier ``step`` (module docstring).

    >>> Layer().name, Layer(step="kseq").name
    ('layer', 'layer:kseq')
    """

    def __init__(self, step: str = "optimal"):
        if not isinstance(step, str):
            raise OtmError(f"step must be the name of a single-step verifier (kseq, rrs, optimal), got {step!r}")
        self.step = step
        self.name = "layer" if step == "optimal" else f"layer:{step}"
        self._laws: dict[str, tuple] = {}
        self._memo: dict = {}  # single-step laws already computed (otm.tree_verifiers.layer.layer_plan)

    def laws(self, scheme: str):
        """``(root law, deep law, resolved name)`` of the step for ``scheme`` (checked once per scheme)."""
        if scheme not in self._laws:
            self._laws[scheme] = step_laws(self.step, scheme)
        return self._laws[scheme]

    def walk(self, dec, tree, drafts, target_laws):
        if not tree.children[0]:  # no drafts this step: the target's own draw
            return [dec.bonus(tree, 0, target_laws)], []
        root_law, deep_law, _ = self.laws(dec.scheme)
        host = HostLaws(dec, tree, drafts, target_laws, draws=max(tree.depth) + 2)  # one per layer, one more
        plan = layer_plan(tree, lambda n: host.target[n].copy(), lambda n: host.draft[n].copy(),
                          root_law, deep_law, self._memo)
        node, path, emitted = 0, [], []
        while plan.kids[node]:  # one choice per layer: a child to go on with, or stop here
            move = host.index(plan.decision(node))
            if move == len(plan.kids[node]):
                emitted.append(host.index(plan.correction(node)))
                break
            node = plan.kids[node][move]
            path.append(node)
            emitted.append(tree.token_list[node])
        else:  # a leaf: the target's own draw
            emitted.append(host.bonus(node))
        depth = len(path)
        dec.count_path(depth)
        return emitted, path


__all__ = ["Layer"]
