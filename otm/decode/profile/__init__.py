r"""``otm profile``: how much would k drafts, and which verifier, buy on *your* target and draft?

The library behind ``otm profile`` (and behind ``analysis/paper_table.py`` where the two overlap).
Functions take loaded models and return results; nothing here prints. Its modules, every name
importable from this package: :mod:`~otm.decode.profile.measure` (prompts, laws, acceptances, the run:
steps 1, 2 and 4's decode), :mod:`~otm.decode.profile.statistics` (intervals and the block-efficiency
formula: steps 3-4), :mod:`~otm.decode.profile.results` (the result types and their JSON) and
:mod:`~otm.decode.profile.report` (text and figures).

What is measured, and how
-------------------------

1. **Laws at real positions** (:func:`continuation_laws`). For each prompt (chat template applied
   when the tokenizer has one: :func:`prompt_ids`) the target samples a continuation at temperature
   T; at the first N positions of that continuation both models' next-token laws are taken,
   ``softmax(logits / T)`` in float64 (the draft's at depth 1: a feature draft reads the target's
   features of the same prefix, :func:`otm.decode.feature_draft.draft_logits`).
2. **Per position, per k** (:func:`position_acceptances`): alpha* of each draft scheme in closed
   form (:func:`otm.optimum.optimal_acceptance`: iid, without_replacement, greedy when k < V) and
   each verifier's acceptance: ``kseq``, ``rrs``, ``greedy`` and (k = 1) ``speculative`` by their
   exact closed forms, ``kseq_without_replacement`` by its race quadrature (exact; 25-85 ms a position
   at V = 49152), ``rrs_without_replacement`` by its exact rejection-path sum where that fits,
   else its unbiased Monte Carlo estimate with a standard error
   (:func:`otm.verifiers.rrs_without_replacement.acceptance`). At k = 1 the schemes coincide and
   alpha* = speculative sampling's acceptance = sum min(target, draft).
3. **Means and intervals** (:func:`interval`): mean over all positions; 95% interval by a
   percentile bootstrap over prompts (prompts resampled with their positions, since positions of
   one continuation are not independent) when there are at least :data:`MIN_BOOTSTRAP_PROMPTS`
   prompts, else the normal interval mean +- 1.96 sd / sqrt(n) over positions (which treats them
   as independent). A verifier's ratio is (mean acceptance) / (mean alpha* of its scheme), with the
   same kind of interval. The method is in every result.
4. **Block efficiency** (new tokens per target call) at depth L. *Predicted*
   (:func:`predicted_block_efficiency`): the expected tokens of one step of a level-by-level tree,
   ``1 + sum_{d=1..L} prod_{j<=d} a_j``, with a_j the acceptance at depth j; the optimistic model
   puts the depth-1 mean acceptance a of step 2 at every depth: ``1 + a + a^2 + ... + a^L``.
   *Measured*: a short real decode (:func:`otm.decode.decoder.speculative_decode`, each k, depth L,
   one verifier, a few prompts, a few tokens) gives the block efficiency and the acceptance by
   depth; the same formula fed with the *measured* per-depth acceptances is printed beside it.
   Prediction and measurement differ where the draft's quality drops with depth: deeper in the
   tree the draft conditions on its own drafted tokens (and a feature draft on its own guessed
   features), fewer rows pass through an accepted node than k (iid), and with
   ``rrs_without_replacement`` each row below the root is a single chain verified by speculative
   sampling (docs/decode.md). The measured figure also counts the first call (a feature draft
   drafts nothing on it), the depth cut near the token budget and EOS; the formula with measured
   depths does not.
"""

from .measure import (DEFAULT_NUM_PROMPTS, DEFAULT_PATHS, PROMPTS, check_ks, check_settings, continuation_laws,
                      position_acceptances, profile, prompt_ids, read_prompts)
from .report import caption, format_profile, plot_profile
from .results import DECODABLE, METHODS, MODEL, SCHEME_OF, Check, KRow, Profile, VerifierRow
from .statistics import (BOOTSTRAP_RESAMPLES, MIN_BOOTSTRAP_PROMPTS, Stat, interval, interval_method,
                         predicted_block_efficiency)

__all__ = ["PROMPTS", "Profile", "KRow", "VerifierRow", "Check", "Stat", "profile", "position_acceptances",
           "continuation_laws", "prompt_ids", "read_prompts", "interval", "predicted_block_efficiency",
           "format_profile", "plot_profile"]
