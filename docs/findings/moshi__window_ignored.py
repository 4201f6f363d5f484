"""moshi (MoshiForCausalLM): sliding_window, window_layout -- the census's finding, standalone.

MoshiConfig declares sliding_window (3000 by default, 'Sliding window attention window size'), but MoshiModel masks
with create_causal_mask and MoshiAttention passes no sliding_window to its attention function: no window is applied,
every query sees every earlier key.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random MoshiForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::window_ignored.

Expected: no query attends to a key further back than config.sliding_window. Observed: the last of w + 2 queries
puts weight on key 0 (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/moshi/modeling_moshi.py:512 (MoshiDecoderLayer.__init__): self.sliding_window = config.sliding_window  -- stored, never passed on
  transformers/models/moshi/modeling_moshi.py:480 (MoshiAttention.forward): attn_output, attn_weights = attention_interface(  -- no sliding_window=
  transformers/models/moshi/modeling_moshi.py:779 (MoshiModel.forward): causal_mask = create_causal_mask(  -- no sliding-window mask

Run: python moshi__window_ignored.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny moshi: the default config with every size shrunk and the structure kept.
CONFIG = {'audio_encoder_config': {'codebook_dim': 64,
                                   'codebook_size': 64,
                                   'head_dim': 16,
                                   'hidden_size': 64,
                                   'intermediate_size': 128,
                                   'max_position_embeddings': 128,
                                   'model_type': 'mimi',
                                   'num_attention_heads': 4,
                                   'num_hidden_layers': 2,
                                   'num_key_value_heads': 4,
                                   'sliding_window': 8,
                                   'vector_quantization_hidden_dimension': 64},
          'depth_decoder_config': {'audio_vocab_size': 128,
                                   'ffn_dim': 128,
                                   'head_dim': 16,
                                   'hidden_size': 64,
                                   'input_size': 64,
                                   'model_type': 'moshi_depth',
                                   'num_attention_heads': 4,
                                   'num_hidden_layers': 2,
                                   'num_key_value_heads': 4,
                                   'vocab_size': 128},
          'ffn_dim': 128,
          'head_dim': 16,
          'hidden_size': 64,
          'max_position_embeddings': 128,
          'num_attention_heads': 4,
          'num_hidden_layers': 2,
          'num_key_value_heads': 4,
          'sliding_window': 8,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.MoshiConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.MoshiForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()
model.set_attn_implementation("eager")  # the weights are only returned by the eager path
w = int(model.config.sliding_window)
tokens = torch.arange(w + 2)[None] % model.config.vocab_size
with torch.no_grad():
    out = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_attentions=True)
# the last query (w + 1) and key 0 are w + 1 apart: outside a window of w under either convention (i - w < j, or
# i - j <= w), so a windowed softmax gives key 0 exactly 0
seen = min(float(a[0, :, w + 1, 0].min()) for a in out.attentions)
print(f"expected: config.sliding_window={w}, so query {w + 1} puts weight 0 on key 0 (distance {w + 1}); "
      f"observed: at least {seen:.3g} in every layer and head")
# the leaked weight is about 1 / (w + 2); a masked key's weight is exactly 0
bug = seen > 1e-6
broken = ""

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
