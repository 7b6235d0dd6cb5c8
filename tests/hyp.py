"""Hypothesis profiles and example budgets for the suite.

``make test`` (and so CI) runs the ``ci`` profile: derandomised (each property's examples come from a
seed fixed by the test's own code, so two runs of one commit test the same cases), no example
database, no deadline and no timing health check. Its budgets are the ones each test asks for with
``examples(n)``.

``make test-explore`` runs the ``explore`` profile: fresh randomness on every run, ``SCALE`` times each
budget (``OTM_EXPLORE_SCALE``, default 10), failures kept in ``.hypothesis/`` and replayed first on the
next run, and each failure printed with the blob that reproduces it. To pin what it finds, copy the
``Falsifying example`` into an ``@example(...)`` on the test (docs/testing.md).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("OTM_HYPOTHESIS", "ci")
if PROFILE not in ("ci", "explore"):
    raise SystemExit(f"OTM_HYPOTHESIS={PROFILE!r}: choose ci or explore")
SCALE = int(os.environ.get("OTM_EXPLORE_SCALE", "10")) if PROFILE == "explore" else 1

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore", derandomize=False, deadline=None, print_blob=True, max_examples=100 * SCALE,
    suppress_health_check=[HealthCheck.too_slow],
)


def examples(n: int) -> int:
    """The example budget of a property: ``n`` under ``ci``, ``SCALE * n`` under ``explore``."""
    return n * SCALE


settings.load_profile(PROFILE)
