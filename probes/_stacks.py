"""An encoder-decoder's three stacks of heads, as the probes that read attention patterns see them.

Vaswani et al. 2017 (Fig. 1, §3.2.3): encoder self-attention reads the source (queries and keys are source
positions, no causal mask); decoder self-attention reads the decoder's input (causal); cross-attention lets the
decoder's queries read the encoder's output at the source's positions (no causal mask). So a head's pattern is
over other queries and keys in each stack, and which of its queries say anything differs too. A decoder-only
model has one stack, read as the decoder's. The rows of a head mask (``ModelInfo.kinds``) name the stacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from harness.model.seq2seq import DEFAULT_SOURCE_ID
from probes._validate import ModelInfo, ProbeData


@dataclass(frozen=True)
class Stack:
    """What the pattern ``[b, n_heads, q, k]`` of one mask row is over, for a chunk of the data."""

    query_tokens: Tensor  # [b, q]
    query_real: Tensor  # bool [b, q]
    key_tokens: Tensor  # [b, k]
    key_real: Tensor  # bool [b, k]
    causal: bool
    self_attention: bool  # queries and keys index one sequence, so their positions compare


def stack(info: ModelInfo, data: ProbeData, rows: slice, row: int) -> Stack:
    """The :class:`Stack` of mask row ``row`` over the data's sequences ``rows``."""
    tokens, real = data.tokens[rows], data.real()[rows]
    kind = info.kind(row)
    if kind in (None, "decoder"):
        return Stack(tokens, real, tokens, real, info.causal, True)
    source_real = data.source_real()[rows]
    source = data.source_tokens[rows] if data.source_tokens is not None else \
        torch.full(source_real.shape, DEFAULT_SOURCE_ID, dtype=torch.long, device=source_real.device)
    if kind == "encoder":
        return Stack(source, source_real, source, source_real, False, True)
    return Stack(tokens, real, source, source_real, False, False)


def informative(s: Stack) -> Tensor:
    """bool ``[b, q]``: real queries that can see at least two real keys.

    A query that sees one real key (a causal model's first query; any query over a one-token source) has
    pattern 1 on it whatever the head does; counting it would make every head look alike and saturated.
    """
    keys = s.key_real.long()
    visible = keys.cumsum(-1) if s.causal else keys.sum(-1, keepdim=True).expand(s.query_real.shape)
    return s.query_real & (visible >= 2)


def groups(info: ModelInfo, by: str) -> list[list[int]]:
    """Mask rows whose heads can be compared with each other, kind by kind in row order.

    ``by="pattern"``: rows of one kind (their patterns are distributions over the same keys, for the same
    queries); ``by="positions"``: rows whose outputs sit at the same positions (the encoder's at the source's,
    the decoder's and cross-attention's at the decoder's). A decoder-only view is one group."""
    if not info.kinds:
        return [list(range(info.n_layers))]
    key = (lambda r: info.kinds[r]) if by == "pattern" else (lambda r: info.kinds[r] == "encoder")
    out: dict[object, list[int]] = {}
    for r in range(info.n_layers):
        out.setdefault(key(r), []).append(r)
    return list(out.values())


def with_kinds(frame: pd.DataFrame, info: ModelInfo) -> pd.DataFrame:
    """An encoder-decoder's per-head frame (``layer`` holding mask rows): a leading ``kind`` column and ``layer``
    within each kind's stack; any other frame unchanged."""
    if info.kinds:
        rows = frame["layer"].to_numpy()
        frame["layer"] = [info.layers[r] for r in rows]
        frame.insert(0, "kind", [info.kinds[r] for r in rows])
    return frame
