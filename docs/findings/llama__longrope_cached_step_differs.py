"""llama (LlamaForCausalLM): kv_cache -- the variants census's finding, standalone.

LongRoPE (Ding et al. 2024; Phi-3's rope_type='longrope') rotates with short_factor while the sequence is within
original_max_position_embeddings and with long_factor past it, recomputed from each call's largest position id
(transformers' longrope_frequency_update): keys cached while the sequence was short keep the short rotation, so a
cached step past the limit differs from a full forward, which rotates every key with long_factor (the design, not
rounding: 6e-3 in float64, exact under default rope). transformers' generate recomputes the cache at the switch only
for Phi-3 (Phi3ForCausalLM.prepare_inputs_for_generation).

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random LlamaForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_variant_witness.py::longrope_cached_step_differs.

Expected: cached decoding past original_max_position_embeddings equals the full forward. Observed: it is off under
longrope; exact under default rope (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/modeling_rope_utils.py:79 (dynamic_rope_update.longrope_frequency_update): inv_freq = torch.where(seq_len > original_max_position_embeddings, long_inv_freq, original_inv_freq)

Run: python llama__longrope_cached_step_differs.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny llama: the default config with every size shrunk and the structure kept.
CONFIG = {'head_dim': 16,
          'hidden_size': 64,
          'intermediate_size': 128,
          'max_position_embeddings': 128,
          'num_attention_heads': 4,
          'num_hidden_layers': 2,
          'num_key_value_heads': 4,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.LlamaConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


TOKENS = torch.tensor([[3, 5, 7, 11, 13, 17]])


def cached_against_full(rope_parameters, prefill=3):
    """Largest |logit| gap between decoding TOKENS one token at a time after a prefill and one full forward."""
    model = build(rope_parameters=rope_parameters)
    with torch.no_grad():
        full = model(input_ids=TOKENS).logits
        out = model(input_ids=TOKENS[:, :prefill], use_cache=True)
        past, steps = out.past_key_values, [out.logits[:, -1]]
        for i in range(prefill, TOKENS.shape[1]):
            out = model(input_ids=TOKENS[:, i:i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            steps.append(out.logits[:, -1])
    return float((torch.stack(steps, 1) - full[:, prefill - 1:]).abs().max())


# LongRoPE as Phi-3 ships it (a factor per rotated pair) with original_max_position_embeddings=4, so the 6 tokens
# cross the switch from short_factor to long_factor; the same model under default rope as the control
LONGROPE = {'factor': 32.0,
            'long_factor': [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
            'original_max_position_embeddings': 4,
            'rope_theta': 10000.0,
            'rope_type': 'longrope',
            'short_factor': [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}
DEFAULT = {'rope_theta': 10000.0, 'rope_type': 'default'}
moved, exact = cached_against_full(LONGROPE), cached_against_full(DEFAULT)
print(f"expected: cached decoding past original_max_position_embeddings=4 equals the full forward (0 in float64); "
      f"observed under longrope: off by {moved:.3g}")
print(f"control: under default rope, off by {exact:.3g}")
# the stale short-factor keys move logits by 1e-4 and more; default rope is exact to float64 rounding (below 1e-13),
# or to the float32 a model computes inside (DeepSeek-V3's router: 2e-8)
bug = moved > 1e-6 and moved > 1e4 * exact
broken = "" if exact < 1e-7 else f"default rope is off by {exact:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
