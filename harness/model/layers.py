"""The pieces of a block: normalization, attention, MLP. Shapes use the legend in harness/model/transformer.py.

Idle hook points are skipped without a module call (:func:`harness.model.hooks.hook`), so an unhooked
forward costs what a plain PyTorch model costs; a hook on ``hook_attn_scores`` or
``hook_pattern`` switches that layer from ``scaled_dot_product_attention`` to the
explicit softmax path, which materializes the pattern.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
from harness.model.positions import apply_rotary


@dataclass
class AttnContext:
    """What every layer's attention needs, computed once per forward pass."""

    cos: Optional[Tensor]  # [batch|1, pos, 1, d_head] rotary, or None
    sin: Optional[Tensor]
    allowed: Optional[Tensor]  # bool [batch|1, 1, q, k], True where a query may attend; None: no mask
    is_causal: bool  # SDPA's is_causal flag (only when allowed is None)
    bias: Optional[Tensor]  # float [batch|1, n_heads, q, k] ALiBi bias, or None

    def explicit_mask(self, q: int, k: int, device: torch.device) -> Optional[Tensor]:
        if self.allowed is not None:
            return self.allowed
        if self.is_causal:
            return torch.ones(q, k, dtype=torch.bool, device=device).tril(k - q)[None, None]
        return None


class Norm(nn.Module):
    """LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019), TransformerLens-style hooks.

    LN: (x - mean) / sqrt(var + eps) * w + b;  RMS: x / sqrt(mean(x^2) + eps) * w.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.kind = cfg.normalization_type
        self.eps = cfg.eps
        self.d = cfg.d_model
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=dtype))
        if self.kind == "LN":
            self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=dtype))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if not (active(self.hook_scale) or active(self.hook_normalized)):
            if self.kind == "LN":
                return F.layer_norm(x, (self.d,), self.w, self.b, self.eps)
            return F.rms_norm(x, (self.d,), self.w, self.eps)
        if self.kind == "LN":
            x = x - x.mean(-1, keepdim=True)
        scale = hook(self.hook_scale, (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        out = x / scale * self.w
        if self.kind == "LN":
            out = out + self.b
        return hook(self.hook_normalized, out)


class Attention(nn.Module):
    """Multi-head (or grouped-query) scaled dot-product attention, Vaswani et al. 2017 §3.2.

    Q, K and V come from one fused projection (one matmul instead of three);
    TransformerLens-layout weights (``W_Q [n_heads, d_model, d_head]`` ...) are views of it.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        # cast: ModelConfig.__post_init__ resolves d_head (None = d_model // n_heads)
        H, Hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cast(int, cfg.d_head), cfg.d_model
        self.n_heads, self.n_kv, self.d_head = H, Hkv, dh
        self.qkv = nn.Linear(d, (H + 2 * Hkv) * dh, bias=cfg.attn_bias, dtype=dtype)
        self.o = nn.Linear(H * dh, d, bias=cfg.attn_bias, dtype=dtype)
        # §3.2.1: dot products grow like d_k, so scores are scaled by 1/sqrt(d_k).
        self.scale = 1.0 / math.sqrt(dh) if cfg.use_attn_scale else 1.0
        self.rotary = cfg.positional_embedding_type == "rotary"

        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_k = HookPoint()  # [batch, pos, n_heads, d_head] (K/V heads repeated for GQA)
        self.hook_v = HookPoint()  # [batch, pos, n_heads, d_head]
        if self.rotary:
            self.hook_rot_q = HookPoint()  # [batch, pos, n_heads, d_head]
            self.hook_rot_k = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        if cfg.use_attn_result:
            self.hook_result = HookPoint()  # [batch, pos, n_heads, d_model]

    # --- TransformerLens weight layout, as views of the fused parameters -------------
    def _split(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        H, Hkv, dh = self.n_heads, self.n_kv, self.d_head
        return t.split([H * dh, Hkv * dh, Hkv * dh], dim=0)

    def _heads_in(self, w: Tensor) -> Tensor:  # [h*dh, d_model] -> [h, d_model, dh]
        return w.view(-1, self.d_head, w.shape[-1]).transpose(1, 2)

    @property
    def W_Q(self) -> Tensor:
        return self._heads_in(self._split(self.qkv.weight)[0])

    @property
    def W_K(self) -> Tensor:
        return self._heads_in(self._split(self.qkv.weight)[1])

    @property
    def W_V(self) -> Tensor:
        return self._heads_in(self._split(self.qkv.weight)[2])

    @property
    def W_O(self) -> Tensor:  # [n_heads, d_head, d_model]
        return self.o.weight.T.view(self.n_heads, self.d_head, -1)

    def _bias(self, i: int) -> Tensor:
        if self.qkv.bias is None:
            n = (self.n_heads, self.n_kv, self.n_kv)[i]
            return torch.zeros(n, self.d_head, dtype=self.qkv.weight.dtype, device=self.qkv.weight.device)
        return self._split(self.qkv.bias)[i].view(-1, self.d_head)

    @property
    def b_Q(self) -> Tensor:
        return self._bias(0)

    @property
    def b_K(self) -> Tensor:
        return self._bias(1)

    @property
    def b_V(self) -> Tensor:
        return self._bias(2)

    @property
    def b_O(self) -> Tensor:
        if self.o.bias is None:
            return torch.zeros(self.o.weight.shape[0], dtype=self.o.weight.dtype, device=self.o.weight.device)
        return self.o.bias

    # --- forward ---------------------------------------------------------------------
    def forward(self, x: Float[Tensor, "batch pos d_model"], ctx: AttnContext, cache: Optional[KVCacheEntry] = None
                ) -> Float[Tensor, "batch pos d_model"]:
        b, p, _ = x.shape
        H, Hkv, dh = self.n_heads, self.n_kv, self.d_head
        q, k, v = self.qkv(x).split([H * dh, Hkv * dh, Hkv * dh], dim=-1)
        q, k, v = q.view(b, p, H, dh), k.view(b, p, Hkv, dh), v.view(b, p, Hkv, dh)
        if Hkv != H:  # grouped-query attention: each K/V head serves H/Hkv query heads
            k = k.repeat_interleave(H // Hkv, dim=2)
            v = v.repeat_interleave(H // Hkv, dim=2)
        q, k, v = hook(self.hook_q, q), hook(self.hook_k, k), hook(self.hook_v, v)
        if self.rotary:
            cos, sin = cast(Tensor, ctx.cos), cast(Tensor, ctx.sin)  # Transformer._context sets them for rotary
            q = hook(self.hook_rot_q, apply_rotary(q, cos, sin))
            k = hook(self.hook_rot_k, apply_rotary(k, cos, sin))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, n_heads, pos, d_head]
        if cache is not None:
            k, v = cache.extend(k, v)

        if active(self.hook_attn_scores) or active(self.hook_pattern):
            # In place on the fresh scores tensor: the same values without a [batch, n_heads, q, k] copy
            # per step (autograd-safe: neither matmul nor a scalar product nor a fill needs its output).
            # The ALiBi add stays out of place: it may promote the dtype (bf16 scores + float32 bias).
            scores = q @ k.transpose(-1, -2)
            if self.scale != 1.0:
                scores.mul_(self.scale)
            if ctx.bias is not None:
                scores = scores + ctx.bias
            mask = ctx.explicit_mask(q.shape[2], k.shape[2], x.device)
            if mask is not None:
                scores.masked_fill_(~mask, float("-inf"))
            scores = hook(self.hook_attn_scores, scores)
            pattern = hook(self.hook_pattern, torch.softmax(scores, dim=-1))
            z = pattern @ v
        else:
            attn_mask = ctx.allowed
            if ctx.bias is not None:
                attn_mask = ctx.bias if attn_mask is None else ctx.bias.masked_fill(~attn_mask, float("-inf"))
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               is_causal=ctx.is_causal and attn_mask is None, scale=self.scale)
        z = hook(self.hook_z, z.transpose(1, 2))  # [batch, pos, n_heads, d_head]
        if self.cfg.use_attn_result:
            result = hook(self.hook_result, torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(dim=2) + self.b_O
        return self.o(z.reshape(b, p, H * dh))


_ACTS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "silu": F.silu,
}


class MLP(nn.Module):
    """Position-wise feed-forward network (Vaswani et al. 2017 §3.3), optionally gated.

    Gated (Shazeer 2020, SwiGLU when act_fn="silu"): W_out(act(x W_gate) * (x W_in)),
    with ``hook_pre`` on the gate branch as TransformerLens places it.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.gated = cfg.gated_mlp
        self.act = _ACTS[cfg.act_fn]
        d_mlp = cast(int, cfg.d_mlp)  # ModelConfig.__post_init__ resolves it (None = 4 * d_model)
        self.w_in = nn.Linear(cfg.d_model, d_mlp, bias=cfg.mlp_bias, dtype=dtype)
        if self.gated:
            self.w_gate = nn.Linear(cfg.d_model, d_mlp, bias=False, dtype=dtype)
        self.w_out = nn.Linear(d_mlp, cfg.d_model, bias=cfg.mlp_bias, dtype=dtype)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        if self.gated:
            self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    @property
    def W_in(self) -> Tensor:  # [d_model, d_mlp]
        return self.w_in.weight.T

    @property
    def W_gate(self) -> Tensor:
        return self.w_gate.weight.T

    @property
    def W_out(self) -> Tensor:  # [d_mlp, d_model]
        return self.w_out.weight.T

    @property
    def b_in(self) -> Optional[Tensor]:
        return self.w_in.bias

    @property
    def b_out(self) -> Optional[Tensor]:
        return self.w_out.bias

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.gated:
            gate = hook(self.hook_pre, self.w_gate(x))
            post = self.act(gate) * hook(self.hook_pre_linear, self.w_in(x))
        else:
            post = self.act(hook(self.hook_pre, self.w_in(x)))
        return self.w_out(hook(self.hook_post, post))


class Block(nn.Module):
    """One Transformer layer, pre-norm (GPT-2) or post-norm (Vaswani et al. 2017)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.pre = cfg.norm_placement == "pre"
        self.attn_only = cfg.attn_only
        has_norm = cfg.normalization_type is not None
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.ln1 = Norm(cfg, dtype) if has_norm else nn.Identity()
        self.attn = Attention(cfg, dtype)
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        if not self.attn_only:
            self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
            self.ln2 = Norm(cfg, dtype) if has_norm else nn.Identity()
            self.mlp = MLP(cfg, dtype)
            self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"], ctx: AttnContext, cache: Optional[KVCacheEntry] = None
                ) -> Float[Tensor, "batch pos d_model"]:
        x = hook(self.hook_resid_pre, x)
        if self.pre:
            x = x + hook(self.hook_attn_out, self.attn(self.ln1(x), ctx, cache))
            if self.attn_only:
                return hook(self.hook_resid_post, x)
            x = hook(self.hook_resid_mid, x)
            x = x + hook(self.hook_mlp_out, self.mlp(self.ln2(x)))
            return hook(self.hook_resid_post, x)
        # post-norm, "Add & Norm" (Vaswani et al. 2017 §3.1): LN(x + Sublayer(x))
        x = self.ln1(x + hook(self.hook_attn_out, self.attn(x, ctx, cache)))
        if self.attn_only:
            return hook(self.hook_resid_post, x)
        x = hook(self.hook_resid_mid, x)
        x = self.ln2(x + hook(self.hook_mlp_out, self.mlp(x)))
        return hook(self.hook_resid_post, x)
