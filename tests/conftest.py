"""Shared test setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE (ci, dev, thorough)."""

import os

import pytest
import torch

from properties.strategies import load_profile

# The profiles are defined once, in properties.strategies.PROFILES (a notebook loads them the same way).
load_profile()

# Torch threads per test process: the cores shared out over the pytest-xdist workers, at most 2. Two workers that
# each ran 2 threads on 2 cores would oversubscribe them, and an OpenMP team waiting on a descheduled thread spins: a
# small Llama's forwards in two such processes took 2.7x as long as with one thread each. Subprocesses a test starts
# (CLI runs, the findings scripts) read the same count from OMP_NUM_THREADS.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // WORKERS))
torch.set_num_threads(THREADS)
if WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)


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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` (minutes each on 2 cores) run first. pytest-xdist's default schedule hands each worker a
    run of consecutive tests; with ``--maxschedchunk=1`` (the slow tier's) it hands them out one at a time as the
    workers free up, so the long ones start first on whichever worker is free and the short ones fill in after,
    and no worker is left alone at the end with a minutes-long test while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: collection order otherwise
