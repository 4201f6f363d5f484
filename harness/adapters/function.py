"""A plain ``nn.Module`` or function behind the model protocol: forward only, no hook points.

The output-level properties (causal outputs, padding outputs, batch independence, permutation
equivariance, relative position, KV cache) need nothing but ``forward``, so they can judge a
user's own model that knows nothing of TransformerLens; every hook-level property reports
*unobservable* on it. ``cfg`` is a mapping or an object with the protocol's fields
(``n_layers, n_heads, d_head, d_model, d_vocab, n_ctx, positional_embedding_type,
attention_dir``) and any declared design fields (see :class:`harness.adapters.design_facts.DesignFacts`).

    >>> model = FunctionModel(my_module, dict(n_layers=2, n_heads=4, d_head=8, d_model=32,
    ...     d_vocab=100, n_ctx=64, positional_embedding_type="rotary", attention_dir="causal"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, Optional

from torch import Tensor, nn
from transformer_lens import HookedRootModule

from harness.errors import AttnlabTypeError


class FunctionModel(HookedRootModule):
    """``fn(tokens, attention_mask=None, position_offset=0) -> logits [batch, pos, d_vocab]`` with a ``cfg``.

    An ``nn.Module`` is registered as a submodule, so ``eval()``, ``parameters()`` and the device
    follow it. If the wrapped object has ``forward_with_cache`` (the optional cached-decoding
    method of the protocol), it is exposed too, so ``kv_cache`` can decode through it.
    """

    def __init__(self, fn: Callable[..., Tensor], cfg: Any):
        super().__init__()
        if not callable(fn):
            raise AttnlabTypeError(f"FunctionModel expects a callable (an nn.Module or a function), got "
                                   f"{type(fn).__name__}")
        if cfg is None:
            raise AttnlabTypeError("FunctionModel needs cfg: a mapping or object with the protocol's cfg fields")
        if isinstance(fn, nn.Module):
            self.module = fn
        else:
            self._fn = fn
        self._cfg = SimpleNamespace(**cfg) if isinstance(cfg, Mapping) else cfg
        cached = getattr(fn, "forward_with_cache", None)
        if callable(cached):
            self.forward_with_cache = cached
        self.setup()

    @property
    def cfg(self) -> Any:
        return self._cfg

    @property
    def wrapped(self) -> Callable[..., Tensor]:
        return self.module if "module" in self._modules else self._fn

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0) -> Tensor:
        return self.wrapped(tokens, attention_mask=attention_mask, position_offset=position_offset)
