"""Runs standalone scripts as ``python script`` would, each in a child forked from one interpreter that imported
the heavy modules once (a "zygote"): importing torch and transformers is ~95% of a tiny model's witness (10 s of
10.4 on a loaded core), so 63 witnesses cost one import, not 63.

Started by :func:`reports.census.repro_run.run_all` as a fresh interpreter, by path, in an empty folder, with
the caller's environment less PYTHONPATH; it imports nothing of the repository (this file's folder, sys.path[0],
is dropped before the imports, and each script's own put first). Each child then sets up what a fresh ``python
script`` has: ``sys.argv == [script]``, ``sys.path[0]`` the script's folder, ``__name__ == "__main__"``, its
own empty working folder, stdout and stderr (file descriptors 1 and 2, so C-level output is caught too) into
files; it exits with the script's status (SystemExit's code; 1 and a traceback on an uncaught exception), after
the atexit handlers, as the interpreter would. Children start from the zygote's state, never from one another's.

Protocol: argv[1] a JSON file ``{"scripts": [...], "out": folder, "workers": n, "timeout_s": s, "preload":
[...]}``; for script i the child writes ``out/i.stdout`` and ``out/i.stderr``; the zygote writes ``out/statuses.json``,
the exit statuses in order (a script past ``timeout_s`` is killed: status -9).
"""

import importlib
import json
import os
import signal
import sys
import tempfile
import time


def _child(script: str, stdout_path: str, stderr_path: str) -> None:
    """In the forked child: run ``script`` as ``__main__`` and exit with its status (never returns)."""
    status = 1
    try:
        import atexit
        import runpy
        import traceback

        for fd, path in ((1, stdout_path), (2, stderr_path)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (lives as long as the child)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        os.chdir(tempfile.mkdtemp())
        sys.argv = [script]
        sys.path.insert(0, os.path.dirname(script))
        try:
            runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as stop:  # the interpreter's rules for sys.exit's argument
            if stop.code is None:
                status = 0
            elif isinstance(stop.code, int):
                status = stop.code
            else:
                print(stop.code, file=sys.stderr)
                status = 1
        except BaseException:  # noqa: BLE001 -- what an uncaught exception does: a traceback, status 1
            traceback.print_exc()
            status = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status & 0xFF)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    del sys.path[0]  # this file's folder: a script's own goes first in its child
    for name in job["preload"]:
        importlib.import_module(name)
    scripts, out, workers, timeout_s = job["scripts"], job["out"], job["workers"], job["timeout_s"]
    statuses: list = [None] * len(scripts)
    running: dict = {}  # pid -> (index, started)
    todo = list(range(len(scripts)))
    while todo or running:
        while todo and len(running) < workers:
            i = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(scripts[i], os.path.join(out, f"{i}.stdout"), os.path.join(out, f"{i}.stderr"))
            running[pid] = (i, time.monotonic())
        pid, wait_status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for late, (_, started) in list(running.items()):
                if time.monotonic() - started > timeout_s:
                    os.kill(late, signal.SIGKILL)
            time.sleep(0.02)
            continue
        i, _ = running.pop(pid)
        statuses[i] = os.waitstatus_to_exitcode(wait_status)
    with open(os.path.join(out, "statuses.json"), "w", encoding="utf-8") as f:
        json.dump(statuses, f)


if __name__ == "__main__":
    main()
