"""openai-gpt (OpenAIGPTLMHeadModel): causal_outputs, causal_pattern, attention_scale -- the bridge census's finding, standalone.

TransformerLens's bridge for OpenAI GPT, given an attention_mask (even all ones), attends without its causal mask:
position 0's logits move when a later token changes and differ from the raw HF model's, which is causal (the zoo's
finding; without the mask argument the bridge is causal).

This one needs transformer_lens: the bug is in TransformerLens's bridge (the raw transformers model is the reference
it is compared with).

Made with transformers 5.25.0, torch 2.13.0+cpu, transformer_lens 4.3.0. The model is the census's tiny random
OpenAIGPTLMHeadModel: CONFIG below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::bridge_not_causal.

Expected: the bridge, given attention_mask=[[1, 1]], is causal like the raw model. Observed: position 0's logits
move when token 1 changes (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformer_lens/model_bridge/generalized_components/attention.py:602 (AttentionBridge._apply_reconstruct_attention_mask): use_direct_hf_mask = attention_mask is not None and attention_mask.ndim >= 4  -- OpenAI GPT's 4D mask holds padding only (its causal mask is the attention's `bias` buffer)
  transformers/models/openai/modeling_openai.py:357 (OpenAIGPTModel.forward): attention_mask = attention_mask.unsqueeze(1).unsqueeze(2)

Run: python openai_gpt__bridge_not_causal.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny openai-gpt: the default config with every size shrunk and the structure kept.
CONFIG = {'n_embd': 64, 'n_head': 4, 'n_layer': 2, 'n_positions': 128, 'vocab_size': 128}
DTYPE = torch.float32  # the bridge census's dtype


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.OpenAIGPTConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.OpenAIGPTLMHeadModel._from_config(config, dtype=dtype)
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
first, second = torch.tensor([[3, 5]]), torch.tensor([[3, 9]])  # differ only at position 1
ones = torch.ones_like(first)
with torch.no_grad():
    raw_moves = float((raw(input_ids=second, attention_mask=ones).logits
                       - raw(input_ids=first, attention_mask=ones).logits)[0, 0].abs().max())
    br_a, br_b = bridge(first, attention_mask=ones), bridge(second, attention_mask=ones)
    unmasked = float((bridge(second) - bridge(first))[0, 0].abs().max())
    differs = float((br_a - raw(input_ids=first, attention_mask=ones).logits).abs().max())
br_moves = float((br_b - br_a)[0, 0].abs().max())
print(f"expected: with attention_mask=[[1, 1]], position 0's logits do not see token 1 (raw model: {raw_moves:.3g}); "
      f"observed through the bridge: they move by {br_moves:.3g}, and differ from the raw model's by {differs:.3g}")
print(f"control: the bridge without the mask argument moves them by {unmasked:.3g}")
# the leak is 1e-3 and more; the raw model and the unmasked bridge are exactly causal (0)
bug = br_moves > 1e-6 and differs > 1e-6
broken = "" if raw_moves == 0.0 and unmasked == 0.0 else "the raw model or the unmasked bridge is not causal"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
