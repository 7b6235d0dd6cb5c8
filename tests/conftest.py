"""Shared fixtures, the hypothesis profile (:mod:`hyp`) and the seeding of the global generators."""

from __future__ import annotations

import os
import random

# One thread per process: make test runs two xdist workers on two cores, and the notebook kernels and CLI
# subprocesses the tests start inherit this. With torch's default (one thread a core) they spun against
# each other: the decode notebook took 52 s inside the suite and 5 s alone. Set before numpy and torch load.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = os.environ.get("OTM_TEST_THREADS", "1")

import numpy as np  # noqa: E402
import pytest

import hyp  # noqa: E402  registers and loads the hypothesis profile before any test module builds its settings

GLOBAL_SEED = 20261127
"""Every test starts with Python's, numpy's legacy and torch's global generators at this seed, so a
draw from a global generator gives the same value whatever ran before it on the same xdist worker
(tests seed their own generators anyway; ``OTM_RNG_AUDIT=path`` lists those that still draw from a
global one)."""


@pytest.fixture(autouse=True)
def _seeded_global_generators(request):
    random.seed(GLOBAL_SEED)
    np.random.seed(GLOBAL_SEED % 2**32)
    torch = _torch_if_loaded()
    if torch is not None:
        torch.manual_seed(GLOBAL_SEED)
    audit = os.environ.get("OTM_RNG_AUDIT")
    if not audit:
        yield
        return
    before = _states()
    yield
    after = _states()
    moved = [name for name in before if before[name] != after.get(name)]
    if moved:
        with open(audit, "a") as fh:
            fh.write(f"{request.node.nodeid}\t{','.join(moved)}\n")


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")  # the numpy core's tests run without torch (make check-versions)


def _states() -> dict:
    out = {"random": random.getstate(), "numpy": np.random.get_state()[1].tobytes()}
    torch = _torch_if_loaded()
    if torch is not None:
        out["torch"] = bytes(torch.get_rng_state().numpy())
    return out


@pytest.fixture
def one_thread():
    """Tiny models and batched verifiers: one torch thread is fastest, and leaves the other core to the
    other xdist worker. Modules that run torch use it with ``pytestmark = pytest.mark.usefixtures(...)``."""
    import torch  # here, not at import: the numpy core's tests run without torch (make check-versions)

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow`` first (stable otherwise): xdist then starts the long ones at once instead
    of leaving one running alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header(config):
    return f"hypothesis profile: {hyp.PROFILE} (examples x{hyp.SCALE})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hyp.PROFILE == "explore" and exitstatus not in (0, 5):
        terminalreporter.write_line(
            "explore: to pin a failure, copy its 'Falsifying example' into @example(...) above the test's "
            "@given, fix the cause, and run `make test` (docs/testing.md); the failures are saved in "
            ".hypothesis/ and replayed first by the next `make test-explore`")
