"""Running the census: every model type, sharded over worker processes, cached by version.

Each model type is classified in a worker process (one torch thread) under a timeout; a timeout or a
dead worker is that type's result (``unsupported``, the stage it reached named), and the census goes
on. The workers are an executor's (reports/census/executor.py): a local fork pool by default, or Ray
tasks. Results are cached as JSON under ``$ATTNLAB_CACHE/census/<key>/`` (default
``~/.cache/attnlab``), where the key is the transformers version plus a hash of the code that decides
a result (this package, the adapters, the properties): an unchanged version does not rebuild. The bridge
census (``bridge=True``: reports/census/bridge.py) caches beside it under its own key, which adds the mode
and TransformerLens's version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import transformers

from reports.census import bridge as census_bridge
from reports.census.classify import Result, classify
from reports.census.enumerate import ModelType, model_types
from reports.census.executor import Executor, LocalPool, TimedOut

TIMEOUT_S = 120  # per model type: building and checking a tiny model takes seconds; a minute means a stuck path
ROOT = Path(__file__).resolve().parents[2]
# the code a result depends on: a change here invalidates the cache
CODE = ("reports/census", "harness/adapters", "harness/model", "harness/oracle", "properties")


def cache_key(bridge: bool = False) -> str:
    digest = hashlib.sha256()
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    key = f"transformers-{transformers.__version__}-{digest.hexdigest()[:12]}"
    return f"bridge-transformer_lens-{census_bridge.version()}-{key}" if bridge else key


def cache_dir(key: Optional[str] = None, bridge: bool = False) -> Path:
    base = Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))
    return base / "census" / (key or cache_key(bridge))


def run_one(mt: ModelType, timeout_s: int = TIMEOUT_S, bridge: bool = False) -> dict[str, Any]:
    """Classify ``mt`` (through the bridge when ``bridge``) under ``timeout_s``; the result as JSON (what crosses
    the process boundary)."""
    result = Result(mt.name, mt.task, mt.class_name)
    within(timeout_s, result, "model type", lambda: (census_bridge.classify if bridge else classify)(mt, result))
    return result.to_json()


def within(timeout_s: int, result: Result, unit: str, work: Callable[[], Any]) -> None:
    """Run ``work`` (which fills ``result``) under a ``timeout_s`` alarm; a timeout is itself the result, an
    "unsupported" row naming the stage it reached, so one slow model never stops the census."""
    start = time.perf_counter()
    signal.alarm(timeout_s)
    try:
        work()
    except TimedOut:
        result.category = "unsupported"
        result.reason = f"timed out after {timeout_s}s at stage {result.stage!r} (the census's budget per {unit})"
        result.seconds = round(time.perf_counter() - start, 2)
    finally:
        signal.alarm(0)


def census(types: Optional[list[ModelType]] = None, *, workers: int = 1, timeout_s: int = TIMEOUT_S,
           use_cache: bool = True, progress: Optional[Callable[[Result], None]] = None,
           bridge: bool = False, pool: Optional[Executor] = None) -> list[Result]:
    """The census of ``types`` (default: every model type; through the bridge when ``bridge``), cached results
    reused; sorted by model type. ``pool`` runs the model types (default: a local pool of ``workers``)."""
    types = model_types() if types is None else types
    folder = cache_dir(bridge=bridge)
    done: dict[str, Result] = {}
    if use_cache:
        for mt in types:
            path = folder / f"{mt.name}.json"
            if path.exists():
                done[mt.name] = Result.from_json(json.loads(path.read_text()))
    todo = [mt for mt in types if mt.name not in done]
    folder.mkdir(parents=True, exist_ok=True)
    work = functools.partial(run_one, timeout_s=timeout_s, bridge=bridge)
    for _, row in (pool or LocalPool(workers)).map(work, todo, lost, lambda mt: timeout_s):
        _store(Result.from_json(row), folder, done, progress)
    return [done[mt.name] for mt in types]


def lost(mt: ModelType, reason: str) -> dict[str, Any]:
    """The row of a model type whose worker died or that its executor stopped: ``unsupported`` at stage worker."""
    return Result(mt.name, mt.task, mt.class_name, stage="worker", reason=reason).to_json()


def _store(result: Result, folder: Path, done: dict[str, Result],
           progress: Optional[Callable[[Result], None]]) -> None:
    done[result.model_type] = result
    tmp = folder / f".{result.model_type}.json.tmp"
    tmp.write_text(json.dumps(result.to_json(), indent=1, sort_keys=True))
    tmp.replace(folder / f"{result.model_type}.json")  # atomic: a killed census leaves no half-written result
    if progress is not None:
        progress(result)
