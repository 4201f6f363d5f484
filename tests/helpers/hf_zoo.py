"""Tiny random Hugging Face models of the adapter's architectures, built from configs in memory.

``ZOO`` maps an architecture to a builder (2 layers, 4 heads, width 32, vocabulary 64); the adapter
tests (tests/test_adapter_hf_zoo.py) and the model zoo (tests/helpers/zoo.py) share it.
"""

from __future__ import annotations

import transformers as tr

V = 64
S = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
C = dict(vocab_size=V, max_position_embeddings=64)
ZOO = {
    "gpt2": lambda: tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
    "llama": lambda: tr.LlamaForCausalLM(tr.LlamaConfig(**C, **S, num_key_value_heads=2)),
    "qwen2": lambda: tr.Qwen2ForCausalLM(tr.Qwen2Config(**C, **S, num_key_value_heads=2)),
    "qwen3": lambda: tr.Qwen3ForCausalLM(tr.Qwen3Config(**C, **S, num_key_value_heads=2, head_dim=8)),
    "mistral": lambda: tr.MistralForCausalLM(tr.MistralConfig(**C, **S, num_key_value_heads=2, sliding_window=4)),
    "gemma": lambda: tr.GemmaForCausalLM(tr.GemmaConfig(**C, **S, num_key_value_heads=2, head_dim=8)),
    "gemma2": lambda: tr.Gemma2ForCausalLM(tr.Gemma2Config(**C, **S, num_key_value_heads=2, head_dim=8,
                                                           sliding_window=4)),
    "gemma3": lambda: tr.Gemma3ForCausalLM(tr.Gemma3TextConfig(**C, **S, num_key_value_heads=2, head_dim=8,
                                                               sliding_window=4)),
    "phi": lambda: tr.PhiForCausalLM(tr.PhiConfig(**C, **S)),
    "phi3": lambda: tr.Phi3ForCausalLM(tr.Phi3Config(**C, **S, pad_token_id=0)),
    "stablelm": lambda: tr.StableLmForCausalLM(tr.StableLmConfig(**C, **S, num_key_value_heads=4)),
    "olmo": lambda: tr.OlmoForCausalLM(tr.OlmoConfig(**C, **S, pad_token_id=0)),
    "olmo2": lambda: tr.Olmo2ForCausalLM(tr.Olmo2Config(**C, **S, pad_token_id=0)),
    "granite": lambda: tr.GraniteForCausalLM(tr.GraniteConfig(**C, **S, attention_multiplier=0.3)),
    "starcoder2": lambda: tr.Starcoder2ForCausalLM(tr.Starcoder2Config(**C, **S, num_key_value_heads=2)),
    "cohere": lambda: tr.CohereForCausalLM(tr.CohereConfig(**C, **S, num_key_value_heads=2)),
    "gpt_neox": lambda: tr.GPTNeoXForCausalLM(tr.GPTNeoXConfig(**C, **S)),
    "gpt_bigcode": lambda: tr.GPTBigCodeForCausalLM(tr.GPTBigCodeConfig(vocab_size=V, n_positions=64, n_embd=32,
                                                                        n_layer=2, n_head=4)),
    "gptj": lambda: tr.GPTJForCausalLM(tr.GPTJConfig(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                                     rotary_dim=4)),
    "codegen": lambda: tr.CodeGenForCausalLM(tr.CodeGenConfig(vocab_size=V, n_positions=64, n_ctx=64, n_embd=32,
                                                              n_layer=2, n_head=4, rotary_dim=4)),
    "opt": lambda: tr.OPTForCausalLM(tr.OPTConfig(**C, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                                  num_attention_heads=4, word_embed_proj_dim=32)),
    "bert": lambda: tr.BertForMaskedLM(tr.BertConfig(**C, **S)),
    "roberta": lambda: tr.RobertaForMaskedLM(tr.RobertaConfig(vocab_size=V, max_position_embeddings=70, **S,
                                                              pad_token_id=1)),
    "distilbert": lambda: tr.DistilBertForMaskedLM(tr.DistilBertConfig(vocab_size=V, max_position_embeddings=64,
                                                                       dim=32, hidden_dim=64, n_layers=2, n_heads=4)),
    "bloom": lambda: tr.BloomForCausalLM(tr.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)),
    "falcon": lambda: tr.FalconForCausalLM(tr.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                                           num_attention_heads=4)),
    "gpt_neo": lambda: tr.GPTNeoForCausalLM(tr.GPTNeoConfig(vocab_size=V, max_position_embeddings=64, hidden_size=32,
                                                            num_layers=2, num_heads=4, window_size=4,
                                                            attention_types=[[["global", "local"], 1]])),
    "xglm": lambda: tr.XGLMForCausalLM(tr.XGLMConfig(vocab_size=V, max_position_embeddings=64, d_model=32,
                                                     ffn_dim=64, num_layers=2, attention_heads=4)),
    "mpt": lambda: tr.MptForCausalLM(tr.MptConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)),
    "openai": lambda: tr.OpenAIGPTLMHeadModel(tr.OpenAIGPTConfig(vocab_size=V, n_positions=64, n_embd=32, n_layer=2,
                                                                 n_head=4)),
}
