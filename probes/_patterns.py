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
from probes._validate import ModelInfo, ProbeData

PATTERN_ELEMENTS = 2 ** 24  # 64 MiB of float32 per chunk


def chunk_rows(info: ModelInfo, pos: int, batch_size: Optional[int]) -> int:
    if batch_size is not None:
        return batch_size
    return max(1, PATTERN_ELEMENTS // (info.n_layers * info.n_heads * pos * pos))


def _capture(seen: dict[int, Tensor], row: int):
    def fn(x: Tensor, hook: Any) -> None:
        seen[row] = x.detach().float()
    return fn


def stream(model: ProtocolModel, info: ModelInfo, data: ProbeData, *, what: str = "pattern",
           batch_size: Optional[int] = None, rows: Optional[list[int]] = None
           ) -> Iterator[tuple[slice, list[Tensor]]]:
    """Yield ``(sequences, per-row tensors)``: patterns ``[b, n_heads, q, k]`` or ``hook_z`` ``[b, pos, n_heads,
    d_head]``, for the mask ``rows`` in that order (default every row: every layer of a decoder-only model, each
    stack's layers of an encoder-decoder read with ``model_info(all_heads=True)``, given the data's source). Each
    pass ends at the last hook asked for."""
    names = info.pattern_hooks if what == "pattern" else info.z_hooks
    wanted = list(range(info.n_layers)) if rows is None else rows
    longest = max(data.pos, data.source_real().shape[1]) if info.encoder_decoder else data.pos
    step = chunk_rows(info, longest, batch_size) if what == "pattern" else gates.rows_per_pass(batch_size, data.pos)
    last = names[info.fires_last(wanted)]
    with gates.eval_mode(model):
        for s in range(0, data.n, step):
            sl = slice(s, min(s + step, data.n))
            seen: dict[int, Tensor] = {}
            hooks = [(names[row], _capture(seen, row)) for row in wanted]
            am = None if data.attention_mask is None else data.attention_mask[sl]
            with torch.no_grad():
                # nothing after the last pattern asked for is needed: that layer's output, the later layers
                # and the unembedding are skipped
                gates.hooked_pass(model, info, data.tokens[sl], am, hooks, source=data.source(sl), until=last)
            missing = [row for row in wanted if row not in seen]
            if missing:
                raise AttnlabError(f"the pass wrote no {what} for layer(s) {_named(info, missing)}: expected "
                                   f"{_hooks(info, names, missing)} to fire in every layer asked for")
            yield sl, [seen[row] for row in wanted]


def _named(info: ModelInfo, rows: list[int]) -> list:
    return [info.row_name(r) for r in rows] if info.kinds else rows


def _hooks(info: ModelInfo, names: tuple[str, ...], rows: list[int]) -> str:
    if info.kinds:
        return ", ".join(names[r] for r in rows)
    return names[rows[0]].replace(f"blocks.{rows[0]}.", "blocks.{l}.")
