"""What a tree rule sees of the running decoder during one walk: :class:`StepContext`.

A whole-tree rule (:class:`otm.decode.tree_rules.TreeRule`) is given this narrow view instead of the
decoder itself: the step's door of random choices (``chance``: every random decision of a rule is drawn
through it, which is what lets the exact mode enumerate the real code), the run's scheme and k, the draft
law the children of a node were drawn from, the target's own draw at a node, the reads of device values
(each counted as a device sync), the counters of verified and accepted tokens by depth, the committed
tokens, and the slot for the step's host copy of its laws. Nothing else of the decoder is reachable from a
rule (``__slots__``, no fallback), so a rule cannot read a cache, a model or a stray generator.
"""

from __future__ import annotations

import torch


class StepContext:
    """The decoder as one walk of a tree rule may use it (module doc)."""

    __slots__ = ("_dec",)

    def __init__(self, dec):
        self._dec = dec

    @property
    def chance(self):
        """The door of every random choice (:mod:`otm.decode.chance`)."""
        return self._dec.chance

    @property
    def scheme(self) -> str:
        """``"iid"`` or ``"without_replacement"``: how the k rows were drawn."""
        return self._dec.scheme

    @property
    def k(self) -> int:
        """Rows drafted per step."""
        return self._dec.k

    @property
    def device_walk(self) -> bool:
        """Whether the walk keeps its decisions on the device and reads the step's outcome back once."""
        return self._dec.device_walk

    @property
    def committed(self) -> tuple[int, ...]:
        """Every committed token of the run (prompt and output so far; the last is the tree's root)."""
        return tuple(self._dec.committed)

    @property
    def reads(self):
        """The run's host-read counter (:class:`otm.decode.host_reads.HostReads`), or None when not counting."""
        return self._dec.reads

    @property
    def host_laws(self):
        """The step's host copy of its laws (:class:`otm.decode.tree_rules.HostLaws`) once a rule made one."""
        return self._dec.host_laws

    @host_laws.setter
    def host_laws(self, value) -> None:
        self._dec.host_laws = value

    def node_draft_law(self, tree, node: int, drafts) -> torch.Tensor:
        """``[1, V]``: the draft law the node's children were drawn from."""
        return self._dec.node_draft_law(tree, node, drafts)

    def bonus(self, tree, node: int, target_laws: torch.Tensor) -> int:
        """The target's own draw at ``node`` (a leaf, or a root without drafts)."""
        return self._dec.bonus(tree, node, target_laws)

    def read(self, values: torch.Tensor, phase: str = "accept") -> list[int]:
        """Whole numbers read back to the host in one read (a device sync), with the laws' deferred checks."""
        return self._dec.read(values, phase)

    def read_array(self, values: torch.Tensor, phase: str = "laws"):
        """Values read back as a float64 numpy array in one read (a device sync), with the laws' deferred checks."""
        return self._dec.read_array(values, phase)

    @property
    def depths(self) -> int:
        """Depths counted (the run's draft depth L)."""
        return len(self._dec.stats.verified_by_depth)

    def count(self, depth: int, accepted: bool) -> None:
        """One verification at ``depth`` (0 = the root), and whether its token was a draft."""
        stats = self._dec.stats
        stats.verified_by_depth[depth] += 1
        if accepted:
            stats.accepted_by_depth[depth] += 1

    def count_path(self, accepted: int, limit: int | None = None) -> None:
        """A walk that accepted ``accepted`` drafted tokens along one path: depths 0..accepted verified (up to
        ``limit``, by default every depth counted), depths 0..accepted - 1 accepted, as a walk level by level
        counts them."""
        stats = self._dec.stats
        for d in range(min(accepted + 1, self.depths if limit is None else limit)):
            stats.verified_by_depth[d] += 1
        for d in range(accepted):
            stats.accepted_by_depth[d] += 1


__all__ = ["StepContext"]
