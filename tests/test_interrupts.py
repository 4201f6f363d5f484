"""Interrupted training: Ctrl-C through the real `attnlab` console script, and SIGKILL at random moments.

SIGINT: the run saves a checkpoint at the end of the current step and exits with 130 and one line;
`--resume` continues it, and the resumed run's metrics and weights equal an uninterrupted run's
bit for bit. SIGKILL: a run that checkpoints every step is killed at a random moment (mostly inside
a checkpoint write, which is most of a step's time); the last checkpoint must always load and the
resumed run must again equal the uninterrupted one exactly. 3 kill trials in the ``ci`` profile,
12 in ``thorough``.

Exactness needs the same torch thread count in every process (a matmul splits its sums by
thread), so every process here runs one thread. The SIGKILL trials fork the test process and run
the CLI's entry point there, which skips the console script's import (seconds on a shared machine);
the SIGINT test runs the installed console script itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness import load_run
from harness.training.checkpoint import CHECKPOINT, FILES, OLD, TMP, checkpoint_dir, has_run, read_state
from reports.cli import cli
from tests.helpers.fuzz import TALLY, install_summary

EXACT = ["step", "lr", "train_loss", "val_loss", "val_accuracy", "grad_norm"]  # the rest are wall-clock
ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--d-vocab", "16", "--n-ctx", "16", "--attn-only",
         "--task", "induction", "--seq-len", "8", "--batch-size", "8", "--warmup", "0", "--eval-every", "4",
         "--eval-batches", "1", "--log-every", "1", "--device", "cpu", "--no-progress"]
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
KILL_TRIALS = 12 if PROFILE == "thorough" else 3
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(autouse=True, scope="module")
def _summary(request):
    install_summary(request.config)


pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def assert_same_run(a: Path, b: Path) -> None:
    """Metrics (every column a step computes) and final weights identical, bit for bit."""
    ma, mb = pd.read_csv(a / "metrics.csv"), pd.read_csv(b / "metrics.csv")
    pd.testing.assert_frame_equal(ma[EXACT], mb[EXACT], check_exact=True)
    wa, wb = load_run(a).state_dict(), load_run(b).state_dict()
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "weights differ"


def console_script() -> list[str]:
    script = Path(sys.executable).parent / "attnlab"
    if script.exists():
        return [str(script)]
    found = shutil.which("attnlab")
    return [found] if found else [sys.executable, "-c", "from reports.cli import main; main()"]


def data_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


# --- SIGINT through the console script -----------------------------------------------------------------
@pytest.mark.slow
def test_sigint_saves_exits_130_and_resume_matches_an_uninterrupted_run(tmp_path):
    """The run is started with far more steps than it will get (constant lr, so the step count does not
    change any step's numbers), interrupted a few rows in, then resumed up to a few steps past the
    interruption with `--steps` (a resumable change), and compared with a straight run of that length."""
    run = tmp_path / "interrupted"
    args = ["train", "--out", str(run), *MODEL, "--schedule", "constant", "--checkpoint-every", "none"]
    proc = subprocess.Popen([*console_script(), *args, "--steps", "100000"], cwd=ROOT, env=os.environ | ONE_THREAD,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180  # the console script imports torch and transformer_lens first
        while data_rows(run / "metrics.csv") < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, out, err)
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in err, err
    match = re.fullmatch(r"attnlab: interrupted: training interrupted after step (\d+); checkpoint saved in (.+) "
                         r"\(resume=True continues\)", line)
    assert match, line
    step = int(match.group(1))
    assert Path(match.group(2)) == run / CHECKPOINT
    assert read_state(run)["step"] == step and pd.read_csv(run / "metrics.csv")["step"].max() <= step
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "metrics.csv"]  # no temp files left

    end = step + 6
    resumed = invoke([*args, "--steps", str(end), "--resume"])
    assert resumed.exit_code == 0, resumed.stderr
    straight = tmp_path / "straight"
    done = invoke(["train", "--out", str(straight), *MODEL, "--schedule", "constant", "--checkpoint-every", "none",
                   "--steps", str(end)])
    assert done.exit_code == 0, done.stderr
    assert_same_run(run, straight)


# --- SIGKILL at random moments --------------------------------------------------------------------------
KILL_ARGS = [*MODEL, "--steps", "12", "--checkpoint-every", "1", "--schedule", "warmup_cosine", "--warmup", "3"]


def _cli_child(run_dir: str) -> None:
    """In the forked child: `attnlab train`, resuming whatever the last kill left."""
    torch.set_num_threads(1)
    args = ["train", "--out", run_dir, *KILL_ARGS] + (["--resume"] if has_run(Path(run_dir)) else [])
    try:
        cli.main(args, prog_name="attnlab", standalone_mode=True)
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    os._exit(0)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """The uninterrupted run, and how long it takes (the window the kills are spread over)."""
    path = tmp_path_factory.mktemp("straight") / "run"
    warm = invoke(["train", "--out", str(path.with_name("warm-up")), *KILL_ARGS, "--steps", "1"])
    assert warm.exit_code == 0, warm.stderr  # lazy imports and the CPU peak measurement, once, untimed
    start = time.perf_counter()
    result = invoke(["train", "--out", str(path), *KILL_ARGS])
    assert result.exit_code == 0, result.stderr
    return path, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
@pytest.mark.parametrize("trial", range(KILL_TRIALS))
def test_sigkill_at_a_random_moment_leaves_a_loadable_checkpoint_and_resume_is_exact(tmp_path, straight_run,
                                                                                     trial):
    straight, duration = straight_run
    seed = trial if PROFILE != "thorough" else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    rows, delay = rng.randrange(12), rng.uniform(0.0, duration / 12)  # a random step, a random moment in it
    run = tmp_path / "run"
    child = mp.get_context("fork").Process(target=_cli_child, args=(str(run),))
    child.start()
    while data_rows(run / "metrics.csv") < rows and child.is_alive():  # the kill time follows progress,
        time.sleep(0.002)                                              # not the machine's speed
    child.join(timeout=delay)
    killed = child.is_alive()
    if killed:
        os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == (-signal.SIGKILL if killed else 0), (child.exitcode, seed, rows, delay)

    TALLY["kill tried"] += 1
    TALLY["kill killed" if killed else "kill finished first"] += 1
    if has_run(run):  # the first checkpoint is written before step 1; a kill before it leaves no run
        folder = checkpoint_dir(run)
        if folder != run / CHECKPOINT:
            TALLY["kill mid-swap"] += 1
        assert sorted(p.name for p in folder.iterdir()) == sorted(FILES), (folder, seed, rows, delay)
        state = read_state(run)
        assert 0 <= state["step"] <= 12
        model = load_run(run)  # the last checkpoint always loads ...
        assert all(torch.isfinite(p).all() for p in model.parameters())
    else:  # killed before the first checkpoint was swapped in: at most a partial checkpoint.tmp, ignored
        assert not (run / CHECKPOINT).exists() and not (run / "metrics.csv").exists()

    rest = invoke(["train", "--out", str(run), *KILL_ARGS] + (["--resume"] if has_run(run) else []))
    assert rest.exit_code == 0, (rest.stderr, seed, rows, delay)
    assert_same_run(run, straight)  # ... and resuming from it repeats the uninterrupted run exactly
    assert not (run / TMP).exists() and not (run / OLD).exists()
    TALLY["kill clean"] += 1
