"""A from-scratch Transformer with TransformerLens hook points.

Dimension legend (used by every shape comment and einsum in harness/):
    batch    sequences in a batch
    pos      positions in a sequence (query_pos / key_pos inside attention)
    d_model  residual stream width
    n_heads  attention heads;  d_head  width of one head
    d_mlp    MLP hidden width
    d_vocab  vocabulary size

Forward protocol (docs/architecture.md): ``forward(tokens, attention_mask=None, position_offset=0)``
returns logits ``[batch, pos, d_vocab]``. ``attention_mask`` is 1 for a real token and 0
for padding; a token's position is ``position_offset`` plus the number of real tokens
before it, so left padding does not move positions.
"""

from __future__ import annotations

import math
from typing import Optional, cast

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.config import DTYPES, ModelConfig
from harness.model.generate import generate as _generate
from harness.model.inputs import check_mask, check_offset, check_partial_run, check_table_positions, check_tokens
from harness.model.kv_cache import KVCache
from harness.model.layers import AttnContext, Block, Norm, hook
from harness.model.positions import alibi_bias, alibi_slopes, mask_positions, rotary_cos_sin, sinusoidal_table

# ModelConfig.dtype's names (harness.model.config.DTYPES, a tuple) to torch dtypes.
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


class _BoundConfig:
    """``model.cfg``: the ModelConfig plus ``device``, which TransformerLens's patching reads.

    The device belongs to the model, not the config, so it is looked up on the parameters.
    """

    def __init__(self, config: ModelConfig, model: nn.Module):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_model", model)

    def __getattr__(self, name: str):
        return getattr(self._config, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("model.cfg is read-only; build a new model from config.replace(...)")

    @property
    def device(self) -> torch.device:
        return next(self._model.parameters()).device

    @property
    def attn_scale(self) -> float:
        """The factor q.k is multiplied by, as the config declares it: 1/sqrt(d_head), or 1 unscaled."""
        return 1.0 / math.sqrt(self._config.d_head) if self._config.use_attn_scale else 1.0

    def __repr__(self) -> str:
        return repr(self._config)


class Transformer(HookedRootModule):
    """Decoder (causal) or encoder (bidirectional) Transformer following the model protocol."""

    alibi_slopes: Tensor  # [n_heads] buffer, ALiBi models only
    block_class: type[Block] = Block  # the layer type; harness.model.seq2seq's decoder adds cross-attention

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise AttnlabTypeError(f"Transformer expects a harness.ModelConfig, got {type(cfg).__name__}")
        self.config = cfg
        dtype = TORCH_DTYPES[cfg.dtype]
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model, dtype=dtype)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.pos_type = cfg.positional_embedding_type
        if self.pos_type == "standard":
            self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model, dtype=dtype)
        if self.pos_type in ("standard", "sinusoidal"):
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        if self.pos_type == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(cfg.n_heads), persistent=False)
        self.blocks = nn.ModuleList([self.block_class(cfg, dtype) for _ in range(cfg.n_layers)])
        self.has_ln_final = cfg.normalization_type is not None and cfg.norm_placement == "pre"
        if self.has_ln_final:
            self.ln_final = Norm(cfg, dtype)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False, dtype=dtype)
        if cfg.tie_embeddings:
            self.unembed.weight = self.embed.weight
        self.reset_parameters()
        self.setup()

    @property
    def cfg(self) -> _BoundConfig:
        return _BoundConfig(self.config, self)

    def reset_parameters(self) -> None:
        """N(0, init_range) matrices, zero biases, unit norm gains, from a generator seeded by cfg.seed."""
        gen = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".w"):
                    p.fill_(1.0)
                elif p.ndim == 1:
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * self.config.init_range)

    # --- TransformerLens weight names ------------------------------------------------
    @property
    def W_E(self) -> Tensor:  # [d_vocab, d_model]
        return self.embed.weight

    @property
    def W_pos(self) -> Tensor:  # [n_ctx, d_model]
        if self.pos_type != "standard":
            raise AttributeError(f"W_pos exists only for learned positions, not {self.pos_type!r}")
        return self.pos_embed.weight

    @property
    def W_U(self) -> Tensor:  # [d_model, d_vocab]
        return self.unembed.weight.T

    @property
    def b_U(self) -> Tensor:
        return torch.zeros(self.config.d_vocab, dtype=self.W_E.dtype, device=self.W_E.device)

    # --- positions and masks ---------------------------------------------------------
    def _context(self, batch: int, q: int, device: torch.device, dtype: torch.dtype,
                 mask: Optional[Tensor], offset: int, cache: Optional[KVCache]) -> tuple[Tensor, AttnContext]:
        """Positions ``[batch|1, q]`` of the new tokens and the attention context of this pass."""
        cfg = self.config
        past = cache.length if cache is not None else 0
        key_mask = None  # bool [batch, past + q], True for real keys
        if mask is not None and bool(mask.all()):
            mask = None  # an all-ones mask is no mask; keeps the SDPA fast path
        if cache is not None:  # written in place into the cache's mask storage
            key_mask = cache.key_mask(mask, batch, q, device)
        elif mask is not None:
            key_mask = mask
        k_pos = mask_positions(key_mask, offset, past + q, device)
        q_pos = k_pos[:, past:]
        if self.pos_type == "standard" and not torch.compiler.is_compiling():
            check_table_positions(q_pos, cfg.n_ctx, f" (position_offset={offset}, {past} cached)")
        causal = cfg.attention_dir == "causal"
        allowed = None
        if key_mask is not None or (causal and past > 0 and q > 1) or self.pos_type == "alibi":
            k_idx = torch.arange(past + q, device=device)
            q_idx = torch.arange(past, past + q, device=device)
            allowed = torch.ones(1, q, past + q, dtype=torch.bool, device=device)
            if causal:
                allowed = allowed & (k_idx[None, None, :] <= q_idx[None, :, None])
            if key_mask is not None:
                # padded keys get no weight; a padded query still sees itself so its row stays finite
                allowed = (allowed & key_mask[:, None, :]) | (k_idx[None, None, :] == q_idx[None, :, None])
            allowed = allowed[:, None]
        cos = sin = bias = None
        if self.pos_type == "rotary":
            cos, sin = rotary_cos_sin(q_pos, cast(int, cfg.d_head), cfg.rotary_base, dtype)  # resolved by config
            cos, sin = cos[:, :, None], sin[:, :, None]
        elif self.pos_type == "alibi":
            bias = alibi_bias(q_pos, k_pos, self.alibi_slopes, dtype)
        ctx = AttnContext(cos=cos, sin=sin, allowed=allowed, is_causal=causal and q > 1, bias=bias)
        return q_pos, ctx

    # --- forward -----------------------------------------------------------------------
    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0, *,
                start_at_layer: Optional[int] = None, stop_at_layer: Optional[int] = None,
                kv_cache: Optional[KVCache] = None
                ) -> Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch pos d_model"]:
        """Logits ``[batch, pos, d_vocab]``.

        TransformerLens-style partial runs: ``stop_at_layer=l`` returns the residual stream
        entering block l; ``start_at_layer=l`` takes that residual ``[batch, pos, d_model]``
        in place of ``tokens`` and runs the rest.
        """
        cfg = self.config
        position_offset = check_offset(position_offset)
        n = cfg.n_layers
        check_partial_run(tokens, start_at_layer, stop_at_layer, n, cfg.d_model)
        if start_at_layer is None:
            check_tokens(tokens, self.config.d_vocab)
            batch, q = tokens.shape
            device, dtype = tokens.device, self.embed.weight.dtype
        else:
            batch, q = tokens.shape[:2]
            device, dtype = tokens.device, tokens.dtype
        mask = check_mask(attention_mask, batch, q)
        positions, ctx = self._context(batch, q, device, dtype, mask, position_offset, kv_cache)

        if start_at_layer is None:
            x = hook(self.hook_embed, self.embed(tokens))
            if self.pos_type == "standard":
                x = x + hook(self.hook_pos_embed, self.pos_embed(positions).expand(batch, q, -1))
            elif self.pos_type == "sinusoidal":
                pe = sinusoidal_table(positions, cfg.d_model, dtype=dtype).expand(batch, q, -1)
                x = x + hook(self.hook_pos_embed, pe)
            start_at_layer = 0
        else:
            x = tokens
        stop = n if stop_at_layer is None else stop_at_layer
        for layer in range(start_at_layer, stop):
            x = self.blocks[layer](x, ctx, kv_cache.layers[layer] if kv_cache is not None else None)
        if kv_cache is not None:
            kv_cache.length += q
        if stop_at_layer is not None:
            return x
        if self.has_ln_final:
            x = self.ln_final(x)
        return self.unembed(x)

    def generate(self, tokens: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: Optional[int] = None, attention_mask: Optional[Tensor] = None,
                 generator: Optional[torch.Generator] = None, use_cache: bool = True,
                 return_logits: bool = False):
        """Sample ``max_new_tokens`` tokens; see :func:`harness.model.generate.generate`."""
        return _generate(self, tokens, max_new_tokens, temperature=temperature, top_k=top_k,
                        attention_mask=attention_mask, generator=generator, use_cache=use_cache,
                        return_logits=return_logits)

    def forward_with_cache(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,
                           past: Optional[KVCache] = None) -> tuple[Tensor, KVCache]:
        """Cached decoding (``harness.adapters.protocol.CachedDecoding``): logits of the new ``tokens``
        ``[batch, new]`` given the cache ``past`` (None starts one), and the cache to pass next.

        ``attention_mask`` covers the new tokens only; the cache remembers earlier masks.
        """
        if self.config.attention_dir != "causal":
            raise AttnlabError("forward_with_cache needs a causal model: attention_dir='bidirectional' lets every "
                               "token see the future")
        if past is not None and not isinstance(past, KVCache):
            raise AttnlabTypeError(f"past must be None or the KVCache a previous call returned, got "
                                   f"{type(past).__name__}")
        cache = KVCache(self.config.n_layers) if past is None else past
        return self(tokens, attention_mask=attention_mask, kv_cache=cache), cache
