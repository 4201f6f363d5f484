"""gemma4_unified (Gemma4UnifiedForConditionalGeneration): kernel_consistency -- the bridge census's finding, standalone.

TransformerLens's bridge fires hook_v with v_proj's output, before Gemma 4's v_norm, while the attention reads the
normalized values: hook_pattern . hook_v is not hook_z; the bridge's logits equal the raw model's.

This one needs transformer_lens: the bug is in TransformerLens's bridge (the raw transformers model is the reference
it is compared with).

Made with transformers 5.25.0, torch 2.13.0+cpu, transformer_lens 4.3.0. The model is the census's tiny random
Gemma4UnifiedForConditionalGeneration: CONFIG below, weights from torch.manual_seed(0), no download. Witness in
attnlab: tests/helpers/census_witness.py::bridge_v_before_v_norm.

Expected: hook_z = hook_pattern . hook_v. Observed: hook_v is taken before v_norm (the script prints both, with the
numbers).

Lines at fault (the installed source when this file was made):
  transformer_lens/model_bridge/generalized_components/attention.py:49 (AttentionBridge): "hook_v": "v.hook_out",
  transformers/models/gemma4_unified/modeling_gemma4_unified.py:406 (Gemma4UnifiedTextAttention.forward): value_states = self.v_norm(value_states)

Run: python gemma4_unified__bridge_v_before_v_norm.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny gemma4_unified: the default config with every size shrunk and the structure kept.
CONFIG = {'text_config': {'head_dim': 16,
                          'hidden_size': 64,
                          'intermediate_size': 128,
                          'layer_types': ['sliding_attention',
                                          'sliding_attention',
                                          'sliding_attention',
                                          'sliding_attention',
                                          'sliding_attention',
                                          'full_attention'],
                          'max_position_embeddings': 128,
                          'model_type': 'gemma4_unified_text',
                          'num_attention_heads': 4,
                          'num_hidden_layers': 6,
                          'num_key_value_heads': 2,
                          'sliding_window': 8,
                          'vocab_size': 128}}
DTYPE = torch.float32  # the bridge census's dtype


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.Gemma4UnifiedConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.Gemma4UnifiedForConditionalGeneration._from_config(config, dtype=dtype)
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



def per_head(v, n_heads):
    """[batch, pos, kv_heads, d] repeated to the query heads (grouped-query attention), as the kernel shares them."""
    return v.repeat_interleave(n_heads // v.shape[2], dim=2)


def pattern_v(cache, layer, v):
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
    return torch.einsum("bhqk,bkhd->bqhd", pattern, per_head(v, pattern.shape[1]))


raw, bridge = bridged()
x = torch.tensor([[3, 5, 7]])
reads, handles = {}, []  # the raw model's own o_proj inputs and v_norm outputs, per layer index
for name, module in raw.named_modules():
    layer = next((part for part in name.split(".") if part.isdigit()), None)
    if name.endswith("self_attn.o_proj"):
        handles.append(module.register_forward_pre_hook(
            lambda m, args, key=f"o_in.{layer}": reads.__setitem__(key, args[0])))
    elif name.endswith("self_attn.v_norm"):
        handles.append(module.register_forward_hook(
            lambda m, args, out, key=f"v_norm.{layer}": reads.__setitem__(key, out)))
with torch.no_grad():
    logits, cache = bridge.run_with_cache(x)
    gap = float((logits - raw(input_ids=x).logits).abs().max())
for handle in handles:
    handle.remove()

layers = sorted(int(k.split(".")[1]) for k in reads if k.startswith("v_norm."))
normed = {i: reads[f"v_norm.{i}"] for i in layers}
normed = {i: v if v.shape[1] == cache[f"blocks.{i}.attn.hook_v"].shape[1] else v.transpose(1, 2)
          for i, v in normed.items()}  # [batch, heads, pos, d] where the module keeps heads first
z = {i: cache[f"blocks.{i}.attn.hook_z"] for i in layers}
with_norm = max(float((pattern_v(cache, i, normed[i]) - z[i]).abs().max()) for i in layers)
off = max(float((pattern_v(cache, i, cache[f"blocks.{i}.attn.hook_v"]) - z[i]).abs().max()) for i in layers)
print(f"expected: hook_z = hook_pattern . hook_v (TransformerLens's z); observed: off by up to {off:.3g}, while "
      f"hook_pattern . v_norm(v) matches hook_z to {with_norm:.3g} in layers {layers}")
print(f"control: the bridge's logits match the raw model's to {gap:.3g}")
# v_norm rescales v by factors far from 1 (gap 1e-1 and more); float32 rounding is below 1e-5
bug = off > 1e-2 and with_norm < 1e-4
broken = "" if layers and gap < 1e-4 else f"no v_norm found, or the bridge's logits are {gap:.3g} off the raw model's"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
