"""recurrent_gemma (RecurrentGemmaForCausalLM): padding_outputs -- the census's finding, standalone.

RecurrentGemma's recurrent blocks ignore attention_mask: a masked left pad's id reaches the real tokens through the
temporal convolution.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random RecurrentGemmaForCausalLM:
CONFIG below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::padding_leaks_into_real_tokens.

Expected: a masked pad's token id does not reach the real tokens. Observed: changing it moves the real tokens'
logits (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/recurrent_gemma/modeling_recurrent_gemma.py:446 (RecurrentGemmaRecurrentBlock.forward): x_branch = self.conv_1d(x_branch)[..., :seq_len]  -- the temporal convolution and the RG-LRU never read attention_mask

Run: python recurrent_gemma__padding_leaks_into_real_tokens.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny recurrent_gemma: the default config with every size shrunk and the structure kept.
CONFIG = {'attention_window_size': 64,
          'head_dim': 16,
          'hidden_size': 64,
          'intermediate_size': 128,
          'num_attention_heads': 4,
          'num_hidden_layers': 3,
          'num_key_value_heads': 4,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.RecurrentGemmaConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.RecurrentGemmaForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()
# Positions as counted from the mask (the pad at 0, the real tokens at 0 and 1), where the forward takes them.
extra = {"position_ids": torch.tensor([[0, 0, 1]])}


def logits(tokens):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor([[0, 1, 1]]), **extra).logits
    return out[:, 1:]  # the real tokens only


a, again, b = logits([[0, 5, 7]]), logits([[0, 5, 7]]), logits([[1, 5, 7]])
leak = float((a - b).abs().max())
repeat = float((a - again).abs().max())
print(f"expected: the masked pad's id (0 or 1) does not reach the real tokens (0 in float64); observed: their "
      f"logits move by {leak:.3g}")
print(f"control: the same input twice gives logits {repeat:.3g} apart (the forward is deterministic)")
# the leak is 1e-4 and more; float64 rounding of this tiny model is below 1e-13
bug = leak > 1e-9
broken = "" if repeat < 1e-12 else f"the same input gives logits {repeat:.3g} apart"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
