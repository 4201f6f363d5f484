"""TransformerLens #1609 as a user meets it: their own function around a ``TransformerBridge``.

The bug lived in ``TransformerBridge.forward`` when a caller passed an ``attention_mask`` and no
``position_ids`` (the documented call), so it cannot be seen through ``BridgeAdapter``, which always
passes positions. Here the user's function passes only the mask, as the bridge's docs show, and
explicit positions only when it must shift them (``position_offset``); the suite sees it as a
plain function with a config (``FunctionModel``): the output-level properties run on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Optional
from unittest import mock

import torch
from torch import Tensor

from harness.adapters import BridgeAdapter, FunctionModel


def bridge_function_model(hf_model: torch.nn.Module) -> FunctionModel:
    bridge = BridgeAdapter.from_hf(hf_model).bridge
    c = bridge.cfg

    def forward(tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0) -> Tensor:
        if position_offset:
            mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
            positions = position_offset + (mask.long().cumsum(-1) - 1).clamp(min=0)
            return bridge(tokens, attention_mask=mask, position_ids=positions)
        return bridge(tokens, attention_mask=attention_mask)

    cfg = dict(n_layers=c.n_layers, n_heads=c.n_heads, d_head=c.d_head, d_model=c.d_model, d_vocab=c.d_vocab,
               n_ctx=c.n_ctx, positional_embedding_type="standard", attention_dir="causal")
    return FunctionModel(forward, cfg)


@contextlib.contextmanager
def mask_blind_positions() -> Iterator[None]:
    """Revert the fix of TransformerLens #1609 (PR #1610): the bridge no longer derives positions from the mask."""
    from transformer_lens.model_bridge.transformer_bridge import TransformerBridge

    with mock.patch.object(TransformerBridge, "_accepts_derived_position_ids", lambda self: False):
        yield


@torch.no_grad()
def left_pad_moves_logits(build, patch) -> str:
    """The bridge's logits for a left-padded prompt against the same prompt unpadded (the issue's own measure)."""
    x = torch.tensor([[5, 9, 3, 7]])
    padded, mask = torch.tensor([[0, 5, 9, 3, 7]]), torch.tensor([[0, 1, 1, 1, 1]])

    def drift() -> float:
        model = bridge_function_model(build())
        return float((model(padded, attention_mask=mask)[:, 1:] - model(x)).abs().max())

    clean = drift()
    assert clean < 1e-4, f"the unpatched bridge already moves by {clean:.3g} under one left pad"
    with patch():
        seen = drift()
    assert seen > 1e-2, "the patch leaves left-padded logits unchanged"
    return f"one left pad moves the bridge's logits by {seen:.3g} (unpatched {clean:.1g})"
