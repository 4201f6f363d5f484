"""Shared test setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE (ci, dev, thorough)."""

import os

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
