"""xglm (XGLMForCausalLM): attention_scale -- the bridge census's finding, standalone.

TransformerLens's bridge fires hook_attn_scores with the post-softmax pattern (it equals hook_pattern), not the pre-
softmax scores; the bridge's logits still equal the raw model's (the zoo's finding).

This one needs transformer_lens: the bug is in TransformerLens's bridge (the raw transformers model is the reference
it is compared with).

Made with transformers 5.25.0, torch 2.13.0+cpu, transformer_lens 4.3.0. The model is the census's tiny random
XGLMForCausalLM: CONFIG below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::bridge_attn_scores_is_pattern.

Expected: hook_pattern = softmax(hook_attn_scores). Observed: hook_attn_scores is the post-softmax pattern itself
(the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformer_lens/model_bridge/generalized_components/attention.py:895 (AttentionBridge.forward): self.hook_attn_scores, second_element, "hook_attn_scores"  -- the HF module's returned weights are post-softmax

Run: python xglm__bridge_attn_scores_is_pattern.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny xglm: the default config with every size shrunk and the structure kept.
CONFIG = {'attention_heads': 4,
          'd_model': 64,
          'ffn_dim': 128,
          'max_position_embeddings': 128,
          'num_layers': 2,
          'vocab_size': 128}
DTYPE = torch.float32  # the bridge census's dtype


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.XGLMConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.XGLMForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


from transformer_lens.model_bridge.sources import build_bridge_from_module  # noqa: E402


def bridged():
    """(raw tiny model, TransformerLens bridge around an identical copy): the builder replaces modules of the model
    it wraps, so the raw model is a second copy with the same seed."""
    raw, copy = build(), build()
    bridge = build_bridge_from_module(copy, type(copy).__name__, hf_config=copy.config)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return raw, bridge


raw, bridge = bridged()
x = torch.tensor([[3, 5, 7]])
with torch.no_grad():
    logits, cache = bridge.run_with_cache(x)
    same_logits = float((logits - raw(input_ids=x).logits).abs().max())
scores, pattern = cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"]
off = float((scores.softmax(-1) - pattern).abs().max())
print(f"expected: hook_pattern = softmax(hook_attn_scores) (TransformerLens's definition); observed: "
      f"hook_attn_scores equals hook_pattern {'exactly' if torch.equal(scores, pattern) else 'not exactly'}, and "
      f"softmax(hook_attn_scores) is off hook_pattern by {off:.3g}")
print(f"control: the bridge's logits match the raw model's to {same_logits:.3g}")
# softmax of a probability row is off the row by 1e-2 and more; float32 rounding is below 1e-6
bug = torch.equal(scores, pattern) and off > 1e-3
broken = "" if same_logits < 1e-4 else f"the bridge's logits are {same_logits:.3g} off the raw model's"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
