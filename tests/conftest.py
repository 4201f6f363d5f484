"""Shared test setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE (ci, dev, thorough)."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, max_examples=25, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Two cores: keep torch from oversubscribing when pytest runs alongside other work.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`).

    For tiny models one thread is fastest, it cannot oversubscribe shared cores, and it fixes the
    float summation order of matmuls, so runs a test compares bit for bit use the same order.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
