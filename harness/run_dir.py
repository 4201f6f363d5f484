"""``RunDir``: the one owner of a run directory's layout, and the one atomic writer.

Every stage writes plain files into the run directory (docs/architecture.md, "Data flow")::

    checkpoint/               weights, optimizer state, config.json, state.json  (attnlab train)
    metrics.csv               training curves                                     (attnlab train)
    model.json                an external model's card: source, adapter, design   (attnlab check/probe --hf)
    properties.csv            invariant checks                                    (attnlab check)
    probes/*.csv, *.json      head probes                                         (attnlab probe)
    saturation.csv            softmax saturation sweep                            (attnlab saturation)
    figures/*.png, report.html, report.md                                         (attnlab report)
    hf/                       the model as Hugging Face save_pretrained output    (attnlab demo)

Writers and readers take every path from :class:`RunDir`, so a file is never named twice.
What goes *into* each file (a CSV's columns) is owned by the module that writes it.

:func:`atomic_write` writes to a temp file in the same folder, fsyncs it, ``os.replace``\\ s it
over the target (atomic on POSIX and Windows) and fsyncs the folder, so a killed process leaves
either the old file or the new one, never half of one, and the rename survives a power cut.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.errors import AttnlabError, AttnlabTypeError


@dataclass(frozen=True)
class RunDir:
    """The paths inside one run directory (nothing is created or read by building one)."""

    path: Path

    def __init__(self, path: str | os.PathLike) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise AttnlabTypeError(f"run_dir must be a path, got {type(path).__name__}")
        object.__setattr__(self, "path", Path(path))

    # training (harness.train): the checkpoint swaps through .tmp and .old (harness.training.checkpoint)
    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    @property
    def checkpoint_tmp(self) -> Path:
        return self.path / "checkpoint.tmp"

    @property
    def checkpoint_old(self) -> Path:
        return self.path / "checkpoint.old"

    @property
    def metrics_csv(self) -> Path:
        return self.path / "metrics.csv"

    # analysis stages
    @property
    def model_json(self) -> Path:
        """The card of a model from outside attnlab (``--hf``/``--model``), in place of the checkpoint's config."""
        return self.path / "model.json"

    @property
    def properties_csv(self) -> Path:
        return self.path / "properties.csv"

    @property
    def saturation_csv(self) -> Path:
        return self.path / "saturation.csv"

    @property
    def probes(self) -> Path:
        return self.path / "probes"

    @property
    def hf_export(self) -> Path:
        """The demo's Hugging Face export (``attnlab export RUN_DIR --out DIR`` writes anywhere)."""
        return self.path / "hf"

    def probe_file(self, name: str) -> Path:
        """``probes/<name>`` (the probe stage owns the names: see :mod:`reports.rundata`)."""
        return self.probes / name

    @property
    def redundancy_json(self) -> Path:
        return self.probe_file("redundancy.json")

    # the report
    @property
    def figures(self) -> Path:
        return self.path / "figures"

    def figure(self, key: str) -> Path:
        return self.figures / f"{key}.png"

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    @property
    def report_md(self) -> Path:
        return self.path / "report.md"


# --- atomic, fsynced writes -------------------------------------------------------------------
def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where folders have no file descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def atomic_write(path: str | os.PathLike, write: Callable[[IO[Any]], Any], *, binary: bool = False) -> Path:
    """Call ``write(f)`` on a temp file beside ``path``, fsync it, and rename it over ``path``.

    On any error the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data), binary=True)


def atomic_write_json(path: str | os.PathLike, data: Any, **dumps: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, **dumps))


def read_json(path: str | os.PathLike) -> dict:
    """A JSON object from ``path``; a missing file is FileNotFoundError, any damage a ValueError naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AttnlabError(f"{path} is corrupt: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AttnlabError(f"{path} is corrupt: expected a JSON object, got {type(data).__name__}")
    return data
