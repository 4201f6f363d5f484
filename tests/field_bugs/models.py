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
