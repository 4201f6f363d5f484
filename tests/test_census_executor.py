"""The census's executors (reports/census/executor.py): the local pool behind the interface, and every bad choice of
executor refused in one line before any model is built.

Fast tier, no Ray cluster: the local pool gives each item one row (a dead worker's included), the census and the
variants run take any executor, and --executor, a missing Ray, --address without Ray, --workers with Ray and an
address where nothing answers are each one line and exit 2. Ray itself (a local cluster, both executors giving the
same results) is tests/test_census_ray.py, in the slow tier.
"""

from __future__ import annotations

import os
import socket
import sys
import types
from dataclasses import asdict

import pytest
from click.testing import CliRunner

from harness.errors import AttnlabError
from reports.census import executor, run, variants_run
from reports.census.enumerate import by_name
from reports.census.executor import DIED, Executor, LocalPool, open_executor
from reports.cli import cli


def _work(item: str) -> dict:
    """A job in a worker process: "die" kills its worker, as a segfault or the OOM killer would."""
    if item == "die":
        os._exit(1)
    return {"item": item, "pid": os.getpid()}


def _lost(item: str, why: str) -> dict:
    return {"item": item, "lost": why}


def _budget(item: str) -> float:
    return 60.0


@pytest.mark.parametrize("workers", [1, 2])
def test_the_local_pool_gives_each_item_one_row(workers):
    rows = dict(LocalPool(workers).map(_work, ["a", "b", "c"], _lost, _budget))
    assert {k: v["item"] for k, v in rows.items()} == {"a": "a", "b": "b", "c": "c"}
    assert all(v["pid"] != os.getpid() for v in rows.values())  # run in worker processes, not here


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_dies_is_its_items_row_and_the_rest_go_on(workers):
    rows = list(LocalPool(workers).map(_work, ["a", "die", "b", "c"], _lost, _budget))
    assert sorted(item for item, _ in rows) == ["a", "b", "c", "die"]  # each item exactly once
    got = dict(rows)
    assert got["die"] == {"item": "die", "lost": DIED}
    assert all("pid" in got[k] for k in ("a", "b", "c"))


class _Refuses(Executor):
    """An executor whose every worker dies: the census and the variants run record each as a row."""

    kind = "test"

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return "nowhere"

    def map(self, work, todo, lost, budget_s):
        for item in todo:
            assert budget_s(item) > 0
            yield item, lost(item, "refused by the test executor")


def test_the_census_and_the_variants_run_take_any_executor(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    results = run.census([by_name()["llama"], by_name()["gpt2"]], pool=_Refuses(), use_cache=False)
    assert [(r.model_type, r.category, r.stage, r.reason) for r in results] == [
        ("llama", "unsupported", "worker", "refused by the test executor"),
        ("gpt2", "unsupported", "worker", "refused by the test executor")]
    job = variants_run.Job("llama", "causal_lm", "LlamaForCausalLM", 1, "float32", {"rope_theta": 500.0})
    rows = variants_run.run_jobs([job], pool=_Refuses(), use_cache=False)
    assert rows[0].job == asdict(job) and rows[0].category == "unsupported"
    assert rows[0].result["stage"] == "worker"


@pytest.mark.parametrize("needs", [set(), {"a"}, {"a", "c"}, {"a", "b", "c", "d"}, {"d"}])
def test_a_variants_jobs_budget_covers_every_attempt_of_its_shrink(monkeypatch, needs):
    """Ray's deadline for a drawn config is the per-attempt timeout times the most attempts the greedy reset can
    make, so it never stops a shrink the local pool would finish."""
    def fake(job, changes, timeout_s):
        r = variants_run.Result(job.model_type, job.task, job.class_name, stage="done")
        r.category, r.failures = ("untriaged", {"kv_cache": "x"}) if needs <= set(changes) else ("clean", {})
        return r

    monkeypatch.setattr(variants_run, "attempt", fake)
    job = variants_run.Job("llama", "causal_lm", "LlamaForCausalLM", 1, "float32", {"a": 1, "b": 2, "c": 3, "d": 4})
    row = variants_run.Row.from_json(variants_run.run_job(job))
    assert 1 + row.attempts <= variants_run.most_attempts(job) == 11


def test_an_unknown_executor_or_address_without_ray_is_refused():
    with pytest.raises(AttnlabError, match="--executor 'spark' is invalid: expected one of local, ray"):
        open_executor("spark")
    with pytest.raises(AttnlabError, match="--address 10.0.0.1:6379 names a Ray cluster: add --executor ray"):
        open_executor("local", address="10.0.0.1:6379")
    with open_executor("local", workers=3) as pool:
        assert pool.describe() == "3 worker(s)"  # the summary line's words, as before executors


def test_a_missing_ray_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    with pytest.raises(AttnlabError, match=r"--executor ray needs Ray: pip install 'attnlab\[ray\]'"):
        open_executor("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_ray(monkeypatch):
    """A ``ray`` module that fails any use: the checks below must refuse before Ray is asked anything."""
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))


def test_an_address_where_nothing_answers_is_refused_at_once(fake_ray):
    address = f"127.0.0.1:{_free_port()}"
    with pytest.raises(AttnlabError, match=f"--address {address}: no Ray cluster answers there.*ray start --head.*"
                                           "omit --address"):
        executor.check_answers(address, timeout_s=2)
    for bad in ("nonsense", "host:", ":6379", "host:port"):
        with pytest.raises(AttnlabError, match=r"expected HOST:PORT \(as `ray start --head` prints it\) or auto"):
            executor.check_answers(bad)
    with pytest.raises(AttnlabError, match="Ray Client addresses are not supported"):
        executor.check_answers("ray://127.0.0.1:10001")
    with pytest.raises(AttnlabError, match="--workers 2 sizes the local pool"):
        open_executor("ray", workers=2)


@pytest.mark.parametrize(("args", "message"), [
    (["--executor", "spark"], "Invalid value for '--executor': 'spark' is not one of 'local', 'ray'"),
    (["--address", "127.0.0.1:6379"], "--address 127.0.0.1:6379 names a Ray cluster: add --executor ray"),
    (["--variants", "2", "--address", "127.0.0.1:6379"], "names a Ray cluster"),
    (["--executor", "ray", "--workers", "2"], "--workers 2 sizes the local pool"),
    (["--executor", "ray", "--address", "FREE"], "no Ray cluster answers there"),
    (["--variants", "2", "--executor", "ray", "--address", "FREE"], "no Ray cluster answers there"),
])
def test_bad_executor_input_is_one_line_and_exit_2(fake_ray, args, message):
    args = [f"127.0.0.1:{_free_port()}" if a == "FREE" else a for a in args]
    result = CliRunner().invoke(cli, ["census", "--only", "llama", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output


def test_a_missing_ray_is_one_line_and_exit_2_from_the_cli(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    for extra in ([], ["--variants", "2"]):
        result = CliRunner().invoke(cli, ["census", "--only", "llama", "--executor", "ray", *extra])
        assert result.exit_code == 2, result.output
        assert result.output.strip() == "attnlab: error: --executor ray needs Ray: pip install 'attnlab[ray]'"
