r"""Planted, realistic bugs in the decoder (:mod:`otm.decode.decoder`): what its exact mode must catch.

Each mutant is a context manager that replaces one small method of the decoder (or the tree
inputs) by a copy with one realistic mistake; the docstring says which line of the real code it
changes. Inside the ``with`` block :func:`otm.decode.speculative_decode` runs the broken decoder,
so the exact mode (:func:`otm.decode.exact_mode.exact_decode`, the decoder's own code with every random
choice enumerated) gives the broken decoder's exact law, and :func:`exact_tv` its total variation
from the target on a fixed toy setting.

Not every plausible mistake breaks exactness: anything that changes the draft's law *consistently*
for drawing and for verifying (a stale draft cache, keeping the wrong draft row after a step) only
lowers acceptance. :data:`NOT_EXACTNESS_BUGS` lists such a mistake; the exact mode shows its law is
still the target's (a check that the tool does not cry wolf).

>>> round(exact_tv(DECODER_MUTANTS["wrong_row_law"]), 3) > 0.001
True
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable
from unittest import mock

import torch

from ..decode import decoder as dec
from ..decode.sampling import Sampling, next_token_laws


@dataclass(frozen=True)
class DecoderMutant:
    """A planted decoder bug: where, what, and the context manager that plants it."""

    name: str
    where: str  # file:function of the real code
    mistake: str  # one line
    plant: Callable[[], contextlib.AbstractContextManager]
    options: dict  # speculative_decode options of the setting it is measured on
    setting: dict | None = None  # overrides of EXACT_SETTING (toy models and sampling)


def _patch(name: str, new) -> Callable[[], contextlib.AbstractContextManager]:
    return lambda: mock.patch.object(dec._Decoder, name, new)


def _wrong_row_law(self, tree, node, drafts):
    """``node_draft_law``: ``drafts.laws[depth][0]`` (row 0's law) instead of the law of the rows through the node."""
    depth = tree.depth[node]
    return drafts.laws[depth][0][None]


def _raw_draft_law(self, tree, node, drafts):
    """``node_draft_law``: the verifier is given the draft's law at temperature 1 (its raw logits), while the
    drafts were drawn from the processed law (transformers issue 47932's pattern)."""
    depth = tree.depth[node]
    row = tree.rows_through[node][0] if depth else 0
    return next_token_laws(drafts.logits[depth][row][None], Sampling(), dtype=self.law_dtype)


def _gather_off_by_one(self, committed, emitted, path):
    """``rollback_target``: keeps cache positions ``committed + node`` instead of ``committed - 1 + node``
    (the accepted path's keys and values shifted by one: a stale target cache)."""
    if self.target_rollback == "gather":
        self.target.keep_path(committed, [min(committed + node, self.target.length() - 1) for node in path])
        self.pending_target = [emitted[-1]]
    else:
        self.target.truncate(committed)
        self.pending_target = list(emitted)


def _refeed_without_truncate(self, committed, emitted, path):
    """``rollback_target``: ``refeed`` forgets ``self.target.truncate(committed)``, so the rejected tree's keys
    and values stay in the cache in front of the re-fed tokens."""
    self.pending_target = list(emitted)


def _bonus_from_parent(self, tree, node, target_laws):
    """``bonus``: the bonus token at a leaf is drawn from its parent's target law (an off-by-one depth)."""
    parent = int(tree.parent[node]) if node else 0
    return self.chance.bonus(target_laws[parent : parent + 1])


def _positions_off_by_one():
    """``tree_inputs``: the drafted nodes sit one position too far (``root_position + depth + 1``)."""
    real = dec.tree_inputs

    def shifted(tree, pending, past, *, dtype, device):
        ids, positions, mask = real(tree, pending, past, dtype=dtype, device=device)
        positions = positions.clone()
        positions[:, len(pending) :] += 1  # [1, q]: only the drafted nodes
        return ids, positions, mask

    return mock.patch.object(dec, "tree_inputs", shifted)


def _keep_row_zero(self, tree, end):
    """``draft_row_kept``: keeps draft cache row 0 instead of a row through the accepted path (a stale DRAFT
    cache: the draft's next law is computed from the wrong tokens, but drafts are drawn from and verified
    with that same law, so the output stays exact; only acceptance drops)."""
    return 0


SETTING = dict(k=2, length=2, verifier="kseq", scheme="iid")
FULL_SUPPORT = dict(V=2, top_k=0)
"""Where a wrong draft law would give a drafted token zero mass (the verifiers refuse such input in one
line, which catches the bug but measures nothing), the TV is measured with laws of full support."""
"""The setting the mutants are measured on (with :data:`EXACT_SETTING`'s toy models)."""

DECODER_MUTANTS: dict[str, DecoderMutant] = {
    m.name: m
    for m in (
        DecoderMutant("wrong_row_law", "otm/decode/decoder.py:_Decoder.node_draft_law",
                      "the verifier at every node gets row 0's draft law", _patch("node_draft_law", _wrong_row_law),
                      SETTING, FULL_SUPPORT),
        DecoderMutant("raw_draft_law", "otm/decode/decoder.py:_Decoder.node_draft_law",
                      "the verifier gets the draft's temperature-1 law, the drafts come from the processed law",
                      _patch("node_draft_law", _raw_draft_law), SETTING, FULL_SUPPORT),
        DecoderMutant("gather_off_by_one", "otm/decode/decoder.py:_Decoder.rollback_target",
                      "gather rollback keeps the path's keys and values one position off (stale target cache)",
                      _patch("rollback_target", _gather_off_by_one), SETTING),
        DecoderMutant("refeed_without_truncate", "otm/decode/decoder.py:_Decoder.rollback_target",
                      "refeed rollback leaves the rejected tree in the target cache",
                      _patch("rollback_target", _refeed_without_truncate), {**SETTING, "target_rollback": "refeed"}),
        DecoderMutant("bonus_from_parent", "otm/decode/decoder.py:_Decoder.bonus",
                      "the bonus token at a leaf is drawn from its parent's target law",
                      _patch("bonus", _bonus_from_parent), SETTING),
        DecoderMutant("positions_off_by_one", "otm/decode/tree.py:tree_inputs (as used by the decoder)",
                      "drafted nodes are placed one position too far", _positions_off_by_one, SETTING),
    )
}
"""Decoder bugs that break exactness, by name."""

NOT_EXACTNESS_BUGS: dict[str, DecoderMutant] = {
    "keep_draft_row_zero": DecoderMutant(
        "keep_draft_row_zero", "otm/decode/decoder.py:_Decoder.draft_row_kept",
        "keeps draft cache row 0, not a row through the accepted path (stale draft cache: acceptance only)",
        _patch("draft_row_kept", _keep_row_zero), {**SETTING, "length": 3}),
}
"""A mistake that lowers acceptance but keeps the output law exact (the exact mode must not flag it)."""

EXACT_SETTING = dict(V=3, seeds=(11, 12), prompt=(0, 2), T=3, temperature=0.9, top_k=2)
"""Toy models and sampling of the measurements: ToyLM(V=3) target and draft, top-k 2 (zeros in every law)."""


def toy_setting(overrides: dict | None = None):
    """``(target, draft, prompt, sampling, T)`` of :data:`EXACT_SETTING` (with ``overrides``)."""
    from ..decode.toy import ToyLM

    s = {**EXACT_SETTING, **(overrides or {})}
    target, draft = ToyLM(s["V"], seed=s["seeds"][0]), ToyLM(s["V"], seed=s["seeds"][1])
    prompt = [t % s["V"] for t in s["prompt"]]
    return target, draft, prompt, Sampling(temperature=s["temperature"], top_k=s["top_k"]), s["T"]


def exact_tv(mutant: DecoderMutant) -> float:
    """Exact total variation between the broken decoder's law of T tokens and the target's, on the toy setting."""
    from ..decode.exact_mode import exact_decode_law, target_law, total_variation
    from ..decode.toy import model_law

    target, draft, prompt, sampling, T = toy_setting(mutant.setting)
    reference = target_law(model_law(target, prompt, sampling), T)
    with torch.inference_mode(), mutant.plant():
        law = exact_decode_law(target, draft, prompt, max_new_tokens=T, sampling=sampling, **mutant.options)
    return total_variation(law, reference)
