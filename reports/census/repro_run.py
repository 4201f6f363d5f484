"""Running a standalone reproduction as a maintainer would: a fresh interpreter, outside the repository.

The generator runs each script to record its output in docs/findings/README.md, and the slow tier runs them to
prove each still reproduces; both go through :func:`run_all`, so the two cannot run them differently. One script
runs in its own interpreter (:func:`run_one`); many run as children of one interpreter that imported torch and
transformers once (reports/census/repro_zygote.py), each set up as its own ``python script`` would be: the
imports are ~95% of a witness's time, and the slow tier checks that both ways give the same outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 300  # a tiny model's witness takes seconds; a hang is a failure, not a wait
ZYGOTE = Path(__file__).with_name("repro_zygote.py")
PRELOAD = ("torch", "transformers", "transformers.modeling_utils")  # what every witness imports (the last: its model)


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


def run_all(paths: list[Path], workers: int = 2, preload: tuple[str, ...] = PRELOAD) -> dict[str, Outcome]:
    """Each script's outcome by file name, ``workers`` at a time, forked from one fresh interpreter that imported
    ``preload`` (reports/census/repro_zygote.py); a script past :data:`TIMEOUT_S` is killed (status -9)."""
    if not paths:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        job = out / "job.json"
        job.write_text(json.dumps({"scripts": [str(p.resolve()) for p in paths], "out": str(out), "workers": workers,
                                   "timeout_s": TIMEOUT_S, "preload": list(preload)}))
        cwd = out / "cwd"
        cwd.mkdir()
        done = subprocess.run([sys.executable, str(ZYGOTE), str(job)], cwd=cwd, env=clean_env(), capture_output=True,
                              text=True, timeout=TIMEOUT_S * len(paths))
        if done.returncode != 0:
            raise RuntimeError(f"the script runner ({ZYGOTE.name}) exited {done.returncode}: {done.stderr[-2000:]}")
        statuses = json.loads((out / "statuses.json").read_text())

        def text(name: str) -> str:  # a child killed before it opened its files left none
            return (out / name).read_text() if (out / name).exists() else ""

        return {p.name: Outcome(status, text(f"{i}.stdout"), text(f"{i}.stderr"))
                for i, (p, status) in enumerate(zip(paths, statuses, strict=True))}
