"""Cross-attention and the decoder block of an encoder-decoder (Vaswani et al. 2017 §3.2.3, Fig. 1).

"In encoder-decoder attention layers, the queries come from the previous decoder layer, and the memory
keys and values come from the output of the encoder." So a decoder query may look at every *real*
source position (the encoder's padding is masked out of the keys) and at no target position: cross-
attention has no causal mask and, as in the paper, T5 and BART, no positional term of its own. Its keys
and values depend on the source only, so during generation they are computed once, at the first step,
and kept in the cache (:class:`CrossCacheEntry`); later steps read them and fire no ``hook_k``/``hook_v``.
Shapes use the legend in harness/model/transformer.py (``src_pos``: positions of the source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, cast

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from harness.model.config import ModelConfig
from harness.model.hooks import active, hook
from harness.model.kv_cache import KVCacheEntry
from harness.model.layers import AttnContext, Block, Norm


@dataclass
class CrossInput:
    """What every decoder layer's cross-attention reads in one forward pass."""

    memory: Optional[Tensor]  # [batch, src_pos, d_model] encoder output; None when the cache holds every K/V
    allowed: Optional[Tensor]  # bool [batch, 1, 1, src_pos], True on real source keys; None: no padding


@dataclass
class CrossContext(AttnContext):
    """The decoder's self-attention context plus the cross-attention input."""

    cross: Optional[CrossInput] = None


class CrossCacheEntry(KVCacheEntry):
    """A decoder layer's cache: self-attention keys/values, plus cross-attention's, written once."""

    def __init__(self, capacity: Optional[int] = None) -> None:
        super().__init__(capacity)
        self.cross_k: Optional[Tensor] = None  # [batch, n_heads, src_pos, d_head]
        self.cross_v: Optional[Tensor] = None


class CrossAttention(nn.Module):
    """Multi-head attention of decoder queries over the encoder's output (§3.2.3); GQA as in ``Attention``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        H, Hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cast(int, cfg.d_head), cfg.d_model  # d_head resolved
        self.n_heads, self.n_kv, self.d_head = H, Hkv, dh
        self.q = nn.Linear(d, H * dh, bias=cfg.attn_bias, dtype=dtype)
        self.kv = nn.Linear(d, 2 * Hkv * dh, bias=cfg.attn_bias, dtype=dtype)  # one matmul over the memory
        self.o = nn.Linear(H * dh, d, bias=cfg.attn_bias, dtype=dtype)
        self.scale = 1.0 / math.sqrt(dh) if cfg.use_attn_scale else 1.0  # §3.2.1, as in self-attention
        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_k = HookPoint()  # [batch, src_pos, n_heads, d_head] (only when computed, not read from a cache)
        self.hook_v = HookPoint()  # [batch, src_pos, n_heads, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, n_heads, query_pos, src_pos]
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, src_pos]
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]

    def keys_values(self, memory: Float[Tensor, "batch src_pos d_model"]) -> tuple[Tensor, Tensor]:
        """K and V ``[batch, n_heads, src_pos, d_head]`` of the memory, through ``hook_k``/``hook_v``."""
        b, s, _ = memory.shape
        k, v = self.kv(memory).view(b, s, 2, self.n_kv, self.d_head).unbind(2)
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=2)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=2)
        return hook(self.hook_k, k).transpose(1, 2), hook(self.hook_v, v).transpose(1, 2)

    def forward(self, x: Float[Tensor, "batch pos d_model"], cross: CrossInput,
                cache: Optional[KVCacheEntry] = None) -> Float[Tensor, "batch pos d_model"]:
        b, p, _ = x.shape
        q = hook(self.hook_q, self.q(x).view(b, p, self.n_heads, self.d_head)).transpose(1, 2)
        slot = cache if isinstance(cache, CrossCacheEntry) else None
        if slot is not None and slot.cross_k is not None:
            k, v = slot.cross_k, cast(Tensor, slot.cross_v)  # computed at the first step, read ever after
        else:
            if cross.memory is None:
                raise RuntimeError("cross-attention has neither the encoder output nor cached keys and values")
            k, v = self.keys_values(cross.memory)
            if slot is not None:
                slot.cross_k, slot.cross_v = k, v
        if active(self.hook_attn_scores) or active(self.hook_pattern):
            scores = (q @ k.transpose(-1, -2)) * self.scale
            if cross.allowed is not None:
                scores = scores.masked_fill(~cross.allowed, float("-inf"))
            scores = hook(self.hook_attn_scores, scores)
            z = hook(self.hook_pattern, torch.softmax(scores, dim=-1)) @ v
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=cross.allowed, scale=self.scale)
        z = hook(self.hook_z, z.transpose(1, 2))  # [batch, pos, n_heads, d_head]
        return self.o(z.reshape(b, p, self.n_heads * self.d_head))


class DecoderBlock(Block):
    """A decoder layer: causal self-attention, then cross-attention over the encoder, then the MLP (Fig. 1).

    Pre-norm: ``x + CrossAttn(ln_cross(x))`` between ``hook_resid_mid`` and ``hook_resid_mid2``;
    post-norm ("Add & Norm", §3.1): ``ln_cross(x + CrossAttn(x))``.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__(cfg, dtype)
        if not hasattr(self, "hook_resid_mid"):  # attn_only blocks have none; cross-attention needs it
            self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.ln_cross = Norm(cfg, dtype) if cfg.normalization_type is not None else nn.Identity()
        self.cross_attn = CrossAttention(cfg, dtype)
        self.hook_cross_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid2 = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"], ctx: AttnContext, cache: Optional[KVCacheEntry] = None
                ) -> Float[Tensor, "batch pos d_model"]:
        cross = cast(CrossContext, ctx).cross
        if cross is None:
            raise RuntimeError("a decoder block ran without a cross-attention input (EncoderDecoder.forward sets it)")
        x = hook(self.hook_resid_pre, x)
        if self.pre:
            x = hook(self.hook_resid_mid, x + hook(self.hook_attn_out, self.attn(self.ln1(x), ctx, cache)))
            x = x + hook(self.hook_cross_attn_out, self.cross_attn(self.ln_cross(x), cross, cache))
            x = hook(self.hook_resid_mid2, x)
            if not self.attn_only:
                x = x + hook(self.hook_mlp_out, self.mlp(self.ln2(x)))
            return hook(self.hook_resid_post, x)
        x = hook(self.hook_resid_mid, self.ln1(x + hook(self.hook_attn_out, self.attn(x, ctx, cache))))
        x = self.ln_cross(x + hook(self.hook_cross_attn_out, self.cross_attn(x, cross, cache)))
        x = hook(self.hook_resid_mid2, x)
        if not self.attn_only:
            x = self.ln2(x + hook(self.hook_mlp_out, self.mlp(x)))
        return hook(self.hook_resid_post, x)
