"""Checkpoints: safetensors weights and optimizer state, JSON config and state; atomic; no pickle.

Layout of ``run_dir/checkpoint/``:
    model.safetensors      the model's weights
    optimizer.safetensors  optimizer state tensors; its metadata holds the rest as JSON
    config.json            {"format", "model": ModelConfig, "train": TrainConfig}
    state.json             step, elapsed time, RNG states (torch, python, numpy, task, cuda),
                           and the partial metrics since the last row

A checkpoint is written whole into ``checkpoint.tmp/`` (each file fsynced), and only then
swapped in: ``checkpoint/`` -> ``checkpoint.old/``, ``checkpoint.tmp/`` -> ``checkpoint/``.
A process killed at any point leaves either the previous complete checkpoint or the new
one: readers find it through :func:`checkpoint_dir`, and the next write finishes the swap. Loading never unpickles: a
``torch.save`` file where a safetensors file belongs is refused, since a pickle can run code.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Optional, cast

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file, save_model
from torch import Tensor, nn

from harness._checks import check_int, is_number
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.config import ModelConfig
from harness.model.head_mask import apply_head_mask
from harness.model.transformer import Transformer
from harness.run_dir import RunDir, fsync_dir, fsync_file
from harness.run_dir import atomic_write_text as atomic_write_text  # re-exported for the writers in harness.train
from harness.run_dir import read_json as _read_json
from harness.training.config import TrainConfig
from harness.training.optim import optimizer_state_from_tensors, optimizer_state_to_tensors

FORMAT = 1
# The folder names inside a run directory (harness.run_dir.RunDir owns them; tests and messages use these).
_LAYOUT = RunDir(".")
CHECKPOINT, TMP, OLD = _LAYOUT.checkpoint.name, _LAYOUT.checkpoint_tmp.name, _LAYOUT.checkpoint_old.name
FILES = ("model.safetensors", "optimizer.safetensors", "config.json", "state.json")
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")


# --- RNG state as JSON ----------------------------------------------------------------------
def _b64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state(task_generator: torch.Generator) -> dict:
    py = random.getstate()
    np_state = cast(tuple, np.random.get_state())  # the legacy tuple form: get_state's default
    return {
        "torch": _b64(torch.get_rng_state()),
        "task": _b64(task_generator.get_state()),
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *map(_plain, np_state[2:])],
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def set_rng_state(state: dict, task_generator: torch.Generator) -> None:
    torch.set_rng_state(_unb64(state["torch"]))
    task_generator.set_state(_unb64(state["task"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


# --- reading with clear errors --------------------------------------------------------------
def checkpoint_dir(run_dir: Path) -> Path:
    """The folder holding the run's latest complete checkpoint; only reads, never renames.

    Normally ``run_dir/checkpoint``. A writer killed between its two renames leaves no
    ``checkpoint/`` but ``checkpoint.old/``; the swap starts only once ``checkpoint.tmp/`` is
    complete, so that tmp (when present) is the newest complete checkpoint, else the old one.
    """
    layout = RunDir(run_dir)
    final, tmp, old = layout.checkpoint, layout.checkpoint_tmp, layout.checkpoint_old
    if final.exists() or not old.exists():
        return final
    return tmp if tmp.exists() else old


def finish_swap(run_dir: Path) -> None:
    """Complete a swap a killed writer left half done (only the process that writes calls this)."""
    layout = RunDir(run_dir)
    final, old = layout.checkpoint, layout.checkpoint_old
    if not final.exists() and old.exists():
        os.rename(checkpoint_dir(run_dir), final)
        fsync_dir(layout.path)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def has_run(run_dir: Path) -> bool:
    layout = RunDir(run_dir)
    return any(p.exists() for p in (layout.checkpoint, layout.checkpoint_old, layout.metrics_csv))


def _require(path: Path) -> Path:
    if path.exists():
        return path
    near = [p.name for p in path.parent.glob(path.stem + "*") if p.suffix in PICKLE_SUFFIXES] \
        if path.parent.exists() else []
    extra = f"; found {near}, which would need unpickling and is refused" if near else ""
    raise FileNotFoundError(f"checkpoint file {path} is missing{extra}")


def check_safetensors(path: Path) -> Path:
    """``path`` if it is a readable safetensors file; never unpickles anything."""
    _require(path)
    with open(path, "rb") as f:
        head = f.read(16)
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        raise AttnlabError(f"{path} is a pickle / torch.save file, not safetensors: refusing to load it "
                           "(unpickling can run arbitrary code)")
    try:
        with safe_open(str(path), framework="pt") as f:
            f.metadata()
    except Exception as exc:  # safetensors raises its own error types for every kind of damage
        raise AttnlabError(f"{path} is not a valid safetensors file (corrupt or truncated): {exc}") from None
    return path


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file: missing names any pickle found in its place (see :func:`_require`)."""
    return _read_json(_require(path))


def read_configs(run_dir: Path) -> tuple[ModelConfig, TrainConfig]:
    """The model and train configs stored with a run's checkpoint."""
    path = checkpoint_dir(run_dir) / "config.json"
    data = read_json(path)
    try:
        configs = ModelConfig.from_dict(data["model"]), TrainConfig.from_dict(data["train"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AttnlabError(f"{path} does not hold a valid model and train config: {exc}") from None
    # A checkpoint stores every field: a missing one must not silently take today's default.
    missing = [f"{part}.{f.name}" for part, cls in (("model", ModelConfig), ("train", TrainConfig))
               for f in dataclasses.fields(cls) if f.name not in data[part]]
    if missing:
        raise AttnlabError(f"{path} does not hold a valid model and train config: missing field(s) {missing}")
    unknown = sorted(set(data) - {"format", "model", "train"})
    if unknown or data.get("format") != FORMAT:
        what = f"unknown key(s) {unknown}" if unknown else f"format {data.get('format')!r}"
        raise AttnlabError(f"{path} does not hold a valid model and train config: {what}: expected format "
                           f"{FORMAT} with 'model' and 'train'")
    return configs


def read_state(run_dir: Path) -> dict:
    path = checkpoint_dir(run_dir) / "state.json"
    state = read_json(path)
    missing = [k for k in ("format", "step", "elapsed_s", "rng", "pending") if k not in state]
    if missing:
        raise AttnlabError(f"{path} is corrupt: missing {missing}")
    if state["format"] != FORMAT:
        raise AttnlabError(f"{path} has format {state['format']!r}: expected {FORMAT}")
    _check_state(state, path)
    return state


def _check_state(state: dict, path: Path) -> None:
    """Types of what a resume reads, so a damaged state.json is an error naming it, not a crash mid-resume."""
    step, pending, rng = state["step"], state["pending"], state["rng"]
    check_int(f"{path} is corrupt: step", step, 0)
    if not is_number(state["elapsed_s"]):
        raise AttnlabError(f"{path} is corrupt: elapsed_s={state['elapsed_s']!r} is invalid: expected a number")
    keys = ("loss_sum", "steps", "tokens", "time")
    if not isinstance(pending, dict) or not all(is_number(pending.get(k)) for k in keys):
        raise AttnlabError(f"{path} is corrupt: pending={pending!r} is invalid: expected numbers {list(keys)}")
    try:  # decode every RNG state the way set_rng_state will, on throwaway generators
        for key, ref in (("torch", torch.get_rng_state()), ("task", torch.Generator().get_state())):
            if _unb64(rng[key]).numel() != ref.numel():
                raise AttnlabError(f"{key} state has the wrong size")
        version, internal, gauss = rng["python"]
        random.Random().setstate((version, tuple(internal), gauss))
        name, np_keys, pos, has_gauss, cached = rng["numpy"]
        np.random.RandomState().set_state((name, np.asarray(np_keys, dtype=np.uint32), pos, has_gauss, cached))
        if not isinstance(rng["cuda"], list):
            raise AttnlabError("cuda states are not a list")
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise AttnlabError(f"{path} is corrupt: the rng states are invalid ({type(exc).__name__}: {exc})") from None


def load_weights(model: nn.Module, run_dir: Path) -> None:
    path = check_safetensors(checkpoint_dir(run_dir) / "model.safetensors")
    try:
        load_model(model, str(path), strict=True, device=str(next(model.parameters()).device))
    except RuntimeError as exc:
        raise AttnlabError(f"{path} does not fit the model: {exc}") from None


def load_optimizer(optimizer: torch.optim.Optimizer, run_dir: Path) -> None:
    path = check_safetensors(checkpoint_dir(run_dir) / "optimizer.safetensors")
    tensors = {}
    with safe_open(str(path), framework="pt") as f:
        meta = (f.metadata() or {}).get("optimizer")
        for key in f.keys():
            tensors[key] = f.get_tensor(key)
    if meta is None:
        raise AttnlabError(f"{path} is corrupt: no 'optimizer' metadata")
    optimizer_state_from_tensors(optimizer, tensors, meta, str(path))


def load_run(run_dir: str | os.PathLike, device: Optional[str | torch.device] = None) -> Transformer:
    """The trained :class:`harness.Transformer` of a run (its last checkpoint), in eval mode.

    A run trained with a ``head_mask`` gives the pruned model: its pruned heads are held at zero
    (:func:`harness.model.head_mask.apply_head_mask`), as they were in training.
    """
    if not isinstance(run_dir, (str, os.PathLike)):
        raise AttnlabTypeError(f"run_dir must be a path, got {type(run_dir).__name__}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    model_cfg, train_cfg = read_configs(run_dir)
    model = Transformer(model_cfg)
    if device is not None:
        model.to(device)
    load_weights(model, run_dir)
    apply_head_mask(model, train_cfg.head_mask)
    return model.eval()


# --- writing --------------------------------------------------------------------------------
def save_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, model_cfg: ModelConfig,
                    train_cfg: TrainConfig, state: dict) -> Path:
    """Write a complete checkpoint and swap it in atomically; returns ``run_dir/checkpoint``."""
    layout = RunDir(run_dir)
    run_dir, final, tmp, old = layout.path, layout.checkpoint, layout.checkpoint_tmp, layout.checkpoint_old
    finish_swap(run_dir)  # an interrupted swap's newest checkpoint becomes checkpoint/ first
    if tmp.exists():
        shutil.rmtree(tmp)  # a write that never finished
    try:
        tmp.mkdir(parents=True)
        # save_model de-duplicates tied weights, which plain save_file refuses.
        save_model(model, str(tmp / "model.safetensors"))
        tensors, meta = optimizer_state_to_tensors(optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"), metadata={"optimizer": meta})
        config = {"format": FORMAT, "model": model_cfg.to_dict(), "train": train_cfg.to_dict()}
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        (tmp / "state.json").write_text(json.dumps({"format": FORMAT, **state}, indent=1), encoding="utf-8")
        for name in FILES:
            fsync_file(tmp / name)
        fsync_dir(tmp)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a full or read-only disk leaves nothing half-written
        if isinstance(exc, (OSError, SafetensorError)):  # safetensors reports a full disk as its own error
            raise OSError(f"cannot write a checkpoint into {run_dir}: {exc}") from None
        raise
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` and prove it takes a write before any work is done, so a read-only or
    full disk fails at once with the folder named (and a folder created here is removed again)."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    probe = run_dir / ".attnlab-write-test"  # one fixed name: a probe left by a killed process is reused
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(bytes(4096))  # a block: creating an empty file can succeed on a full disk
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        for remove in (probe.unlink, run_dir.rmdir if created else None):
            try:
                if remove is not None:
                    remove()
            except OSError:
                pass
        raise OSError(f"cannot write into run directory {run_dir}: {exc}") from None


def remove_run(run_dir: Path) -> None:
    """Delete what :func:`harness.train` wrote into ``run_dir`` (and nothing else)."""
    layout = RunDir(run_dir)
    for folder in (layout.checkpoint, layout.checkpoint_tmp, layout.checkpoint_old):
        if folder.exists():
            shutil.rmtree(folder)
    layout.metrics_csv.unlink(missing_ok=True)
