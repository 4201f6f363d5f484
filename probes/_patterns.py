"""Streaming attention patterns (``hook_pattern``) or head outputs (``hook_z``) chunk by chunk.

The pattern probes never hold more than one chunk's patterns: a chunk's size is chosen so that
every layer's ``[batch, n_heads, query_pos, key_pos]`` pattern together stays near
``PATTERN_ELEMENTS`` floats.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import torch
from torch import Tensor

from harness.adapters.protocol import ProtocolModel
from harness.errors import AttnlabError
from probes import gates
from probes._validate import ModelInfo, ProbeData, pattern_hook, z_hook

PATTERN_ELEMENTS = 2 ** 24  # 64 MiB of float32 per chunk


def chunk_rows(info: ModelInfo, pos: int, batch_size: Optional[int]) -> int:
    if batch_size is not None:
        return batch_size
    return max(1, PATTERN_ELEMENTS // (info.n_layers * info.n_heads * pos * pos))


def _capture(seen: dict[int, Tensor], layer: int):
    def fn(x: Tensor, hook: Any) -> None:
        seen[layer] = x.detach().float()
    return fn


def stream(model: ProtocolModel, info: ModelInfo, data: ProbeData, *, what: str = "pattern",
           batch_size: Optional[int] = None, layers: Optional[list[int]] = None
           ) -> Iterator[tuple[slice, list[Tensor]]]:
    """Yield ``(rows, per-layer tensors)``: patterns ``[b, n_heads, q, k]`` or ``hook_z`` ``[b, pos, n_heads, d_head]``,
    for ``layers`` in that order (default every layer). Each pass ends at the last layer asked for."""
    name = pattern_hook if what == "pattern" else z_hook
    wanted = list(range(info.n_layers)) if layers is None else layers
    rows = chunk_rows(info, data.pos, batch_size) if what == "pattern" else gates.rows_per_pass(batch_size, data.pos)
    with gates.eval_mode(model):
        for s in range(0, data.n, rows):
            sl = slice(s, min(s + rows, data.n))
            seen: dict[int, Tensor] = {}
            hooks = [(name(layer), _capture(seen, layer)) for layer in wanted]
            am = None if data.attention_mask is None else data.attention_mask[sl]
            with torch.no_grad():
                # nothing after the last pattern asked for is needed: that layer's output, the later layers
                # and the unembedding are skipped
                gates.hooked_pass(model, info, data.tokens[sl], am, hooks, until=name(max(wanted)))
            missing = [layer for layer in wanted if layer not in seen]
            if missing:
                hook = name(0).replace("blocks.0.", "blocks.{l}.")
                raise AttnlabError(f"the pass wrote no {what} for layer(s) {missing}: expected {hook} to fire "
                                   f"in every layer asked for")
            yield sl, [seen[layer] for layer in wanted]


def informative_queries(info: ModelInfo, real: Tensor) -> Tensor:
    """bool ``[b, q]``: real queries that can see at least two real keys.

    A causal model's first real query sees only itself, so its pattern is 1 on one key whatever
    the head does; counting it would make every head look alike and saturated.
    """
    visible = real.long().cumsum(-1) if info.causal else real.long().sum(-1, keepdim=True).expand_as(real)
    return real & (visible >= 2)
