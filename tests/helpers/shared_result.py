"""One expensive result per test run, shared by the pytest-xdist workers (pytest-xdist's documented recipe).

A module-scoped fixture is set up once per worker that runs one of its tests, and again whenever another module's
test runs between two of its own: the slow tier's findings scripts (~4 min) and detection-power measurement
(~2.5 min) ran twice a CI run. The first worker to ask computes the result under a file lock and writes it as JSON
beside the run's temporary folders; the others read it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from filelock import FileLock

T = TypeVar("T")


def shared(tmp_path_factory: Any, worker_id: str, name: str, produce: Callable[[], T],
           dump: Callable[[T], Any], load: Callable[[Any], T]) -> T:
    """``produce()``, computed once per run: ``dump`` makes it JSON, ``load`` makes it back."""
    if worker_id == "master":  # not under xdist: nothing to share
        return load(json.loads(json.dumps(dump(produce()))))
    path = tmp_path_factory.getbasetemp().parent / f"{name}.json"
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            return load(json.loads(path.read_text()))
        text = json.dumps(dump(produce()))
        path.write_text(text)
        return load(json.loads(text))  # every worker gets the same value, as JSON gives it back
