"""deepseek_v4 (DeepseekV4ForCausalLM): kv_cache, padding_outputs -- the census's finding, standalone.

DeepSeek-V4's compressor groups keys into windows by token index while its causal threshold reads position ids: a
masked left pad shifts every window by one token, so a left-padded prompt's last logits (cached or not) differ from
the unpadded prompt's; unpadded, cached decoding is exact.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random DeepseekV4ForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::left_pad_shifts_compressed_windows.

Expected: one masked left pad leaves the last logits unchanged. Observed: they move, with the cache and without it
(the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/deepseek_v4/modeling_deepseek_v4.py:448 (DeepseekV4HCACompressor.forward): causal_threshold = (position_ids + 1) // self.compress_rate  # [B, S]

Run: python deepseek_v4__left_pad_shifts_compressed_windows.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny deepseek_v4: the default config with every size shrunk and the structure kept.
CONFIG = {'head_dim': 8,
          'hidden_size': 64,
          'index_head_dim': 64,
          'layer_types': ['heavily_compressed_attention',
                          'heavily_compressed_attention',
                          'heavily_compressed_attention',
                          'compressed_sparse_attention'],
          'max_position_embeddings': 128,
          'mlp_layer_types': ['hash_moe', 'hash_moe', 'hash_moe', 'moe'],
          'moe_intermediate_size': 128,
          'n_routed_experts': 4,
          'num_attention_heads': 4,
          'num_experts_per_tok': 2,
          'num_hidden_layers': 4,
          'o_lora_rank': 64,
          'q_lora_rank': 48,
          'qk_rope_head_dim': 8,
          'sliding_window': 8,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.DeepseekV4Config(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()


def last(tokens, mask, cached):
    """The last position's logits, positions from the mask as generate() makes them; cached: the prompt first, then
    the last token through the returned cache."""
    tokens, mask = torch.tensor(tokens), torch.tensor(mask)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        if not cached:
            return model(tokens, attention_mask=mask, position_ids=pos).logits[:, -1]
        out = model(tokens[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1], use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        return model(tokens[:, -1:], attention_mask=mask, position_ids=pos[:, -1:], use_cache=True,
                     cache=cache).logits[:, -1]


full = last([[5, 6, 7, 8]], [[1, 1, 1, 1]], cached=False)
exact = float((last([[5, 6, 7, 8]], [[1, 1, 1, 1]], cached=True) - full).abs().max())
padded = {c: float((last([[0, 5, 6, 7, 8]], [[0, 1, 1, 1, 1]], cached=c) - full).abs().max()) for c in (False, True)}
print(f"expected: one masked left pad leaves the last logits unchanged (0 in float64); observed: they move by "
      f"{padded[False]:.3g} without the cache, {padded[True]:.3g} with it")
print(f"control: unpadded, cached decoding is off the full forward by {exact:.3g}")
# the shift moves logits by 1e-2 and more; unpadded, cached decoding is exact to 5e-8 (parts of the model compute
# in float32 inside, whatever the weights' dtype)
bug = min(padded.values()) > 1e-4
broken = "" if exact < 1e-6 else f"unpadded cached decoding is off by {exact:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
