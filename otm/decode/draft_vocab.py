r"""A draft that proposes only among the S most frequent tokens (FR-Spec, Zhao et al., arXiv 2502.14856).

Most of a small draft's time goes into its head, an ``H x V`` matrix product over the whole
vocabulary (576 x 49152 for the embedded pair: 3.8 ms of a 5.5 ms draft call in bfloat16 on one
thread). FR-Spec keeps only the head rows of a frequency-ranked subset :math:`\mathcal S` of the
vocabulary, the S tokens the target emits most often, so the draft's logits are computed for them
alone and every other token gets logit :math:`-\infty`:

.. math::

    q_{\mathcal S}(x) = \frac{\exp(z_x)}{\sum_{y \in \mathcal S} \exp(z_y)} \ (x \in \mathcal S), \qquad
    q_{\mathcal S}(x) = 0 \ (x \notin \mathcal S).

Exactness does not change: the draft is simply another draft, whose law is zero outside the
subset; the drafts are drawn from :math:`q_{\mathcal S}` and the verifier is given
:math:`q_{\mathcal S}` (after the same temperature / top-k / top-p processing, which keeps the
zeros: ``softmax`` of :math:`-\infty` is exactly 0). The target's law is untouched, so the output
law is still the target's; what a small S costs is acceptance, by the target mass outside the
subset at most.

Where the ranking comes from: :data:`RANKING_FILE`, every token id of the embedded target's
vocabulary ordered by the target's own mean next-token probability over its continuations of the
lab's training prompts (``analysis/draft_vocab.py`` made it; no download, nothing from a hub). The
choice of S for the embedded pair (:data:`DEFAULT_DRAFT_VOCAB`) is measured in ``docs/decode.md``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..laws import OtmError

RANKING_FILE = Path(__file__).resolve().parents[1] / "token_ranking" / "smollm2-135m-instruct.npy"
"""int32 ``[V]``: the embedded target's token ids, most frequent first (``analysis/draft_vocab.py``)."""

DEFAULT_DRAFT_VOCAB = 4096
"""S of the embedded pair's draft (chosen by measurement: ``docs/decode.md``, "The draft's vocabulary")."""


def token_ranking(vocab_size: int, path=None) -> torch.Tensor:
    """The ranked token ids ``[V]`` (int64) of ``path`` (default :data:`RANKING_FILE`), checked against V.

    Raises a one-line :class:`~otm.laws.OtmError` when the file is missing, is not a permutation of
    ``0..V-1``, or ranks another vocabulary size than the target's.
    """
    import numpy as np

    path = Path(RANKING_FILE if path is None else path)
    try:
        ids = np.load(path)
    except (OSError, ValueError) as exc:
        raise OtmError(f"token ranking {str(path)!r} does not load: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise OtmError(f"token ranking {str(path)!r} must be a 1-D array of token ids, got {ids.dtype} {ids.shape}")
    if ids.size != vocab_size:
        raise OtmError(f"token ranking {str(path)!r} ranks {ids.size} tokens but the target has a vocabulary of "
                       f"{vocab_size}: use the full vocabulary (--draft-vocab full) or a ranking of this tokenizer")
    if not np.array_equal(np.sort(ids), np.arange(vocab_size)):
        raise OtmError(f"token ranking {str(path)!r} is not a permutation of the token ids 0..{vocab_size - 1}")
    return torch.from_numpy(ids.astype(np.int64))


def check_draft_vocab(size, vocab_size: int) -> int:
    """S as a whole number in 1..V, else a one-line :class:`~otm.laws.OtmError`."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= vocab_size:
        raise OtmError(f"the draft vocabulary must be a whole number of tokens in 1..{vocab_size} (the target's "
                       f"vocabulary), got {size!r}")
    return size


class SubsetHead(torch.nn.Module):
    """A linear head restricted to the token ids ``ids``: logits ``[..., V]``, ``-inf`` outside the subset.

    Parameters
    ----------
    weight : ``[V, H]`` the full head's weight (its rows ``ids`` are copied, in ``weight``'s dtype).
    ids : ``[S]`` int64, distinct token ids.

    >>> head = SubsetHead(torch.eye(4), torch.tensor([2, 0]))
    >>> head(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist()
    [[1.0, -inf, 3.0, -inf]]
    """

    onednn_weight = "rows"  # F.linear's weight in forward(): otm.decode.onednn.use_onednn gives it a oneDNN copy

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor):
        super().__init__()
        ids = ids.to(device=weight.device, dtype=torch.int64)
        self.vocab_size = int(weight.shape[0])
        self.register_buffer("ids", ids, persistent=False)  # [S]
        self.register_buffer("rows", weight.detach().index_select(0, ids).contiguous(), persistent=False)  # [S, H]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        fast = self.__dict__.get("onednn_linear")  # the rows on oneDNN (otm.decode.onednn.use_onednn)
        sub = fast(hidden) if fast is not None else torch.nn.functional.linear(hidden, self.rows)  # [..., S]
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), -torch.inf)  # [..., V]
        return out.index_copy_(-1, self.ids, sub)


def restrict_draft(draft, size: int, ranking=None):
    """Make ``draft`` propose only among the ``size`` most frequent tokens of ``ranking`` (in place; returned).

    ``draft``: a :class:`~otm.decode.feature_draft.FeatureDraft` (its head, the target's, is
    replaced for the draft only) or a plain causal LM with ``get_output_embeddings`` /
    ``set_output_embeddings`` (a linear head without bias). ``ranking``: ``[V]`` ranked ids, or a
    path (default :data:`RANKING_FILE`). ``size == V`` leaves the draft as it is.
    """
    from .feature_draft import FeatureDraft

    if isinstance(draft, FeatureDraft):
        weight = draft.head
    else:
        head = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
        if head is None or getattr(head, "bias", None) is not None or not hasattr(head, "weight"):
            raise OtmError(f"a draft vocabulary needs a draft whose head is a plain linear map; "
                           f"{type(draft).__name__} has none: use the full vocabulary")
        weight = head.weight
    V = int(weight.shape[0])
    size = check_draft_vocab(size, V)
    if size == V:
        return draft
    ids = ranking if isinstance(ranking, torch.Tensor) else token_ranking(V, ranking)
    if ids.numel() != V:
        raise OtmError(f"the token ranking has {ids.numel()} ids, the draft's head {V} rows")
    head = SubsetHead(weight, ids[:size].sort().values)  # ascending ids: index_copy_ writes forward in memory
    if isinstance(draft, FeatureDraft):
        draft.subset_head = head
    else:
        draft.set_output_embeddings(head)
    draft.draft_vocab = size
    return draft


def draft_vocab_of(draft) -> int | None:
    """S of a restricted draft (:func:`restrict_draft`), None for a draft over the whole vocabulary."""
    return getattr(draft, "draft_vocab", None)
