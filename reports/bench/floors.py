"""The floor of each peer task: the least work that gives its numbers, as plain calls of the same model.

The peers (reports/bench/peers.py) say how attnlab compares with what a user would pick instead; a floor
says how much of attnlab's time is the work itself. Each floor calls the converted Transformer directly
(TransformerLens-style ``hooks(fwd_hooks=...)``, ``start_at_layer``/``stop_at_layer``, the model's own
``KVCache``): none of the probes' batching, validation or bookkeeping, and none of their savings beyond the
one the floor names, so attnlab's time over the floor's is the price of its machinery (goal: <= 1.15 for
pattern caching, <= 1.3 for the two loops). The floors' numbers must equal attnlab's to 1e-4 before any timing.

- patterns: one forward of the layers with a hook on every ``hook_pattern`` (which switches each layer to the
  explicit softmax path, so the patterns are materialised) and no unembedding (no pattern needs it);
- leave-one-out: one forward of the layers keeping the residual entering each, the unembedding and loss once
  for the baseline, then 144 forwards each starting at its head's layer from that residual with the head's
  ``hook_z`` slice zeroed (145 plain forwards with prefix reuse);
- residual patching: the corrupted run keeping every layer's residual and keys and values, then one forward
  per (layer, position) that starts at the layer and at the position, from the corrupted keys and values of
  the positions before it (a causal model's earlier positions cannot change): the recompute-only-what-changes
  floor, one cell per pass, where attnlab groups nearby positions into one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from harness.model import KVCache


def loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """The next-token loss every contender's leave-one-out reads (a float32 mean over all positions)."""
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def answer_logprob(logits: Tensor, answer: int) -> Tensor:
    """The patching metric: the answer's log-probability at the last position (log-probabilities, because the
    bridge's compatibility mode may shift each position's logits by a constant), averaged over the batch."""
    return logits[:, -1].float().log_softmax(-1)[:, answer].mean()


class Floor:
    """Plain calls of attnlab's converted model (the one the ``Attnlab`` contender probes)."""

    name = "floor"

    def __init__(self, model: Any, answer: int):  # attnlab's Transformer (a HookedRootModule)
        self.model, self.answer = model, answer
        self.n_layers, self.n_heads = model.cfg.n_layers, model.cfg.n_heads

    def patterns(self, tokens: Tensor) -> Tensor:
        saved: list[Tensor] = []
        hooks = [(f"blocks.{layer}.attn.hook_pattern", lambda t, hook: saved.append(t))
                 for layer in range(self.n_layers)]
        with torch.no_grad(), self.model.hooks(fwd_hooks=hooks):
            self.model(tokens, stop_at_layer=self.n_layers)
        return torch.stack(saved)

    def _residuals(self, tokens: Tensor, **kw: Any) -> tuple[Tensor, list[Tensor]]:
        """The logits and the residual entering every layer, from one forward."""
        resid: list[Tensor] = []
        hooks = [(f"blocks.{layer}.hook_resid_pre", lambda t, hook: resid.append(t.clone()))
                 for layer in range(self.n_layers)]
        with self.model.hooks(fwd_hooks=hooks):
            logits = self.model(tokens, **kw)
        return logits, resid

    def loo_ablation(self, tokens: Tensor) -> Tensor:
        out = torch.empty(self.n_layers, self.n_heads, dtype=torch.float64)
        with torch.no_grad():
            logits, resid = self._residuals(tokens)
            base = float(loss(logits, tokens))
            for layer in range(self.n_layers):
                for head in range(self.n_heads):
                    def ablate(z: Tensor, hook: Any, head: int = head) -> Tensor:
                        z[:, :, head] = 0
                        return z
                    with self.model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate)]):
                        logits = self.model(resid[layer], start_at_layer=layer)
                    out[layer, head] = float(loss(logits, tokens)) - base
        return out

    def resid_patching(self, clean: Tensor, corrupted: Tensor, positions: Sequence[int]) -> Tensor:
        out = torch.empty(self.n_layers, len(positions), dtype=torch.float64)
        with torch.no_grad():
            _, clean_resid = self._residuals(clean, stop_at_layer=self.n_layers)
            cache = KVCache(self.n_layers, capacity=corrupted.shape[1])
            _, resid = self._residuals(corrupted, kv_cache=cache)
            for layer in range(self.n_layers):
                for i, p in enumerate(positions):
                    x = resid[layer][:, p:].clone()
                    x[:, 0] = clean_resid[layer][:, p]
                    prefix = cache.prefix(p, layers=range(layer, self.n_layers)) if p else None
                    logits = self.model(x, start_at_layer=layer, kv_cache=prefix)
                    out[layer, i] = float(answer_logprob(logits, self.answer))
        return out
