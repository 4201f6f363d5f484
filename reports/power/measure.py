"""Detection power: the smallest planted bug each calibrated row catches, per model and dtype.

For every subject (reports/power/subjects.py), dtype and bug family (reports/power/plant.py), the
family's row runs first on the control (size 0: the planted code path switched off), which must pass
(a fail there is a false alarm, reported as such), then on the family's sizes smallest first, each on
a freshly loaded model (a twin is made of the planted model, so the bug is in both: never in the
floor), until one is caught; the sizes above it are not run. A cell's verdict:

- ``caught``: the row fails;
- ``hidden``: the row passes, but its golden twin fails it (properties/precision.py, "Hidden bugs");
- ``missed``: the row passes and says nothing;
- ``n/a``: the family cannot be planted on this model or the row does not apply (the reason says which).

Seeded (seed 0) and with a fixed number of examples per row, so a run reproduces the stored table
(docs/power.json; the slow tier compares).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

from harness.adapters import adapt
from harness.errors import AttnlabError
from properties import PROPERTIES
from properties.precision import HIDDEN
from reports.power.plant import FAMILIES, plant
from reports.power.subjects import DTYPES, Subject

SEED = 0
# examples per row: the tiny models are cheap; SmolLM2 runs 30 layers per pass, as in its slow-tier checks
MAX_EXAMPLES = {"ours": 10, "zoo-llama": 10, "smollm2": 2}
VERDICTS = ("caught", "hidden", "missed", "n/a", "pass", "false alarm")  # "pass": a control that passes


@dataclass(frozen=True)
class Cell:
    """One planted bug's verdict on one row."""

    subject: str
    dtype: str
    family: str
    row: str
    size: float
    verdict: str
    worst: float
    allowance: float
    ratio: float
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict_of(status: str, reason: str, size: float) -> str:
    if status == "fail":
        return "false alarm" if size == 0 else "caught"
    if status == "pass":
        if size == 0:  # the control: a note that its twin fails would be a false alarm too
            return "false alarm" if reason.startswith(HIDDEN) else "pass"
        return "hidden" if reason.startswith(HIDDEN) else "missed"
    return "n/a"


def check_args(subjects: list[Subject], dtypes: Iterable[str], families: Iterable[str]) -> tuple[list[str], list[str]]:
    dtypes, families = list(dtypes), list(families)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise AttnlabError(f"dtypes={dtypes!r} is invalid: expected one or more of {DTYPES}")
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        raise AttnlabError(f"families={families!r} is invalid: expected one or more of {sorted(FAMILIES)}")
    if not subjects:
        raise AttnlabError("subjects=[] is invalid: expected at least one model to plant into")
    return dtypes, families


def one(subject: Subject, dtype: str, family: str, size: float, max_examples: int) -> Cell:
    """Plant ``family`` of ``size`` into a fresh ``subject`` at ``dtype`` and run the family's row."""
    fam = FAMILIES[family]
    model = subject.load(dtype)
    try:
        plant(model, family, size)
    except AttnlabError as exc:
        return Cell(subject.name, dtype, family, fam.row, size, "n/a", float("nan"), float("nan"), float("nan"),
                    str(exc))
    with torch.no_grad():
        result = PROPERTIES[fam.row](adapt(model), seed=SEED, max_examples=max_examples)
    verdict = verdict_of(result.status, result.reason, size)
    detail = result.counterexample if result.status == "fail" else result.reason
    return Cell(subject.name, dtype, family, fam.row, size, verdict, float(result.worst), float(result.allowance),
                float(result.ratio), detail)


def measure(subjects: list[Subject], dtypes: Iterable[str] = DTYPES, families: Iterable[str] = tuple(FAMILIES),
            max_examples: Optional[dict[str, int]] = None,
            progress: Callable[[Cell], None] = lambda cell: None) -> list[Cell]:
    """Every cell run: per subject, dtype and family the control, then sizes up to the first caught."""
    dtypes, families = check_args(subjects, dtypes, families)
    counts = {**MAX_EXAMPLES, **(max_examples or {})}
    cells: list[Cell] = []
    for subject in subjects:
        if subject.skip:
            for dtype in dtypes:
                for family in families:
                    cells.append(Cell(subject.name, dtype, family, FAMILIES[family].row, 0.0, "n/a", float("nan"),
                                      float("nan"), float("nan"), f"skipped: {subject.skip}"))
            continue
        n = counts.get(subject.name, 10)
        for dtype in dtypes:
            for family in families:
                for size in (0.0, *FAMILIES[family].sizes):
                    cell = one(subject, dtype, family, size, n)
                    cells.append(cell)
                    progress(cell)
                    if cell.verdict == "n/a" or (size > 0 and cell.verdict == "caught"):
                        break
    return cells


def smallest(cells: list[Cell]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(subject, family, dtype) -> the smallest caught size (None if none), the control's verdict, the
    verdict of each size run, and each run's ratio (worst / allowance; None where the row did not run)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for cell in cells:
        entry = out.setdefault((cell.subject, cell.family, cell.dtype),
                               {"row": cell.row, "caught_at": None, "control": None, "sizes": {}, "ratios": {},
                                "reason": ""})
        entry["ratios"][cell.size] = cell.ratio if math.isfinite(cell.ratio) else None
        if cell.size == 0:
            entry["control"] = cell.verdict
            if cell.verdict == "n/a":
                entry["reason"] = cell.reason
            continue
        entry["sizes"][cell.size] = cell.verdict
        if cell.verdict == "caught" and entry["caught_at"] is None:
            entry["caught_at"] = cell.size
    return out
