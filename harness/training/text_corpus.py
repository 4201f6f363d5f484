"""Byte corpora for the ``text`` task, split into training and validation by file.

With no paths, the corpus is the Python standard library's own ``.py`` sources (found
through ``sysconfig``): real text that exists on every machine with Python. Splitting by
file (not by byte offset) keeps validation text from files the model never saw.
"""

from __future__ import annotations

import os
import sysconfig
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from harness.errors import AttnlabError

_CACHE: dict[tuple, dict[str, Tensor]] = {}


def default_paths() -> list[Path]:
    """The standard library's ``.py`` files, without installed third-party packages."""
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files: list[Path] = []
    for folder, dirs, names in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs[:] = [d for d in dirs if d not in skip]  # prune: never descend into installed packages
        files.extend(Path(folder, n) for n in names if n.endswith(".py"))
    return files


def collect_files(paths: Any) -> list[Path]:
    """Files named by ``paths`` (a path or a list of paths; folders contribute every file inside)."""
    if paths is None:
        files = default_paths()
    else:
        items: Sequence = [paths] if isinstance(paths, (str, Path)) else paths
        if not isinstance(items, (list, tuple)) or not items or \
                not all(isinstance(p, (str, Path)) for p in items):
            raise AttnlabError(f"task 'text': option paths={paths!r} is invalid: expected a path or a non-empty "
                               "list of paths (files or folders)")
        files = []
        for p in map(Path, items):
            if p.is_dir():
                files.extend(f for f in p.rglob("*") if f.is_file())
            elif p.is_file():
                files.append(p)
            else:
                raise FileNotFoundError(f"task 'text': {p} is neither a file nor a folder")
    files = sorted(set(files))
    if len(files) < 2:
        raise AttnlabError(f"task 'text' splits training and validation by file and found {len(files)} file(s) "
                           f"in {paths!r}: expected at least 2")
    return files


def split_files(files: list[Path], val_fraction: float) -> dict[str, list[Path]]:
    """A stable split: a file is validation when the CRC32 of its path falls in the val fraction.

    Stable: adding a file never moves another between splits, and the same tree splits the
    same way on every machine (paths are taken relative to the files' common folder).
    """
    root = Path(os.path.commonpath(files))
    val = [f for f in files if zlib.crc32(f.relative_to(root).as_posix().encode()) % 10_000 < val_fraction * 10_000]
    if not val:  # a handful of files: still hold one out
        val = [files[-1]]
    if len(val) == len(files):
        val = val[:-1]
    val_set = set(val)
    return {"train": [f for f in files if f not in val_set], "val": val}


def _read(files: list[Path], max_bytes: Optional[int]) -> Tensor:
    chunks, total = [], 0
    for f in files:
        data = f.read_bytes()
        if max_bytes is not None:
            data = data[: max_bytes - total]
        chunks.append(data)
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def load_corpus(paths: Any, val_fraction: float, max_bytes: Optional[int]) -> dict[str, Tensor]:
    """``{"train": uint8 [n], "val": uint8 [m]}``; ``max_bytes`` caps each split. Cached per process."""
    files = collect_files(paths)
    key = (tuple(map(str, files)), val_fraction, max_bytes)
    if key not in _CACHE:
        split = split_files(files, val_fraction)
        _CACHE[key] = {name: _read(fs, max_bytes) for name, fs in split.items()}
    return _CACHE[key]
