"""The key/value cache incremental decoding writes into (one entry per layer, plus the padding mask).

Storage is preallocated and written in place (litgpt's ``KVCache.index_copy_``), not grown by
``torch.cat``: a cat copies the whole cache at every step, so decoding n tokens moves O(n^2) bytes
and every step allocates. Here a step writes only its own keys and values into
``storage[:, :, length:length + new]`` and attention reads the view ``storage[:, :, :length + new]``.
When the caller knows the final length (``generate`` does: prompt + new tokens) the storage is
allocated once at that ``capacity``; otherwise it doubles when full, which keeps the copying
amortized O(1) per token. The cache is for inference (``torch.no_grad``): an in-place write into a
tensor that autograd saved would invalidate it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import torch
from torch import Tensor

from harness._checks import check_int
from harness.errors import AttnlabError

__all__ = ["KVCache", "KVCacheEntry", "grown"]


def grown(storage: Optional[Tensor], like: Tensor, used: int, needed: int, capacity: Optional[int],
          dim: int) -> Tensor:
    """``storage`` with room for ``needed`` entries along ``dim``: itself, or a larger copy of its ``used`` part.

    New storage has ``like``'s shape, dtype and device but for ``dim``; it holds ``capacity`` entries
    when that suffices, else twice what it held (at least ``needed``).
    """
    have = 0 if storage is None else storage.shape[dim]
    if needed <= have:
        return storage  # type: ignore[return-value]  # have > 0, so storage is a tensor
    size = capacity if capacity is not None and capacity >= needed else max(needed, 2 * have)
    shape = list(like.shape)
    shape[dim] = size
    fresh = like.new_zeros(shape)
    if storage is not None and used:
        fresh.narrow(dim, 0, used).copy_(storage.narrow(dim, 0, used))
    return fresh


class KVCacheEntry:
    """Rotated keys and values of one layer: storage ``[batch, n_heads, capacity, d_head]``, ``length`` used."""

    def __init__(self, capacity: Optional[int] = None) -> None:
        self.capacity = capacity
        self.k_storage: Optional[Tensor] = None
        self.v_storage: Optional[Tensor] = None
        self.length = 0

    @property
    def k(self) -> Optional[Tensor]:
        return None if self.k_storage is None else self.k_storage[:, :, :self.length]

    @property
    def v(self) -> Optional[Tensor]:
        return None if self.v_storage is None else self.v_storage[:, :, :self.length]

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k, v [batch, n_heads, new, d_head]`` after the cached ones; the keys and values so far."""
        start, new = self.length, k.shape[2]
        self.k_storage = grown(self.k_storage, k, start, start + new, self.capacity, dim=2)
        self.v_storage = grown(self.v_storage, v, start, start + new, self.capacity, dim=2)
        index = torch.arange(start, start + new, device=k.device)
        self.k_storage.index_copy_(2, index, k)
        self.v_storage.index_copy_(2, index, v)
        self.length = start + new
        return self.k_storage[:, :, :self.length], self.v_storage[:, :, :self.length]


class KVCache:
    """Keys and values of every layer plus the padding mask seen so far.

    ``capacity``: the most tokens (padding included) the cache will hold, when known; the storage
    is then allocated once. Without it (or past it) storage doubles as needed.
    """

    def __init__(self, n_layers: int, capacity: Optional[int] = None):
        check_int("n_layers", n_layers, 1)
        check_int("capacity", capacity, 1, none_ok=True)
        self.capacity = capacity
        self.layers = [KVCacheEntry(capacity) for _ in range(n_layers)]
        self.length = 0
        self._mask: Optional[Tensor] = None  # bool storage [batch, capacity]; None = every token real so far

    def prefix(self, length: int, *, repeat: int = 1, layers: Optional[Iterable[int]] = None) -> KVCache:
        """A new cache holding this one's first ``length`` tokens, every row repeated ``repeat`` times (copy ``i``
        is rows ``i * batch .. (i + 1) * batch``), in ``layers`` (default every layer; the others stay empty, for
        a pass that starts after them with ``start_at_layer``). Its storage has this cache's room, so a pass that
        continues the sequence writes its own keys and values in place."""
        check_int("length", length, 1)
        check_int("repeat", repeat, 1)
        if length > self.length:
            raise AttnlabError(f"length={length} is past the {self.length} cached tokens: expected at most "
                               f"{self.length}")
        out = KVCache(len(self.layers), capacity=self.capacity)
        for layer in range(len(self.layers)) if layers is None else layers:
            src, dst = self.layers[layer], out.layers[layer]
            if src.k_storage is None or src.v_storage is None:
                raise AttnlabError(f"layer {layer} of the cache holds no keys: expected a cache a full pass wrote")
            dst.k_storage, dst.v_storage = (_repeated(t, length, repeat) for t in (src.k_storage, src.v_storage))
            dst.length = length
        if self._mask is not None:
            out._mask = self._mask.repeat(repeat, 1)
        out.length = length
        return out

    @property
    def mask(self) -> Optional[Tensor]:
        """The padding mask of the cached tokens, ``bool [batch, length]`` (None: every one is real)."""
        return None if self._mask is None else self._mask[:, :self.length]

    def key_mask(self, new: Optional[Tensor], batch: int, q: int, device: torch.device) -> Optional[Tensor]:
        """Record the new tokens' mask (``bool [batch, q]`` or None = all real); the mask of every key so far.

        Returns ``bool [batch, length + q]``, or None while every token ever seen is real.
        """
        if new is None and self._mask is None:
            return None
        if self._mask is None:  # the first padded tokens: every earlier one was real
            self._mask = grown(None, torch.ones(batch, 1, dtype=torch.bool, device=device), 0,
                               self.length + q, self.capacity, dim=1)
            self._mask[:, :self.length] = True
        else:
            self._mask = grown(self._mask, self._mask, self.length, self.length + q, self.capacity, dim=1)
        self._mask[:, self.length:self.length + q] = True if new is None else new
        return self._mask[:, :self.length + q]


def _repeated(storage: Tensor, length: int, repeat: int) -> Tensor:
    """``storage [batch, n_heads, room, d_head]`` as ``repeat`` stacked copies of its first ``length`` tokens
    (the rest zeros), copied once, without an intermediate."""
    b, h, room, d = storage.shape
    out = storage.new_zeros(repeat * b, h, room, d)
    out.view(repeat, b, h, room, d)[:, :, :, :length].copy_(storage[None, :, :, :length])
    return out
