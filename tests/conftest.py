"""Shared fixtures."""

import pytest


@pytest.fixture
def one_thread():
    """Tiny models and batched verifiers: one torch thread is fastest, and leaves the other core to the
    other xdist worker. Modules that run torch use it with ``pytestmark = pytest.mark.usefixtures(...)``."""
    import torch  # here, not at import: the numpy core's tests run without torch (make check-versions)

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
