"""Running a standalone reproduction as a maintainer would: a fresh interpreter, outside the repository.

The generator runs each script to record its output in docs/findings/README.md, and the slow tier runs them to
prove each still reproduces; both go through :func:`run_one`, so the two cannot run them differently.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 300  # a tiny model's witness takes seconds; a hang is a failure, not a wait


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def clean_env() -> dict[str, str]:
    """The environment without PYTHONPATH, so nothing of the repository can be imported by accident."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_one(path: Path) -> Outcome:
    """``python path`` (this interpreter) in an empty temporary folder."""
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run([sys.executable, str(path.resolve())], cwd=cwd, env=clean_env(), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    return Outcome(done.returncode, done.stdout, done.stderr)


def run_all(paths: list[Path], workers: int = 2) -> dict[str, Outcome]:
    """Each script's outcome by file name, ``workers`` at a time."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip([p.name for p in paths], pool.map(run_one, paths), strict=True))
