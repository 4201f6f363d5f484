"""Running configuration variants: each drawn config built, checked and categorised as the census does.

One job is one drawn config of one model type (reports/census/variants.py) at one dtype. It runs in a census
worker (reports/census/executor.py: a local fork pool or a Ray task; one torch thread, an alarm per attempt) and
ends in one of
:data:`CATEGORIES`: the census's categories plus ``config refused``, a drawn config that transformers itself
refuses (its config or model constructor, or the raw forward on a plain input, raises), which is no bug of the
model or of attnlab. A worker that dies is its job's row (``unsupported``, stage ``worker``), a timeout likewise.

A failed job (``untriaged``, ``finding``, or ``check_model`` raising) is shrunk to a minimal failing config by
a greedy field-by-field reset, in the worker: each drawn field in turn is put back to the shrunk default, and
the reset is kept when the config still fails the same way (:func:`signature`: the same category and the same
failed properties or exception); a pass over every field is repeated until no reset is kept, so no single field
of the result can be reset without losing the failure (the local minimum hypothesis's shrinker also reaches on
a dict of independent keys, but with one worker run per attempt instead of one process for all).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from harness.adapters import adapt
from reports.census import findings
from reports.census.classify import CATEGORIES as CENSUS_CATEGORIES
from reports.census.classify import ENC_DEC, Result, check, classify, exc_line, multimodal, prepare, verdict
from reports.census.enumerate import ModelType
from reports.census.executor import Executor, LocalPool
from reports.census.run import cache_dir, within
from reports.census.variants import build_config

REFUSED = "config refused"
CATEGORIES = (*CENSUS_CATEGORIES, REFUSED)
DTYPES = ("float32", "bfloat16", "float16")
TIMEOUT_S = 120  # per attempt, as the census's per model type
SHRUNK = ("untriaged", "finding")  # and unsupported at stage check: check_model itself raised


@dataclass
class Job:
    """One drawn config of one model type at one dtype (JSON-able: it crosses the process boundary)."""

    model_type: str
    task: str
    class_name: str
    index: int  # its place in the type's draw (0: the shrunk default itself when drawn first)
    dtype: str
    changes: dict[str, Any]

    def key(self) -> str:
        blob = json.dumps([self.model_type, self.class_name, self.dtype, self.changes], sort_keys=True)
        return f"{self.model_type}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    def mt(self) -> ModelType:
        return ModelType(self.model_type, self.task, self.class_name, (self.task,))


@dataclass
class Row:
    """A job's outcome: the census result of the drawn config and, for a failure, its minimal failing config."""

    job: dict[str, Any]
    result: dict[str, Any]
    minimal: Optional[dict[str, Any]] = None  # the drawn changes left after the greedy reset (failures only)
    minimal_result: Optional[dict[str, Any]] = None
    attempts: int = 0
    shrink_notes: list[str] = field(default_factory=list)

    @property
    def category(self) -> str:
        return str(self.result["category"])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        return cls(**data)


def _stages(changes: dict[str, Any], dtype: str) -> Callable[[ModelType, Result], None]:
    def stages(mt: ModelType, r: Result) -> None:
        try:
            config = build_config(mt.name, mt.class_name, changes)
        except Exception as exc:  # the config class refuses the drawn values
            r.category, r.reason = REFUSED, f"{mt.class_name}'s config refuses {changes}: {exc_line(exc)}"
            return
        prepared = prepare(mt, r, config)
        if r.category == "transformers fails" or (r.category == "unsupported" and r.stage == "config"
                                                  and "parameters (expected" not in r.reason):
            # the model constructor or its raw forward raises on this config, which the shrunk default passes
            r.category, r.reason = REFUSED, f"transformers refuses the drawn config: {r.reason}"
            return
        if prepared is None:
            return
        model, seq2seq, hybrid = prepared
        r.stage = "adapter"
        try:
            adapter = adapt(model)
            r.route = adapter.route
        except Exception as exc:
            r.category, r.reason = "unsupported", f"{ENC_DEC if seq2seq else 'HFAdapter'}: {exc_line(exc)}"
            return
        documented = {p: f.summary for p, f in findings.for_config(mt.name, config, dtype).items()}
        check(adapter, r, ENC_DEC if seq2seq else "HFAdapter", multimodal(model), hybrid, documented,
              dtype=None if dtype == "float32" else dtype)
    return stages


def attempt(job: Job, changes: dict[str, Any], timeout_s: int) -> Result:
    """The census result of ``job``'s model type with ``changes``, under ``timeout_s`` (a timeout is a result)."""
    result = Result(job.model_type, job.task, job.class_name)
    within(timeout_s, result, "attempt", lambda: classify(job.mt(), result, stages=_stages(changes, job.dtype)))
    return result


def signature(r: Result) -> Optional[tuple[str, ...]]:
    """What a failure is, for the shrink to keep: category and failed properties, or check_model's exception type;
    None for a result that is no failure."""
    if r.category in SHRUNK:
        return (r.category, *sorted(r.failures))
    if r.category == "unsupported" and r.stage == "check" and r.reason.startswith("check_model raised"):
        match = re.match(r"check_model raised (\w+)", r.reason)
        return (r.category, match.group(1) if match else "")
    return None


def run_job(job: Job, timeout_s: int = TIMEOUT_S) -> dict[str, Any]:
    """Check ``job``'s config; shrink a failure by the greedy reset (module docstring). The row as JSON."""
    first = attempt(job, job.changes, timeout_s)
    row = Row(asdict(job), first.to_json())
    target = signature(first)
    if target is None:
        return row.to_json()
    current, last, kept = dict(job.changes), first, True
    while kept:
        kept = False
        for name in list(current):
            trial = {k: v for k, v in current.items() if k != name}
            row.attempts += 1
            result = attempt(job, trial, timeout_s)
            if signature(result) == target:
                current, last, kept = trial, result, True
                row.shrink_notes.append(f"reset {name}")
    row.minimal, row.minimal_result = current, last.to_json()
    return row.to_json()


def retriage(row: Row) -> Row:
    """``row`` with its failed results categorised again from their failed properties and today's findings
    (finding where every failure is documented for the drawn config, else untriaged), the checks not re-run: what
    the docs take after findings.py changes (the check results are the run's; only the verdict is re-derived)."""
    job = Job(**row.job)
    out = Row.from_json(row.to_json())
    for key in ("result", "minimal_result"):
        data = getattr(out, key)
        if not data or data["category"] not in SHRUNK:
            continue
        changes = job.changes if key == "result" else (out.minimal or {})
        config = build_config(job.model_type, job.class_name, changes)
        documented = {p: f.summary for p, f in findings.for_config(job.model_type, config, job.dtype).items()}
        r = Result.from_json(data)
        verdict(r, {}, None, None, documented)
        setattr(out, key, r.to_json())
    return out


def _store(row: Row, folder: Path, done: dict[str, Row], progress: Optional[Callable[[Row], None]]) -> None:
    key = Job(**row.job).key()
    done[key] = row
    tmp = folder / f".{key}.json.tmp"
    tmp.write_text(json.dumps(row.to_json(), indent=1, sort_keys=True))
    tmp.replace(folder / f"{key}.json")  # atomic: a killed run leaves no half-written row
    if progress is not None:
        progress(row)


def run_jobs(jobs: list[Job], *, workers: int = 1, timeout_s: int = TIMEOUT_S, use_cache: bool = True,
             progress: Optional[Callable[[Row], None]] = None, pool: Optional[Executor] = None) -> list[Row]:
    """Every job's row, in ``jobs`` order, run by ``pool`` (default: a local pool of ``workers``); rows cached beside
    the census's (same key: transformers version and code hash) and reused."""
    folder = cache_dir() / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[str, Row] = {}
    if use_cache:
        for job in jobs:
            path = folder / f"{job.key()}.json"
            if path.exists():
                done[job.key()] = Row.from_json(json.loads(path.read_text()))
    todo = [j for j in jobs if j.key() not in done]
    work = functools.partial(run_job, timeout_s=timeout_s)
    for _, row in (pool or LocalPool(workers)).map(work, todo, lost, lambda job: timeout_s * most_attempts(job)):
        _store(Row.from_json(row), folder, done, progress)
    return [done[j.key()] for j in jobs]


def most_attempts(job: Job) -> int:
    """The most attempts :func:`run_job` makes on ``job``: the first, then passes of the greedy reset over n drawn
    fields, each pass but the last keeping a reset, so the k-th pass tries at most n - k + 1 fields: n(n+1)/2."""
    n = len(job.changes)
    return 1 + n * (n + 1) // 2


def lost(job: Job, reason: str) -> dict[str, Any]:
    """The row of a job whose worker died or that its executor stopped: ``unsupported`` at stage worker."""
    dead = Result(job.model_type, job.task, job.class_name, stage="worker", reason=reason)
    return Row(asdict(job), dead.to_json()).to_json()
