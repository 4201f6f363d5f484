"""recurrent_gemma (RecurrentGemmaForCausalLM): kv_cache -- the census's finding, standalone.

RecurrentGemma's recurrent block takes every call of more than one token for a fresh prefill and drops the conv and
RG-LRU state its cache holds, so cached decoding in chunks of several tokens differs from a full forward (one token
at a time is exact).

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random RecurrentGemmaForCausalLM:
CONFIG below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::chunked_prefill_drops_state.

Expected: cached decoding in chunks equals the full forward. Observed: a chunk of three tokens after the prompt is
off; one token at a time is exact (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/recurrent_gemma/modeling_recurrent_gemma.py:444 (RecurrentGemmaRecurrentBlock.forward): if position_ids.shape[1] != 1:  # prefill

Run: python recurrent_gemma__chunked_prefill_drops_state.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
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
tokens = torch.tensor([[2, 1, 5, 7, 9, 3]])
gaps = {}
with torch.no_grad():
    model(tokens[:, :2])  # sets up the recurrent states the cached calls below reset
    full = model(tokens, use_cache=False).logits
    for split in ((2, 1, 1, 1, 1), (2, 1, 3)):
        model.model._setup_cache(model.config, 1, tokens.device, torch.float64)  # a fresh state, as generate() has
        cache, outs, i = transformers.DynamicCache(config=model.config), [], 0
        for n in split:
            ids = torch.arange(i, i + n)[None]
            outs.append(model(tokens[:, i:i + n], position_ids=ids, use_cache=True, cache=cache).logits)
            i += n
        gaps[split] = float((torch.cat(outs, 1) - full).abs().max())
print(f"expected: cached decoding in chunks equals the full forward (0 in float64); observed: prompt 2, then 1, then "
      f"a chunk of 3 is off by {gaps[(2, 1, 3)]:.3g}")
print(f"control: chunks of one token are off by {gaps[(2, 1, 1, 1, 1)]:.3g}")
# the dropped state moves logits by 1e-3 and more; float64 rounding of this tiny model is below 1e-13
bug = gaps[(2, 1, 3)] > 1e-6
broken = "" if gaps[(2, 1, 1, 1, 1)] < 1e-9 else "one token at a time is not exact"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
