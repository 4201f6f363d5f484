"""minimax_m3_vl_text (MiniMaxM3VLForCausalLM): rotary_frequencies -- the census's finding, standalone.

MiniMaxM3VLTextConfig documents rotary_dim ('Number of head channels rotated by RoPE; the remaining channels are
passed through unchanged', 64 of head_dim 128 by default), but its rotary embedding sizes cos/sin from
rope_parameters' partial_rotary_factor alone (default 1.0) and apply_rotary_pos_emb turns cos.shape[-1] features:
every channel of each head turns, and the logits do not depend on rotary_dim at all.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random MiniMaxM3VLForCausalLM:
CONFIG below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::rotary_dim_ignored.

Expected: rotary_dim (the channels RoPE turns) changes the logits. Observed: they are equal at rotary_dim = head_dim
/ 2 and = head_dim (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/minimax_m3_vl/modeling_minimax_m3_vl.py:311 (MiniMaxM3VLRotaryEmbedding.compute_default_rope_parameters): dim = int(head_dim * partial_rotary_factor)  -- rotary_dim is never read
  transformers/models/minimax_m3_vl/modeling_minimax_m3_vl.py:387 (apply_rotary_pos_emb): rotary_dim = cos.shape[-1]  -- every channel cos covers turns

Run: python minimax_m3_vl_text__rotary_dim_ignored.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny minimax_m3_vl_text: the default config with every size shrunk and the structure kept.
CONFIG = {'bos_token_id': 125,
          'dense_intermediate_size': 128,
          'eos_token_id': 123,
          'head_dim': 16,
          'hidden_size': 64,
          'index_block_size': 64,
          'index_head_dim': 64,
          'intermediate_size': 128,
          'layer_types': ['full_attention', 'full_attention'],
          'max_position_embeddings': 128,
          'mlp_layer_types': ['sparse', 'sparse'],
          'num_attention_heads': 4,
          'num_experts_per_tok': 2,
          'num_hidden_layers': 2,
          'num_key_value_heads': 2,
          'num_local_experts': 4,
          'rotary_dim': 8,
          'shared_intermediate_size': 64,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.MiniMaxM3VLTextConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.MiniMaxM3VLForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
d = int(CONFIG["head_dim"])


def logits(**changes):  # the same weights (seed 0) under each config
    with torch.no_grad():
        return build(**changes)(input_ids=tokens).logits


half, whole = logits(rotary_dim=d // 2), logits(rotary_dim=d)
ignored = float((half - whole).abs().max())
print(f"expected: rotary_dim={d // 2} (half of each head turns) and rotary_dim={d} give other logits; observed: they "
      f"differ by {ignored:.3g}")
# control: the field the rotary embedding reads does change the rotated span
partial = logits(rope_parameters={**build().config.rope_parameters, "partial_rotary_factor": 0.5})
honoured = float((half - partial).abs().max())
print(f"control: partial_rotary_factor=0.5 moves them by {honoured:.3g}")
# a changed span moves them by ~0.1 and more; float64 rounding of this tiny model is below 1e-13
bug = ignored < 1e-12
broken = "" if honoured > 1e-6 else f"partial_rotary_factor moves the logits by only {honoured:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
