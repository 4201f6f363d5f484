"""prophetnet (ProphetNetForCausalLM): kv_cache -- the census's finding, standalone.

ProphetNet's decoder gives a position other logits when more positions follow it (position 0 moves by ~1.6e-3 in
float64 when one token is appended, whatever its id), so cached decoding, which runs the shorter sequence first,
differs from a full recompute.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random ProphetNetForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::logits_depend_on_length.

Expected: position 0's logits do not depend on the positions after it, so cached decoding equals the full forward.
Observed: appending a token moves them, whatever its id (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/prophetnet/modeling_prophetnet.py:1147 (ProphetNetDecoder.forward): main_stream_pos_embed, position_ids = self.position_embeddings(  -- where to start: the script shows the effect, the line is not pinned
  transformers/models/prophetnet/modeling_prophetnet.py:1274 (ProphetNetDecoder.compute_buffered_relative_buckets): def compute_buffered_relative_buckets(self, position_ids):  -- where to start: the script shows the effect, the line is not pinned

Run: python prophetnet__logits_depend_on_length.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny prophetnet: the default config with every size shrunk and the structure kept.
CONFIG = {'decoder_ffn_dim': 128,
          'encoder_ffn_dim': 128,
          'hidden_size': 64,
          'is_decoder': True,
          'max_position_embeddings': 128,
          'num_decoder_attention_heads': 4,
          'num_decoder_layers': 2,
          'num_encoder_layers': 2,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.ProphetNetConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.ProphetNetForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()
with torch.no_grad():
    def first(ids):  # position 0's logits for the sequence ids
        return model(torch.tensor([ids])).logits[0, 0]

    by_length = float((first([0]) - first([0, 0])).abs().max())
    by_token = float((first([0, 0]) - first([0, 5])).abs().max())
    tokens = torch.tensor([[0, 0, 5, 7]])
    full = model(tokens).logits
    out = model(tokens[:, :1], use_cache=True)
    steps = [out.logits[:, -1]]
    for i in range(1, tokens.shape[1]):
        out = model(tokens[:, i:i + 1], past_key_values=out.past_key_values, use_cache=True)
        steps.append(out.logits[:, -1])
cached = float((torch.stack(steps, 1) - full).abs().max())
print(f"expected: position 0's logits do not depend on later positions (0 in float64); observed: they move by "
      f"{by_length:.3g} when one token is appended")
print(f"control: changing the appended token's id moves them by {by_token:.3g}")
print(f"expected: cached decoding equals the full forward; observed: off by {cached:.3g}")
# the bug is ~1e-3; float64 rounding of this tiny model is below 1e-13
bug = by_length > 1e-6 and cached > 1e-6
broken = "" if by_token < 1e-12 else f"the appended token's id moves position 0 by {by_token:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
