"""The census on Ray (reports/census/executor.py's RayCluster) against the local pool, on a local Ray instance.

Slow tier: starting Ray and its workers takes seconds. Skipped where Ray is not installed (it is the optional extra
`attnlab[ray]`, which `attnlab[test]` includes). Each test starts its own local Ray instance and stops it.
"""

from __future__ import annotations

import os
import time

import pytest

from reports.census import run, variants_command, variants_run
from reports.census.enumerate import by_name
from reports.census.executor import DIED, LOCAL_RAY, LocalPool, RayCluster

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnlab[ray]'): the census's Ray "
                                        "executor is not checked here")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
TYPES = ("llama", "gpt2", "opt", "bloom", "mamba")  # clean, clean, clean, unobservable, no attention: ~1 s each
VARIANT_TYPES = ("llama", "gpt2")
SEED = 0
LONG = 120  # seconds a task sleeps that its deadline must cut short


def _census(pool):
    return {r.model_type: (r.category, r.rows) for r in run.census([by_name()[t] for t in TYPES], pool=pool,
                                                                   use_cache=False)}


def _variants(pool):
    jobs = variants_command.jobs([by_name()[t] for t in VARIANT_TYPES], 2, SEED, ("float32",))
    rows = variants_run.run_jobs(jobs, pool=pool, use_cache=False)
    return {(r.job["model_type"], r.job["index"]): (r.category, r.result["rows"], r.minimal) for r in rows}


def test_ray_gives_the_local_pools_results(tmp_path, monkeypatch):
    """The same model types and the same seed's drawn configs: the same category and the same status for every
    property on both executors (the executor never decides a result)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    local = LocalPool(2)
    census_local, variants_local = _census(local), _variants(local)
    ray.init(address="local", num_cpus=2, **LOCAL_RAY)  # started here, as RayCluster starts one
    try:
        with RayCluster(fingerprint=run.cache_key) as pool:  # the connection made here: used, not stopped
            assert pool.describe() == "Ray (2 CPUs, local)"
            census_ray, variants_ray = _census(pool), _variants(pool)
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    assert census_ray == census_local
    assert {c for c, _ in census_local.values()} == {"clean", "unobservable", "no attention"}
    assert all(rows for c, rows in census_local.values() if c != "no attention")  # statuses were compared
    assert variants_ray == variants_local and len(variants_local) == 2 * len(VARIANT_TYPES)


def _lost(item, why):
    return {"lost": why}


def test_a_task_past_its_deadline_or_whose_worker_dies_is_a_row():
    """On the local instance RayCluster starts itself: os._exit kills the task's worker; a sleep past its budget (the
    alarm cannot stop what runs no Python, such as a hang in native code) is cancelled at budget plus grace: each a
    row, and the map ends. The tasks run at this process's niceness, as the local pool's forked workers do, not below
    everything else on the machine (Ray's default, under which a busy machine starves them into timed-out rows)."""
    with RayCluster(grace_s=1.0) as pool:
        start = time.monotonic()
        rows = dict(pool.map(_sleep_or_die, [0, LONG, -1], _lost, lambda item: 1.0))
        took = time.monotonic() - start
    assert not ray.is_initialized()  # the instance it started, it stopped
    assert rows[0] == {"slept": 0, "niceness": os.nice(0)} and rows[-1] == {"lost": DIED}
    # ended long before the sleep would have (took also holds the workers' start: ~20 s on 2 cores that two other
    # processes keep busy)
    assert rows[LONG]["lost"].startswith("timed out: still running 2 s after it started") and took < LONG


def _sleep_or_die(item: int) -> dict:
    if item < 0:
        os._exit(1)
    time.sleep(item)
    return {"slept": item, "niceness": os.nice(0)}
