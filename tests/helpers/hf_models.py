"""Tiny Hugging Face GPT-2 and Llama, and the encoder-decoders BART, T5 and Marian, built from configs in memory
(no network).

A large init range (0.2) keeps attention far from uniform, so a broken position or mask rule moves
the logits visibly. Shared by the bridge tests and the property grid.
"""

from __future__ import annotations

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)

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


SEQ2SEQ_VOCAB = 96
SEQ2SEQ_KINDS = ("bart", "t5", "marian")


def seq2seq(kind: str):
    """A tiny random encoder-decoder of ``kind`` (SEQ2SEQ_KINDS): d_model 32, 2 + 2 layers of 4 heads, vocabulary 96."""
    torch.manual_seed(0)
    widths = dict(vocab_size=SEQ2SEQ_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
    if kind == "bart":
        return BartForConditionalGeneration(BartConfig(**widths)).eval()
    if kind == "marian":
        return MarianMTModel(MarianConfig(**widths, pad_token_id=SEQ2SEQ_VOCAB - 1,
                                          decoder_start_token_id=SEQ2SEQ_VOCAB - 1)).eval()
    return T5ForConditionalGeneration(T5Config(vocab_size=SEQ2SEQ_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                               relative_attention_max_distance=16)).eval()
