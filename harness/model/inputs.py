"""Validation of a forward pass's inputs: the one set of checks the model, the adapters and the probes call.

Each check raises before any compute with a message naming the value and what was expected, in one
wording whichever entry (``Transformer.forward``, an adapter's ``forward``, a probe) received it.
"""

from __future__ import annotations

from typing import Optional, cast

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from harness._checks import check_int
from harness.errors import AttnlabError, AttnlabTypeError

__all__ = ["check_tokens", "check_mask", "check_offset", "check_inputs", "check_table_positions", "check_source",
           "check_partial_run"]


def check_tokens(tokens: object, d_vocab: int, *, min_pos: int = 1) -> None:
    """Token ids ``[batch, pos]`` of an integer dtype in ``[0, d_vocab)``, with at least ``min_pos`` positions."""
    if not isinstance(tokens, Tensor):
        raise AttnlabTypeError(f"tokens must be a torch.Tensor of token ids [batch, pos], got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise AttnlabError(f"tokens have dtype {tokens.dtype}: expected an integer dtype (token ids, e.g. torch.long)")
    if tokens.ndim != 2:
        raise AttnlabError(f"tokens have shape {tuple(tokens.shape)} (rank {tokens.ndim}): expected rank 2 "
                           f"[batch, pos]")
    if tokens.shape[0] < 1 or tokens.shape[1] < min_pos:
        raise AttnlabError(f"tokens have shape {tuple(tokens.shape)}: expected at least 1 sequence and {min_pos} "
                           f"position(s)")
    if torch.compiler.is_compiling():
        return  # value checks force a host sync and a graph break; eager calls check them
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= d_vocab:
        raise AttnlabError(f"token id {lo if lo < 0 else hi} is out of range: expected ids in [0, {d_vocab}) "
                           f"(d_vocab)")


def check_mask(mask: object, batch: int, pos: int, *, name: str = "attention_mask"
               ) -> Optional[Bool[Tensor, "batch pos"]]:
    """``None`` or a bool ``[batch, pos]`` mask, from bool or integer 0/1 (``attention_mask``: 1 real, 0 padding)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise AttnlabTypeError(f"{name} must be a torch.Tensor [batch, pos] = {(batch, pos)}, got "
                               f"{type(mask).__name__}")
    if tuple(mask.shape) != (batch, pos):
        raise AttnlabError(f"{name} has shape {tuple(mask.shape)}: expected [batch, pos] = {(batch, pos)}, the "
                           f"shape of tokens")
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise AttnlabError(f"{name} has dtype {mask.dtype}: expected bool or integer 0/1")
    if mask.dtype != torch.bool:
        bad = mask[(mask != 0) & (mask != 1)]
        if bad.numel():
            raise AttnlabError(f"{name} holds the value {int(bad[0])}: expected only 0 and 1")
        mask = mask.bool()
    return mask


def check_offset(position_offset: object) -> int:
    """A position offset: an integer >= 0."""
    return check_int("position_offset", position_offset, 0)


def check_inputs(tokens: object, attention_mask: object, position_offset: object, d_vocab: int
                 ) -> tuple[Int[Tensor, "batch pos"], Optional[Bool[Tensor, "batch pos"]], int]:
    """The protocol forward's three arguments checked: ``(tokens, bool mask or None, offset)``."""
    offset = check_offset(position_offset)
    check_tokens(tokens, d_vocab)
    ids = cast(Tensor, tokens)  # check_tokens raised for anything else
    return ids, check_mask(attention_mask, *ids.shape), offset


def check_table_positions(positions: Int[Tensor, "*batch"], n_ctx: int, detail: str = "") -> None:
    """Positions that read a learned table of ``n_ctx`` rows are < n_ctx (``detail`` says where they came from)."""
    last = int(positions.max())
    if last >= n_ctx:
        raise AttnlabError(f"position {last}{detail} is past the learned position table: expected positions "
                           f"< n_ctx={n_ctx}")


def check_source(source_tokens: object, source_mask: object, batch: int, d_vocab: int
                 ) -> Optional[Bool[Tensor, "batch src_pos"]]:
    """An encoder-decoder's source: ids ``[batch, src_pos]`` (one row per row of ``tokens``) and ``None`` or a
    0/1 ``source_mask`` of that shape with at least one real token per row; returns the mask as bool."""
    check_tokens(source_tokens, d_vocab)
    ids = cast(Tensor, source_tokens)  # check_tokens raised for anything else
    if ids.shape[0] != batch:
        raise AttnlabError(f"source_tokens have {ids.shape[0]} rows: expected {batch}, one per row of tokens")
    mask = check_mask(source_mask, *ids.shape, name="source_mask")
    if mask is not None and not bool(mask.any(-1).all()):
        row = int((~mask.any(-1)).nonzero()[0])
        raise AttnlabError(f"source_mask row {row} has no real token: expected at least one per row")
    return mask


def check_partial_run(tokens: object, start_at_layer: object, stop_at_layer: object, n_layers: int,
                      d_model: int) -> None:
    """TransformerLens-style partial runs: ``start_at_layer``/``stop_at_layer`` are None or integers in
    ``[0, n_layers]``, and with ``start_at_layer`` the input is a float residual stream ``[batch, pos, d_model]``
    (attnlab's Transformer and HFAdapter take them alike)."""
    for name, value in (("start_at_layer", start_at_layer), ("stop_at_layer", stop_at_layer)):
        check_int(name, value, 0, n_layers, none_ok=True, expected=f"an integer in [0, {n_layers}]")
    if start_at_layer is None:
        return
    if not isinstance(tokens, Tensor) or tokens.ndim != 3 or tokens.shape[-1] != d_model \
            or not tokens.dtype.is_floating_point:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise AttnlabError(f"with start_at_layer, the input {shape} must be a float residual stream "
                           f"[batch, pos, d_model={d_model}]")
