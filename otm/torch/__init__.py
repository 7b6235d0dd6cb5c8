"""Batched torch verifiers and draft samplers for real vocabularies (CPU or CUDA).

The torch path mirrors the numpy verifiers of :mod:`otm.verifiers` one to one:
same order of tests, same residuals, same meaning of ``accepted``; the tests
hold each function against its numpy twin, in law and uniform by uniform.

=========================== ======================================== ================================
verifier                    drafts from                              numpy twin
=========================== ======================================== ================================
``speculative``             any draft law, k = 1                     ``otm.verifiers.speculative``
``kseq``                    ``sample_iid``                           ``otm.verifiers.kseq``
``rrs``                     ``sample_iid``                           ``otm.verifiers.rrs``
``rrs_without_replacement`` ``sample_without_replacement``           ``otm.verifiers.rrs_without_replacement``
``greedy``                  ``sample_greedy``                        ``otm.verifiers.greedy``
``spechub``                 ``sample_spechub`` (k = 2)               ``otm.verifiers.spechub``
``optimal``                 ``sample_iid`` (CPU: set-up numpy per    ``otm.verifiers.optimal``
                            row; other devices: a fixed-shape set-up
                            on the device)
``kseq_without_replacement`` ``sample_without_replacement`` (set-up  ``otm.verifiers.kseq_without_replacement``
                            numpy per row on the CPU, torch
                            elsewhere)
``optimal_embedded``        ``sample_without_replacement`` (numpy    ``otm.verifiers.optimal_embedded``
                            per row on the CPU; elsewhere a torch
                            walk, then ``optimal``)
=========================== ======================================== ================================

Signature of every verifier::

    verifier(target [batch, V], draft [batch, V], drafts [batch, k] int64, *,
             uniforms=None [batch, k + 1] (optimal: [batch, k + 2]; kseq_without_replacement: [batch, 2k];
             optimal_embedded: [batch, 2k + 1]),
             generator=None, compute_dtype=None,
             validate=True) -> Verified(token [batch] int64, accepted [batch] int64)

>>> import torch
>>> import otm.torch as ot
>>> gen = torch.Generator().manual_seed(0)
>>> target = torch.tensor([[0.5, 0.3, 0.2]]).expand(4, 3)
>>> draft = torch.tensor([[0.2, 0.2, 0.6]]).expand(4, 3)
>>> drafts = ot.sample_iid(draft, 2, generator=gen)
>>> token, accepted = ot.kseq(target, draft, drafts, generator=gen)
>>> token.shape, accepted.dtype
(torch.Size([4]), torch.int64)
>>> bool(((accepted == ot.NOT_ACCEPTED) | (drafts.gather(1, accepted.clamp(min=0)[:, None])[:, 0] == token)).all())
True
"""

from ._core import NOT_ACCEPTED, Verified
from .schemes import (
    SAMPLERS,
    sample_drafts,
    sample_greedy,
    sample_iid,
    sample_spechub,
    sample_top,
    sample_without_replacement,
    top_tokens,
)
from .verifiers import (VERIFIERS, greedy, kseq, kseq_without_replacement, optimal, optimal_embedded, rho_star, rrs, rrs_without_replacement,
                        spechub, speculative)

__all__ = [
    "NOT_ACCEPTED",
    "Verified",
    "VERIFIERS",
    "speculative",
    "kseq",
    "rho_star",
    "rrs",
    "rrs_without_replacement",
    "greedy",
    "spechub",
    "optimal",
    "kseq_without_replacement",
    "optimal_embedded",
    "SAMPLERS",
    "sample_drafts",
    "sample_iid",
    "sample_without_replacement",
    "sample_greedy",
    "sample_spechub",
    "sample_top",
    "top_tokens",
]
