"""Slow tier: HFAdapter across the zoo of tiny random HF architectures (logits, route, hooks that fire).

Tolerance atol 1e-5 (float32): the adapter runs the model's own forward and kernel (measured 0).
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import transformers as tr

from harness.adapters import HFAdapter
from harness.adapters.hf_routes import routes_markdown

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
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
MODULE_HOOKS = {"bloom", "falcon", "gpt_neo", "xglm", "mpt", "openai"}
# hooks every route fires; the attention-interface route fires q/k/v and scores as well
ALWAYS = {"hook_z", "hook_pattern"}
INTERFACE_ALSO = {"hook_v", "hook_attn_scores", "hook_rot_q", "hook_rot_k"}


@pytest.mark.parametrize("arch", sorted(ZOO))
def test_zoo_logits_and_hooks(arch):
    torch.manual_seed(0)
    model = ZOO[arch]().eval()
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    assert adapter.route == ("module_hooks" if arch in MODULE_HOOKS else "attention_interface")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(2, V, (2, 7), generator=g)  # ids >= 2: no pad token, so RoBERTa's own positions agree
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    kwargs = {}
    if "position_ids" in inspect.signature(plain.forward).parameters:
        kwargs["position_ids"] = adapter.position_ids(mask, 0)
    with torch.no_grad():
        ref = plain(input_ids=x, attention_mask=mask, **kwargs).logits
        got = adapter(x, attention_mask=mask)
    torch.testing.assert_close(got[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=0)
    _, cache = adapter.run_with_cache(x, attention_mask=mask)
    fired = {k.rsplit(".", 1)[-1] for k in cache if k.startswith("blocks.0.attn.")}
    assert ALWAYS <= fired
    if arch not in MODULE_HOOKS:
        rotary = adapter.cfg.positional_embedding_type == "rotary"
        assert {h for h in INTERFACE_ALSO if rotary or "rot" not in h} <= fired
    for layer in range(2):
        assert tuple(cache[f"blocks.{layer}.hook_resid_post"].shape) == (2, 7, adapter.cfg.d_model)


def test_roberta_positions_match_its_own_numbering():
    torch.manual_seed(0)
    model = ZOO["roberta"]().eval()
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    assert adapter.cfg.pos_offset == 2  # padding_idx 1 + 1
    x = torch.randint(2, V, (2, 7))
    with torch.no_grad():  # RoBERTa numbers positions itself from padding_idx + 1 when given none
        torch.testing.assert_close(adapter(x), plain(input_ids=x).logits, atol=1e-5, rtol=0)


def test_routes_table_names_both_routes():
    table = routes_markdown()
    assert "| llama | attention_interface |" in table and "| bloom | module_hooks |" in table
