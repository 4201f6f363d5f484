"""Validation of a forward pass's inputs, shared by the model and by generation.

Each check raises before any compute with a message naming the value and what was expected.
"""

from __future__ import annotations

from typing import Optional

import torch
from jaxtyping import Bool
from torch import Tensor

from harness._checks import check_int
from harness.errors import AttnlabError, AttnlabTypeError

__all__ = ["check_tokens", "check_mask", "check_offset"]


def check_tokens(tokens: object, d_vocab: int) -> None:
    """Token ids ``[batch, pos]`` of an integer dtype in ``[0, d_vocab)``, else ValueError/TypeError."""
    if not isinstance(tokens, Tensor):
        raise AttnlabTypeError(f"tokens must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise AttnlabError(f"tokens have dtype {tokens.dtype}: expected an integer dtype (token ids)")
    if tokens.ndim != 2:
        raise AttnlabError(f"tokens have shape {tuple(tokens.shape)}: expected 2-D [batch, pos]")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise AttnlabError(f"tokens have shape {tuple(tokens.shape)}: "
                           "expected at least one sequence and one position")
    if torch.compiler.is_compiling():
        return  # value checks force a host sync and a graph break; eager calls check them
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= d_vocab:
        bad = lo if lo < 0 else hi
        raise AttnlabError(f"token id {bad} is out of range: expected ids in [0, {d_vocab}) (d_vocab)")

def check_mask(attention_mask: object, batch: int, pos: int) -> Optional[Bool[Tensor, "batch pos"]]:
    """``None`` or a bool ``[batch, pos]`` mask (1 real, 0 padding), from bool or integer 0/1."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise AttnlabTypeError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask.shape != (batch, pos):
        raise AttnlabError(f"attention_mask has shape {tuple(attention_mask.shape)}: expected "
                           f"[batch, pos] = {(batch, pos)}")
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise AttnlabError(f"attention_mask has dtype {attention_mask.dtype}: expected bool or integer 0/1")
    if attention_mask.dtype != torch.bool:
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise AttnlabError("attention_mask has values other than 0 and 1: "
                               "expected 1 for real tokens, 0 for padding")
        attention_mask = attention_mask.bool()
    return attention_mask

def check_offset(position_offset: object) -> int:
    """A position offset: an integer >= 0."""
    return check_int("position_offset", position_offset, 0)
