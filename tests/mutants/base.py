"""A compact reference attention model that follows the model protocol, written without harness.

Mutants (tests/mutants/catalogue.py) subclass it and override one small method to plant one
bug, so a kill shows that the property suite judges an implementation it has never seen,
not ``harness`` internals. Every overridable step is a method: ``positions``,
``step_positions``, ``embed_positions``; on the attention: ``scale``, ``rotate_q``/``rotate_k``,
``allowed``, ``apply_mask``, ``normalize``, ``slopes``, ``alibi_bias``, ``kernel``; on the norm:
``stats_dims``.

Formulas: scaled dot-product attention (Vaswani et al. 2017 eq. 1), sinusoidal positions
(§3.5), RoPE in the rotate-half layout (Su et al. 2021 eq. 34), ALiBi (Press et al. 2022, with the
reference code's rule for head counts that are not a power of two), sliding windows (transformers'
``masking_utils`` convention: w keys, the query's own included),
LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

import torch
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


@dataclass(frozen=True)
class RefConfig:
    n_layers: int = 2
    d_model: int = 32
    n_heads: int = 4
    d_head: int = 8
    d_mlp: int = 64
    d_vocab: int = 32
    n_ctx: int = 32
    positional_embedding_type: str = "none"
    attention_dir: str = "causal"
    normalization_type: str = "LN"
    norm_placement: str = "pre"
    base: float = 10000.0
    eps: float = 1e-5
    seed: int = 0
    sliding_window: Optional[tuple] = None  # per layer: None (global) or w (query i sees keys i - w < j <= i)
    # A Hugging Face-style config the model declares its design by (what harness.oracle reads); None: none
    source_config: Any = field(default=None, hash=False)


def declaration(cfg: RefConfig, **fields: Any) -> SimpleNamespace:
    """The reference's design written as a Llama-style Hugging Face config (model_type, widths, rope_parameters with
    the base it turns by), with ``fields`` on top: the declaration a mutant breaks."""
    base = dict(model_type="llama", hidden_size=cfg.d_model, num_attention_heads=cfg.n_heads, head_dim=cfg.d_head,
                max_position_embeddings=cfg.n_ctx, rope_parameters={"rope_type": "default", "rope_theta": cfg.base})
    return SimpleNamespace(**{**base, **fields})


def sinusoids(pos: Tensor, d: int, base: float) -> Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...), ``[*pos.shape, d]``."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None] * inv
    return torch.stack((ang.sin(), ang.cos()), -1).flatten(-2).float()


def rope(x: Tensor, pos: Tensor, base: float, layout: str = "half") -> Tensor:
    """Rotate ``x [b, n, h, d]`` to positions ``pos [b, n]``; pairs (i, i + d/2) or (2i, 2i + 1)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None, None] * inv  # [b, n, 1, d/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)  # the table in the activations' dtype
    if layout == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class RefNorm(nn.Module):
    def __init__(self, cfg: RefConfig):
        super().__init__()
        self.kind, self.eps = cfg.normalization_type, cfg.eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def stats_dims(self) -> tuple[int, ...]:
        return (-1,)  # statistics per token

    def forward(self, x: Tensor) -> Tensor:
        dims = self.stats_dims()
        if self.kind == "LN":
            x = x - x.mean(dims, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dims, keepdim=True) + self.eps).sqrt())
        out = x / scale * self.w + (self.b if self.kind == "LN" else 0)
        return self.hook_normalized(out)


class Cache:
    """Per-layer keys/values (rotated) and the padding mask of everything decoded so far."""

    def __init__(self, n_layers: int):
        self.k: list[Optional[Tensor]] = [None] * n_layers
        self.v: list[Optional[Tensor]] = [None] * n_layers
        self.mask: Optional[Tensor] = None  # [batch, past]

    @property
    def past(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]


class RefAttention(nn.Module):
    def __init__(self, cfg: RefConfig):
        super().__init__()
        self.cfg = cfg
        h, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
        self.q, self.k, self.v = (nn.Linear(d, h * dh) for _ in range(3))
        self.o = nn.Linear(h * dh, d)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()  # [batch, pos, n_heads, d_head]
        if cfg.positional_embedding_type == "rotary":
            self.hook_rot_q, self.hook_rot_k = HookPoint(), HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        self.layer = 0  # set by RefModel: which entry of cfg.sliding_window applies

    # --- the steps a mutant may override -------------------------------------------------
    def window(self) -> Optional[int]:
        return None if self.cfg.sliding_window is None else self.cfg.sliding_window[self.layer]

    def slopes(self) -> Tensor:
        """ALiBi slopes: 2^(-8h/n), h = 1..n; else the closest power of two c's, then every other one of 2c's."""
        def geometric(n: int) -> list[float]:
            return [2 ** (-8 * (i + 1) / n) for i in range(n)]

        n = self.cfg.n_heads
        c = 2 ** int(math.floor(math.log2(n)))
        return torch.tensor(geometric(c) + geometric(2 * c)[0::2][: n - c])

    def alibi_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """ALiBi's ``-m_h |i - j|`` over positions, ``[batch, heads, q, k]``."""
        return -self.slopes()[None, :, None, None] * (q_pos[:, None, :, None] - k_pos[:, None, None, :]).abs()

    def kernel(self, raw_scores: Tensor, pattern: Tensor, v: Tensor, q_idx: Tensor, k_idx: Tensor,
               key_mask: Tensor) -> Tensor:
        """The attention output (``hook_z``); a fused kernel would recompute it from the unmasked scores."""
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

    def scale(self) -> float:
        return 1.0 / math.sqrt(self.cfg.d_head)

    def rotate_q(self, q: Tensor, pos: Tensor) -> Tensor:
        return rope(q, pos, self.cfg.base)

    def rotate_k(self, k: Tensor, pos: Tensor) -> Tensor:
        return rope(k, pos, self.cfg.base)

    def allowed(self, q_idx: Tensor, k_idx: Tensor, key_mask: Tensor) -> Tensor:
        """bool [batch, 1, q, k]: causal (key index <= query index) and real keys; a query always sees itself."""
        ok = torch.ones(len(q_idx), len(k_idx), dtype=torch.bool)
        if self.cfg.attention_dir == "causal":
            ok = k_idx[None, :] <= q_idx[:, None]
        if self.window() is not None:
            ok = ok & (k_idx[None, :] > q_idx[:, None] - self.window())
        ok = ok[None] & key_mask[:, None, :]
        return (ok | (k_idx[None, None, :] == q_idx[None, :, None]))[:, None]

    def apply_mask(self, scores: Tensor, allowed: Tensor) -> Tensor:
        return scores.masked_fill(~allowed, float("-inf"))

    def normalize(self, scores: Tensor, allowed: Tensor) -> Tensor:
        return scores.softmax(-1)

    # --- forward --------------------------------------------------------------------------
    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, key_mask: Tensor, layer: int,
                cache: Optional[Cache]) -> Tensor:
        cfg = self.cfg
        b, n, _ = x.shape
        split = lambda t: t.view(b, n, cfg.n_heads, cfg.d_head)  # noqa: E731
        q, k, v = self.hook_q(split(self.q(x))), self.hook_k(split(self.k(x))), self.hook_v(split(self.v(x)))
        if cfg.positional_embedding_type == "rotary":
            q, k = self.hook_rot_q(self.rotate_q(q, q_pos)), self.hook_rot_k(self.rotate_k(k, q_pos))
        past = 0
        if cache is not None:
            if cache.k[layer] is not None:
                past = cache.k[layer].shape[1]
                k, v = torch.cat((cache.k[layer], k), 1), torch.cat((cache.v[layer], v), 1)
            cache.k[layer], cache.v[layer] = k, v
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale()
        if cfg.positional_embedding_type == "alibi":
            scores = scores + self.alibi_bias(q_pos, k_pos).to(scores.dtype)  # the bias in the model's dtype
        q_idx, k_idx = torch.arange(past, past + n), torch.arange(past + n)
        allowed = self.allowed(q_idx, k_idx, key_mask)
        raw = scores
        scores = self.hook_attn_scores(self.apply_mask(scores, allowed))
        pattern = self.hook_pattern(self.normalize(scores, allowed))
        z = self.hook_z(self.kernel(raw, pattern, v, q_idx, k_idx, key_mask))
        return self.o(z.reshape(b, n, -1))


class RefBlock(nn.Module):
    def __init__(self, cfg: RefConfig, attention_cls: type, norm_cls: type):
        super().__init__()
        self.pre = cfg.norm_placement == "pre"
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.ln1, self.ln2 = norm_cls(cfg), norm_cls(cfg)
        self.attn = attention_cls(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_mlp), nn.GELU(), nn.Linear(cfg.d_mlp, cfg.d_model))
        self.hook_attn_out, self.hook_mlp_out = HookPoint(), HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Tensor, *attn_args) -> Tensor:
        x = self.hook_resid_pre(x)
        if self.pre:
            x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x), *attn_args)))
            return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))
        x = self.hook_resid_mid(self.ln1(x + self.hook_attn_out(self.attn(x, *attn_args))))
        return self.hook_resid_post(self.ln2(x + self.hook_mlp_out(self.mlp(x))))


class RefModel(HookedRootModule):
    """The reference: explicit attention, every protocol hook, greedy ``generate`` with a KV cache."""

    attention_cls: type = RefAttention
    norm_cls: type = RefNorm

    def __init__(self, cfg: RefConfig):
        super().__init__()
        self._cfg = cfg
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.positional_embedding_type == "standard":
            self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model)
        if cfg.positional_embedding_type in ("standard", "sinusoidal"):
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([RefBlock(cfg, self.attention_cls, self.norm_cls) for _ in range(cfg.n_layers)])
        for layer, block in enumerate(self.blocks):
            block.attn.layer = layer
        if cfg.norm_placement == "pre":
            self.ln_final = self.norm_cls(cfg)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        gen = torch.Generator().manual_seed(cfg.seed)
        with torch.no_grad():  # LeCun init (std 1/sqrt(fan_in)) so attention is not uniform at init
            for name, p in self.named_parameters():
                if p.ndim == 2:
                    fan_in = 1 if name.startswith(("embed", "pos_embed")) else p.shape[1]
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
                elif name.endswith(".bias"):
                    p.zero_()
        self.setup()

    @property
    def cfg(self) -> RefConfig:
        return self._cfg

    # --- the steps a mutant may override ---------------------------------------------------
    def positions(self, mask: Tensor, offset: int) -> Tensor:
        """The protocol's rule: offset plus the number of real tokens before each token."""
        return offset + (mask.long().cumsum(-1) - 1).clamp(min=0)

    def step_positions(self, full_mask: Tensor, past: int, offset: int) -> Tensor:
        """Positions of the new tokens in a cached step: counted over the cached prefix too."""
        return self.positions(full_mask, offset)[:, past:]

    def embed_positions(self, pos: Tensor) -> Optional[Tensor]:
        kind = self.cfg.positional_embedding_type
        if kind == "standard":
            return self.pos_embed(pos)
        if kind == "sinusoidal":
            return sinusoids(pos, self.cfg.d_model, self.cfg.base)
        return None

    # --- forward -----------------------------------------------------------------------------
    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0,
                cache: Optional[Cache] = None) -> Tensor:
        mask = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        past = 0 if cache is None else cache.past
        full_mask = mask if cache is None or cache.mask is None else torch.cat((cache.mask, mask), 1)
        q_pos = self.step_positions(full_mask, past, position_offset) if past else self.positions(mask, position_offset)
        k_pos = self.positions(full_mask, position_offset)
        x = self.hook_embed(self.embed(tokens))
        pe = self.embed_positions(q_pos)
        if pe is not None:  # tables are built in float64 and stored in the model's dtype, as a cast model would
            pe = pe.to(x.dtype)
            x = x + (self.hook_pos_embed(pe) if hasattr(self, "hook_pos_embed") else pe)
        for layer, block in enumerate(self.blocks):
            x = block(x, q_pos, k_pos, full_mask, layer, cache)
        if cache is not None:
            cache.mask = full_mask
        if self.cfg.norm_placement == "pre":
            x = self.ln_final(x)
        return self.unembed(x)

    @torch.no_grad()
    def generate(self, tokens: Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                 attention_mask: Optional[Tensor] = None, return_logits: bool = False):
        """Greedy decoding with a KV cache (``temperature`` must be 0)."""
        if temperature != 0:
            raise ValueError(f"temperature={temperature!r} is invalid: the reference decodes greedily (0)")
        cache = Cache(self.cfg.n_layers)
        logits = self(tokens, attention_mask=attention_mask, cache=cache)[:, -1]
        out, steps = tokens, []
        for i in range(max_new_tokens):
            steps.append(logits)
            nxt = logits.argmax(-1, keepdim=True)
            out = torch.cat((out, nxt), 1)
            if i + 1 < max_new_tokens:
                logits = self(nxt, cache=cache)[:, -1]
        logits = torch.stack(steps, 1) if steps else tokens.new_zeros((tokens.shape[0], 0, self.cfg.d_vocab)).float()
        return (out, logits) if return_logits else out

    @torch.no_grad()
    def forward_with_cache(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,
                           past: Optional[Cache] = None) -> tuple[Tensor, Cache]:
        """The protocol's optional cached decoding: logits of the new tokens and the cache to pass next."""
        cache = Cache(self.cfg.n_layers) if past is None else past
        return self(tokens, attention_mask=attention_mask, cache=cache), cache
