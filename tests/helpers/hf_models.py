"""Tiny Hugging Face GPT-2 and Llama, built from configs in memory (no network).

A large init range (0.2) keeps attention far from uniform, so a broken position or mask rule moves
the logits visibly. Shared by the bridge tests and the property grid.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 64
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32, initializer_range=0.2,
                     **NO_SPECIAL)
    return GPT2LMHeadModel(cfg).eval()


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64, initializer_range=0.2,
                      **NO_SPECIAL)
    return LlamaForCausalLM(cfg).eval()
