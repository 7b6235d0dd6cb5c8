"""The analysis library: optimality-gap sweeps (:mod:`.gap`, figures in :mod:`.gap_figures`),
adversarial worst cases (:mod:`.worst_case`) and the writers of tables, figures and resume
caches (:mod:`.io`). The scripts in ``analysis/`` and ``otm gap`` (:mod:`.cli`) call it.
"""
