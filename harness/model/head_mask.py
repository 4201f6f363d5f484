"""Pruned heads held at zero: a permanent hook on each layer's ``hook_z``.

A head mask ``[n_layers, n_heads]`` (1 = keep, 0 = pruned) removes a head the way the probes
ablate one (docs/architecture.md: heads are ablated through ``hook_z``, before the output
projection), but for good: the hook is permanent (``reset_hooks`` and ``model.hooks()``
leave it), so a pruned head outputs exactly zero in training, in evaluation, under the
probes' own masks and after :func:`harness.load_run` (the mask travels in the run's config).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from harness._checks import is_number
from harness.errors import AttnlabError

__all__ = ["normalize_head_mask", "check_head_mask_shape", "apply_head_mask", "head_mask_of"]

_HANDLES = "_attnlab_head_mask_handles"  # attribute on the model: the hooks this module added
_MASK = "_attnlab_head_mask"


def _fail(value: Any, expected: str) -> AttnlabError:
    text = repr(value)
    if len(text) > 200:
        text = text[:200] + "..."
    return AttnlabError(f"head_mask={text} is invalid: expected {expected}")


def normalize_head_mask(mask: Any) -> tuple[tuple[int, ...], ...]:
    """``mask`` (nested sequences or a tensor of 0/1) as a JSON-friendly tuple of int tuples.

    Refuses anything that is not a non-empty rectangular grid of 0s and 1s with at least one 1:
    a model with every head pruned has no attention left to heal.
    """
    if isinstance(mask, Tensor):
        if mask.ndim != 2:
            raise _fail(mask, f"a 2-D [n_layers, n_heads] grid of 0/1, got {mask.ndim} dimensions")
        mask = mask.tolist()
    if isinstance(mask, (str, bytes)) or not isinstance(mask, Sequence) or not mask:
        raise _fail(mask, "a non-empty [n_layers, n_heads] grid of 0/1 (nested lists or a tensor)")
    rows = []
    for row in mask:
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not row:
            raise _fail(mask, "a non-empty [n_layers, n_heads] grid of 0/1 (each row a non-empty sequence)")
        out = []
        for v in row:
            if not is_number(v) or v not in (0, 1):
                raise _fail(mask, f"only 0 (pruned) and 1 (kept) entries, found {v!r}")
            out.append(int(v))
        rows.append(tuple(out))
    if len({len(r) for r in rows}) != 1:
        raise _fail(mask, f"a rectangular grid, found rows of lengths {sorted({len(r) for r in rows})}")
    if not any(any(r) for r in rows):
        raise _fail(mask, "at least one kept head (1): every head is pruned")
    return tuple(rows)


def check_head_mask_shape(mask: tuple[tuple[int, ...], ...], n_layers: int, n_heads: int) -> None:
    shape = (len(mask), len(mask[0]))
    if shape != (n_layers, n_heads):
        grid = [list(r) for r in mask]
        raise AttnlabError(f"head_mask={grid} of shape {list(shape)} is invalid: expected the model's "
                           f"[n_layers, n_heads] = [{n_layers}, {n_heads}]")


def _zero_pruned(keep: Tensor):
    def fn(z: Float[Tensor, "batch pos n_heads d_head"], hook: Any) -> Tensor:
        # masked_fill, not z * mask: exactly +0.0 even where z is inf or NaN.
        return z.masked_fill(~keep.to(z.device)[None, None, :, None], 0.0)
    return fn


def apply_head_mask(model: Any, mask: Any) -> None:
    """Hold the heads that ``mask`` prunes at zero on ``model`` (replacing a mask applied before).

    ``mask=None`` removes a mask this function applied. Layers with every head kept get no hook.
    """
    old = getattr(model, _HANDLES, [])
    for handle in old:
        handle.hook.remove()
    if old:
        for point in getattr(model, "hook_dict", {}).values():
            point.fwd_hooks = [h for h in point.fwd_hooks if all(h is not o for o in old)]
    object.__setattr__(model, _HANDLES, [])
    object.__setattr__(model, _MASK, None)
    if mask is None:
        return
    mask = normalize_head_mask(mask)
    cfg = model.cfg
    check_head_mask_shape(mask, cfg.n_layers, cfg.n_heads)
    handles = []
    for layer, row in enumerate(mask):
        if all(row):
            continue
        hook_z = model.hook_dict[f"blocks.{layer}.attn.hook_z"]
        keep = torch.tensor(row, dtype=torch.bool)
        handles.append(hook_z.add_hook(_zero_pruned(keep), dir="fwd", is_permanent=True))
    object.__setattr__(model, _HANDLES, handles)
    object.__setattr__(model, _MASK, mask)


def head_mask_of(model: nn.Module) -> tuple[tuple[int, ...], ...] | None:
    """The mask :func:`apply_head_mask` put on ``model`` (None: no head is held at zero)."""
    return getattr(model, _MASK, None)
