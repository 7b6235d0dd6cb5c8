"""Sibling projections computed as one GEMM: what the oneDNN swap (:class:`otm.decode.onednn.FusedLinear`) and the
4-bit swap (:class:`otm.decode.int4.Int4Linear`) share.

A module that computes several projections of one input (attention's q/k/v, a gated MLP's gate/up) calls them
one after the other with the very same tensor; the first call computes every sibling's columns in one GEMM and
keeps them in the group's :class:`LastCall`, and the others return their columns when called with that tensor
(``is``).
"""

from __future__ import annotations

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Projections a module computes from one input (attention's queries, keys and values; a gated MLP's gate and
up), in the order its forward calls them."""


class LastCall:
    """The input a fused group of sibling projections last computed and its output (every sibling's columns)."""

    __slots__ = ("x", "out")

    def __init__(self):
        self.x = self.out = None


__all__ = ["LastCall", "SIBLINGS"]
