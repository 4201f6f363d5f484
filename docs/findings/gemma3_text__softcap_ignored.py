"""gemma3_text (Gemma3ForCausalLM): attention_scale -- the variants census's finding, standalone.

Gemma3TextConfig declares attn_logit_softcapping ('scaling factor when applying tanh softcapping on the attention
scores'), but Gemma3Attention.forward passes no softcap to its attention function (Gemma2Attention passes
softcap=self.attn_logit_softcapping): the scores are never capped, whatever the value (float64 logits with a cap of
0.01 equal those without one).

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random Gemma3ForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_variant_witness.py::softcap_ignored.

Expected: attn_logit_softcapping caps the attention scores, so a cap of 0.01 changes the logits. Observed: they are
exactly the uncapped model's (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/gemma3/modeling_gemma3.py:306 (Gemma3Attention.__init__): self.attn_logit_softcapping = self.config.attn_logit_softcapping  -- stored, never passed on
  transformers/models/gemma3/modeling_gemma3.py:342 (Gemma3Attention.forward): attn_output, attn_weights = attention_interface(  -- no softcap=

Run: python gemma3_text__softcap_ignored.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny gemma3_text: the default config with every size shrunk and the structure kept.
CONFIG = {'attn_logit_softcapping': 50.0,
          'head_dim': 16,
          'hidden_size': 64,
          'intermediate_size': 128,
          'layer_types': ['sliding_attention',
                          'sliding_attention',
                          'sliding_attention',
                          'sliding_attention',
                          'sliding_attention',
                          'full_attention'],
          'max_position_embeddings': 128,
          'num_attention_heads': 4,
          'num_hidden_layers': 6,
          'num_key_value_heads': 2,
          'sliding_window': 8,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.Gemma3TextConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
plain, capped = build(attn_logit_softcapping=None), build(attn_logit_softcapping=0.01)  # the same weights (seed 0)


def logits(model):
    with torch.no_grad():
        return model(input_ids=tokens).logits


# A cap of 0.01 squeezes every attention score into (-0.01, 0.01): the attention turns near uniform.
ignored = float((logits(capped) - logits(plain)).abs().max())
print(f"expected: attn_logit_softcapping=0.01 changes the logits; observed: they differ from the uncapped model's "
      f"by {ignored:.3g}")


# control: the same capped model through an attention function that applies config.attn_logit_softcapping itself
# (Gemma 2's eager kernel, given softcap= as Gemma2Attention passes it), so a cap that is applied is seen
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as capped_eager


def applies_the_cap(module, query, key, value, attention_mask, **kwargs):
    kwargs["softcap"] = module.config.attn_logit_softcapping
    return capped_eager(module, query, key, value, attention_mask, **kwargs)


transformers.AttentionInterface.register("applies_the_cap", applies_the_cap)
capped.set_attn_implementation("applies_the_cap")
applied = float((logits(capped) - logits(plain)).abs().max())
print(f"control: with the cap applied the logits move by {applied:.3g}")
# an applied cap moves them by ~1e-3 and more; float64 rounding of this tiny model is below 1e-13
bug = ignored < 1e-12
broken = "" if applied > 1e-6 else f"an applied cap moves the logits by only {applied:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
