"""The findings scripts' runner (reports/census/repro_run.py): each script forked from one interpreter runs as its
own ``python script`` would -- argv, ``__main__``, its folder first on sys.path, an empty working folder, its own
stdout and stderr, the interpreter's exit statuses -- and a hang is killed. Tiny scripts with nothing preloaded, so
this is fast; the slow tier compares a real witness's forked outcome with its own interpreter's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reports.census import repro_run
from reports.census.repro_run import run_all, run_one

REPORT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
                  "pythonpath": os.environ.get("PYTHONPATH"), "leak": "LEAK" in globals()}))
"""


def _scripts(tmp_path: Path, **texts: str) -> list[Path]:
    paths = []
    for name, text in texts.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        paths.append(path)
    return paths


def test_each_script_runs_as_its_own_interpreter_would(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # a maintainer's run has none: neither may the scripts
    # the first script leaves a global and a module behind: the second, forked from the same parent, sees neither
    a, b = _scripts(tmp_path, a="import sys\nLEAK = 1\nsys.modules['leaked_by_a'] = sys\n" + REPORT,
                    b=REPORT + "print('leaked_by_a' in __import__('sys').modules)\n")
    forked = run_all([a, b], workers=1, preload=())
    for path in (a, b):
        out = forked[path.name]
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout.splitlines()[0])
        assert seen["argv"] == [str(path.resolve())] and seen["name"] == "__main__"
        assert seen["path0"] == str(tmp_path.resolve()) and seen["pythonpath"] is None
        assert Path(seen["cwd"]).resolve() != Path.cwd().resolve() and not os.listdir(seen["cwd"])
    assert forked[b.name].stdout.splitlines()[1] == "False"
    alone = json.loads(run_one(a).stdout)
    assert alone["argv"] == [str(a.resolve())] and alone["name"] == "__main__" and alone["path0"] == seen["path0"]


def test_exit_statuses_and_output_are_the_interpreters(tmp_path):
    scripts = _scripts(
        tmp_path,
        code="import sys\nprint('evidence')\nsys.exit(3)\n",
        message="import sys\nsys.exit('a control failed')\n",
        raised="print('before')\nraise ValueError('boom')\n",
        clean="import atexit, os\natexit.register(print, 'at exit')\nos.write(2, b'fd 2\\n')\n",
    )
    forked = run_all(scripts, workers=2, preload=())
    for path in scripts:  # the same status, stdout and stderr as the script's own interpreter
        alone, out = run_one(path), forked[path.name]
        assert (out.returncode, out.stdout) == (alone.returncode, alone.stdout), path.name
        assert out.stderr.splitlines()[-1:] == alone.stderr.splitlines()[-1:], (path.name, out.stderr, alone.stderr)
    assert [forked[p.name].returncode for p in scripts] == [3, 1, 1, 0]
    assert forked["raised.py"].stdout == "before\n" and "ValueError: boom" in forked["raised.py"].stderr
    assert forked["clean.py"].stdout == "at exit\n" and forked["clean.py"].stderr == "fd 2\n"


def test_a_hang_is_killed_at_the_timeout_and_the_rest_still_run(tmp_path, monkeypatch):
    monkeypatch.setattr(repro_run, "TIMEOUT_S", 1)
    hang, quick = _scripts(tmp_path, hang="import time\nprint('started', flush=True)\ntime.sleep(60)\n",
                           quick="print('done')\n")
    forked = run_all([hang, quick], workers=1, preload=())
    assert forked["hang.py"].returncode == -9 and forked["hang.py"].stdout == "started\n"
    assert forked["quick.py"] == repro_run.Outcome(0, "done\n", "")


def test_a_runner_that_cannot_start_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)exited 1: .*no_such_module_to_preload"):
        run_all(_scripts(tmp_path, a="print(1)\n"), preload=("no_such_module_to_preload",))
