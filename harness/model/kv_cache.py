"""The key/value cache incremental decoding appends to (one entry per layer, plus the padding mask)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["KVCache", "KVCacheEntry"]


class KVCacheEntry:
    """Rotated keys and values of one layer, ``[batch, n_heads, t, d_head]``."""

    def __init__(self) -> None:
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is not None and self.v is not None:
            k = torch.cat((self.k, k), dim=2)
            v = torch.cat((self.v, v), dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Keys and values of every layer plus the padding mask seen so far."""

    def __init__(self, n_layers: int):
        self.layers = [KVCacheEntry() for _ in range(n_layers)]
        self.length = 0
        self.mask: Optional[Tensor] = None  # bool [batch, length]; None = every token real
