"""Tiny random Hugging Face models for the field-bug catalogue, built from configs in memory (no network).

Each builder seeds torch, so two calls give the same weights: the witness of a bug compares a
patched model with an unpatched one built the same way. A large init range (0.2) keeps attention
far from uniform, so a changed mask, slope or phase moves the logits visibly.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 64
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, initializer_range=0.2, **NO_SPECIAL)


def _build(model_type: str, attn: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = attn
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def mistral(attn: str = "eager", window: int = 3, n_ctx: int = 64) -> torch.nn.Module:
    """Mistral with a sliding window of ``window`` keys on every layer (transformers' convention)."""
    return _build("mistral", attn, **DECODER, max_position_embeddings=n_ctx, sliding_window=window)


def llama(attn: str = "eager", n_ctx: int = 64, **kw) -> torch.nn.Module:
    return _build("llama", attn, **{**DECODER, **kw}, max_position_embeddings=n_ctx)


def gemma(attn: str = "eager", n_ctx: int = 2048) -> torch.nn.Module:
    return _build("gemma", attn, **DECODER, head_dim=8, max_position_embeddings=n_ctx)


def gpt_neox(attn: str = "eager", n_ctx: int = 2048) -> torch.nn.Module:
    """GPT-NeoX with partial rotary (rotary_pct 0.5: 8 of 16 dims per head turn)."""
    return _build("gpt_neox", attn, vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, rotary_pct=0.5, max_position_embeddings=n_ctx, initializer_range=0.2,
                  **NO_SPECIAL)


def bloom(n_heads: int = 4) -> torch.nn.Module:
    """Bloom (ALiBi, absolute-key form); ``n_heads`` 6 exercises the non-power-of-two slope rule."""
    return _build("bloom", "eager", vocab_size=VOCAB, hidden_size=8 * n_heads, n_layer=2, n_head=n_heads,
                  initializer_range=0.2, **NO_SPECIAL)


def gpt2(attn: str = "sdpa") -> torch.nn.Module:
    return _build("gpt2", attn, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                  initializer_range=0.2, **NO_SPECIAL)


def opt(attn: str = "eager") -> torch.nn.Module:
    return _build("opt", attn, vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=32, word_embed_proj_dim=32, init_std=0.2,
                  **NO_SPECIAL)


def roformer(attn: str = "eager") -> torch.nn.Module:
    """RoFormer as a causal LM (``is_decoder=True``): rotary positions, BERT-style blocks."""
    return _build("roformer", attn, vocab_size=VOCAB, hidden_size=32, embedding_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, is_decoder=True,
                  initializer_range=0.2, pad_token_id=None)


# --- models whose design the config declares beyond the textbook (scale, rotary scaling, per-layer windows) ----


def gemma2(attn: str = "eager", n_ctx: int = 64) -> torch.nn.Module:
    """Gemma-2 with head_dim 16 and query_pre_attn_scalar 24: the declared scale 24**-0.5 is neither
    1/sqrt(head_dim) nor 1/sqrt(hidden_size / heads) = 1/sqrt(8) (Gemma-2 9B: 256 vs 3584 / 16 = 224)."""
    return _build("gemma2", attn, **DECODER, head_dim=16, query_pre_attn_scalar=24, max_position_embeddings=n_ctx)


def gemma3(attn: str = "eager", n_ctx: int = 2048, window: int = 3) -> torch.nn.Module:
    """Gemma-3 (text) with two sliding layers of ``window`` keys, then one full layer, and its per-layer-type
    rotary settings: local layers base 10000 unscaled, global layers base 1e6 with linear factor 8 (Gemma-3 4B+)."""
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}
    return _build("gemma3_text", attn, **{**DECODER, "num_hidden_layers": 3}, head_dim=8, query_pre_attn_scalar=8,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=window,
                  rope_parameters=rope, max_position_embeddings=n_ctx)


def qwen2(attn: str = "eager", n_ctx: int = 2048, **rope) -> torch.nn.Module:
    """Qwen2 with the rotary settings ``rope`` (rope_parameters; default: base 1e6, as Qwen2.5 declares)."""
    rope = rope or {"rope_type": "default", "rope_theta": 1000000.0}
    return _build("qwen2", attn, **DECODER, rope_parameters=rope, max_position_embeddings=n_ctx)


def qwen2_yarn(attention_factor: float, attn: str = "eager") -> torch.nn.Module:
    """Qwen2 with YaRN (factor 4 over an original 512 positions) and an explicit ``attention_factor``."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512,
            "attention_factor": float(attention_factor)}
    return qwen2(attn, n_ctx=2048, **rope)


def llama31(attn: str = "eager", n_ctx: int = 2048) -> torch.nn.Module:
    """Llama with Llama 3.1's rope scaling (rope_type llama3: factor 8, low/high frequency factors 1/4) over an
    original 1024 positions: the 4 frequencies of head_dim 8 fall one in each regime (kept, kept, smoothed,
    divided by 8)."""
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    return _build("llama", attn, **DECODER, rope_parameters=rope, max_position_embeddings=n_ctx)


def glm(attn: str = "eager", n_ctx: int = 2048) -> torch.nn.Module:
    """GLM (GLM-4-9B's layout): head_dim 16, partial_rotary_factor 0.5 (8 of 16 dims per head turn)."""
    return _build("glm", attn, **DECODER, head_dim=16, max_position_embeddings=n_ctx)
