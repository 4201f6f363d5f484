"""A stopped `attnlab probe` keeps what it finished, and --resume gives what an uninterrupted run gives.

As tests/test_interrupts.py does for training: the probe runs in a forked child (the CLI's entry
point, one torch thread so every sum runs in one order), is stopped by SIGTERM or SIGKILL once the
manifest says exact leave-one-out has finished, and then: every method the manifest lists has its
whole file, no later method's file is there, the
report renders and marks what is missing, and --resume finishes the run with files equal to an
uninterrupted run's (all but the wall-clock ``seconds`` column).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.run_dir import RunDir
from reports import rundata
from reports.cli import cli
from reports.probe_run.plan import METHODS
from reports.probe_run.steps import output
from tests.helpers.cli_run import copy_run

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
ARGS = ["--sequences", "8", "--seeds", "0,1", "--no-progress"]


def _child(run_dir: str) -> None:
    torch.set_num_threads(1)
    try:
        cli.main(["probe", run_dir, *ARGS], prog_name="attnlab", standalone_mode=True)
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    os._exit(0)


def _finished(run: Path) -> dict:
    try:
        return json.loads((run / "probes" / "manifest.json").read_text())["finished"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return {}


def _tables(run: Path) -> dict[str, pd.DataFrame]:
    out = {}
    for path in sorted((run / "probes").glob("*.csv")):
        frame = pd.read_csv(path)
        out[path.name] = frame.drop(columns=[c for c in ("seconds",) if c in frame])
    out["redundancy.json"] = pd.DataFrame([json.loads((run / "probes" / "redundancy.json").read_text())])
    return out


@pytest.fixture(scope="module")
def straight(tiny_run, tmp_path_factory):
    run = copy_run(tiny_run, tmp_path_factory.mktemp("straight") / "run")
    result = CliRunner().invoke(cli, ["probe", str(run), *ARGS], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return run


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_probe_keeps_what_finished_and_resume_completes_it(tiny_run, straight, tmp_path, sig):
    run = copy_run(tiny_run, tmp_path / "run")
    shutil.rmtree(run / "probes")  # the shared run's own probe results: this run makes its own
    child = mp.get_context("fork").Process(target=_child, args=(str(run),))
    child.start()
    deadline = time.monotonic() + 300
    while "importance_ablation" not in _finished(run) and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert child.is_alive(), "the probe finished before it could be stopped"
    os.kill(child.pid, sig)
    child.join(timeout=60)
    assert child.exitcode == -sig, child.exitcode

    finished = _finished(run)
    layout = RunDir(run)
    missing = [m for m in METHODS if m not in finished]
    assert "importance_ablation" in finished and missing, sorted(finished)
    assert list(finished) == list(METHODS[:len(finished)])  # in run order: the ones before the stop
    for method in finished:  # whole files, readable as the report reads them
        assert output(layout, method).exists(), method
    assert not [m for m in missing[1:] if output(layout, m).exists()]  # later methods never started
    assert not [p for p in (run / "probes").iterdir() if ".tmp" in p.name]  # atomic writes: no temp files left
    data = rundata.load(run)
    assert rundata.probe_status(data)["missing"] == missing
    report = CliRunner().invoke(cli, ["report", str(run)], catch_exceptions=False)
    assert report.exit_code == 0, report.output
    assert f"not finished: {', '.join(missing)}" in (run / "report.md").read_text()

    resumed = CliRunner().invoke(cli, ["probe", str(run), *ARGS, "--resume"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    got, want = _tables(run), _tables(straight)
    assert got.keys() == want.keys()
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=True, obj=name)
