"""One tiny run through the `attnlab` commands, shared by the CLI, report and browser tests.

It costs about half a minute on 2 cores, so it is built once per test session: the session-scoped
``tiny_run`` fixture in tests/conftest.py calls :func:`build_tiny_run`. Tests that damage a run
must copy it first (:func:`copy_run`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner, Result

# A 2-layer attention-only model on a short induction task: big enough that every probe and
# figure has something to show, small enough to train in a few seconds.
TINY = ["--n-layers", "2", "--d-model", "32", "--n-heads", "4", "--d-vocab", "32", "--n-ctx", "32", "--attn-only",
        "--task", "induction", "--seq-len", "16", "--batch-size", "16", "--steps", "20", "--eval-every", "10",
        "--warmup", "5", "--log-every", "5", "--checkpoint-every", "none", "--device", "cpu"]
FAST_CHECK = ["--max-examples", "2"]
FAST_PROBE = ["--sequences", "8", "--seeds", "0,1"]
FAST_SATURATION = ["--d-heads", "8,16,32", "--seeds", "0,1"]


@dataclass
class TinyRun:
    run_dir: Path
    results: dict[str, Result] = field(default_factory=dict)


def invoke(args: list[str]) -> Result:
    from reports.cli import cli

    return CliRunner().invoke(cli, args, catch_exceptions=False)


def build_tiny_run(base: Path) -> TinyRun:
    """train -> check -> probe -> saturation -> report on the tiny config, each through the CLI."""
    run_dir = base / "tiny-run"
    run = TinyRun(run_dir)
    steps = {
        "train": ["train", "--out", str(run_dir), *TINY, "--no-progress"],
        "check": ["check", str(run_dir), *FAST_CHECK, "--no-progress"],
        "probe": ["probe", str(run_dir), *FAST_PROBE, "--no-progress"],
        "saturation": ["saturation", "--out", str(run_dir), *FAST_SATURATION, "--no-progress"],
        "report": ["report", str(run_dir)],
    }
    for name, args in steps.items():
        result = invoke(args)
        run.results[name] = result
        if result.exit_code != 0:
            raise AssertionError(f"attnlab {name} failed ({result.exit_code}): {result.stdout}\n{result.stderr}")
    return run


def copy_run(run: TinyRun, dest: Path) -> Path:
    shutil.copytree(run.run_dir, dest)
    return dest


def assert_one_line_error(result, code: int = 2, *needles: str) -> str:
    """The error contract: the exit code, exactly one line on stderr, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("attnlab: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in result.output + result.stderr
    for needle in needles:
        assert needle in err, (needle, err)
    return err
