"""Shared test setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE (ci, dev, thorough)."""

import os

import pytest
import torch

from properties.strategies import load_profile

# The profiles are defined once, in properties.strategies.PROFILES (a notebook loads them the same way).
load_profile()

# Two cores: keep torch from oversubscribing when pytest runs alongside other work.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny run the CLI, report and browser tests share, built once per session through the
    `attnlab` commands (tests/helpers/cli_run.py). Read-only: a test that damages it copies it first."""
    from tests.helpers.cli_run import build_tiny_run

    return build_tiny_run(tmp_path_factory.mktemp("tiny-run"))


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
