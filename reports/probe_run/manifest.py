"""probes/manifest.json: what a probe run was made from, and which of its methods have finished.

Written atomically after every finished method, so a run stopped at any moment (Ctrl-C, SIGTERM,
SIGKILL) says exactly which CSVs are whole. ``--resume`` reads it: a run made from another model,
other data or other options is refused with one line naming what differs, before anything is
written; otherwise the finished methods are skipped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

import torch

from harness.errors import AttnlabError
from harness.run_dir import atomic_write_json, read_json

VERSION = 1


SUM_CHUNK = 2 ** 22  # elements: a float64 copy of one chunk is 32 MiB


def _sums(p: torch.Tensor) -> tuple[float, float]:
    """``(sum, sum of absolute values)`` of ``p`` in float64, a chunk at a time."""
    flat = p.detach().reshape(-1)
    total = mass = 0.0
    for start in range(0, flat.numel(), SUM_CHUNK):
        part = flat[start:start + SUM_CHUNK].double()
        total += float(part.sum())
        mass += float(part.abs().sum())
    return total, mass


def fingerprint(model: Any) -> str:
    """A short hash of every parameter's name, shape, dtype and sums, to 9 digits of its absolute sum.

    Sums in float64 a chunk at a time (:data:`SUM_CHUNK` elements): ``p.sum(dtype=torch.float64)`` makes a
    float64 copy of the whole tensor first, 1.3 GB for Gemma-3-270M's embedding, which set the probe's peak RSS.
    The signed sum is written relative to the absolute sum (``mass``): a signed sum near 0 is all cancellation,
    whose digits change with the summation order (another thread count), while its error relative to the mass
    stays ~1e-16 x n."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if not isinstance(p, torch.Tensor) or not p.is_floating_point():
                continue
            total, mass = _sums(p)
            digest.update(f"{name}{tuple(p.shape)}{p.dtype}{total / mass if mass else 0.0:.9f}{mass:.9e}".encode())
    return digest.hexdigest()[:16]


def data_hash(tokens: torch.Tensor, loss_mask: Optional[torch.Tensor],
              source: Optional[dict[str, torch.Tensor]] = None) -> str:
    """A short hash of the probe data; an encoder-decoder's source keywords count too (a decoder-only run's hash
    is what it was before sources existed, so its --resume still matches)."""
    digest = hashlib.sha256(tokens.detach().cpu().to(torch.int64).numpy().tobytes())
    digest.update(str(tuple(tokens.shape)).encode())
    if loss_mask is not None:
        digest.update(loss_mask.detach().cpu().to(torch.int64).numpy().tobytes())
    for name, t in sorted((source or {}).items()):
        digest.update(f"{name}{tuple(t.shape)}".encode() + t.detach().cpu().to(torch.int64).numpy().tobytes())
    return digest.hexdigest()[:16]


def identity(model: Any, tokens: torch.Tensor, loss_mask: Optional[torch.Tensor],
             source: Optional[dict[str, torch.Tensor]] = None) -> dict[str, Any]:
    """The model and the data a run was made from."""
    cfg = model.cfg
    return {"class": type(model).__name__, "n_layers": int(cfg.n_layers), "n_heads": int(cfg.n_heads),
            "d_model": int(cfg.d_model), "d_vocab": int(cfg.d_vocab), "weights": fingerprint(model),
            "data": data_hash(tokens, loss_mask, source)}


def new(ident: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    return {"version": VERSION, "model": ident, "options": options, "finished": {}}


def read(path: Path) -> Optional[dict[str, Any]]:
    if not path.exists():
        return None
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION or \
            not isinstance(manifest.get("finished"), dict):
        raise AttnlabError(f"{path} is not a probe manifest (version {VERSION}): remove it, or probe into another "
                           f"--out folder")
    return manifest


def differences(manifest: dict[str, Any], ident: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """What differs between the run in ``manifest`` and this one, as ``field: was X, now Y``."""
    out = []
    for part, now in (("model", ident), ("options", options)):
        was = manifest.get(part, {})
        for key in sorted(set(was) | set(now)):
            if was.get(key) != now.get(key):
                label = {"weights": "model weights", "data": "probe data"}.get(key, key)
                out.append(f"{label}: was {was.get(key)!r}, now {now.get(key)!r}")
    return out


def check_resume(path: Path, ident: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The manifest to continue, or one error naming what differs (nothing is written either way)."""
    manifest = read(path)
    if manifest is None:
        raise AttnlabError(f"--resume: {path} does not exist, so there is no probe run to continue: run without "
                           f"--resume")
    diff = differences(manifest, ident, options)
    if diff:
        raise AttnlabError(f"--resume: {path.parent} was probed from another model, data or options "
                           f"({'; '.join(diff)}); nothing was overwritten: probe into another --out folder, or "
                           f"run without --resume to start again")
    return manifest


def finish(path: Path, manifest: dict[str, Any], method: str, variant: str, seconds: float, **facts: Any) -> None:
    """Record ``method`` as finished (its file is already whole), with what --resume needs of it (``facts``)."""
    manifest["finished"][method] = {"variant": variant, "seconds": round(seconds, 3),
                                    **{k: v for k, v in facts.items() if v is not None}}
    atomic_write_json(path, manifest, indent=1)
