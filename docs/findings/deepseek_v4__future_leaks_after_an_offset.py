"""deepseek_v4 (DeepseekV4ForCausalLM): relative_position -- the census's finding, standalone.

DeepSeek-V4's compressor groups keys into windows by token index but lets query t see window w when (position_ids[t]
+ 1) // compress_rate > w: with position ids that do not start at 0 (an offset, left padding) a query sees a
compressed window holding later tokens, so earlier logits move when a later token changes.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random DeepseekV4ForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::future_leaks_after_an_offset.

Expected: with position_ids 1..4, positions 0..2 do not see token 3. Observed: their logits move when token 3
changes (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/deepseek_v4/modeling_deepseek_v4.py:448 (DeepseekV4HCACompressor.forward): causal_threshold = (position_ids + 1) // self.compress_rate  # [B, S]

Run: python deepseek_v4__future_leaks_after_an_offset.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny deepseek_v4: the default config with every size shrunk and the structure kept.
CONFIG = {'head_dim': 8,
          'hidden_size': 64,
          'index_head_dim': 64,
          'layer_types': ['heavily_compressed_attention',
                          'heavily_compressed_attention',
                          'heavily_compressed_attention',
                          'compressed_sparse_attention'],
          'max_position_embeddings': 128,
          'mlp_layer_types': ['hash_moe', 'hash_moe', 'hash_moe', 'moe'],
          'moe_intermediate_size': 128,
          'n_routed_experts': 4,
          'num_attention_heads': 4,
          'num_experts_per_tok': 2,
          'num_hidden_layers': 4,
          'o_lora_rank': 64,
          'q_lora_rank': 48,
          'qk_rope_head_dim': 8,
          'sliding_window': 8,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.DeepseekV4Config(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()
a, b = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 9]])  # differ only at the last token
moved = {}
with torch.no_grad():
    for offset in (0, 1):
        ids = torch.arange(4)[None] + offset
        la, lb = model(a, position_ids=ids).logits, model(b, position_ids=ids).logits
        moved[offset] = float((la[:, :3] - lb[:, :3]).abs().max())
print(f"expected: positions 0..2 do not see token 3 (causal); observed with position_ids 1..4: their logits move by "
      f"{moved[1]:.3g} when token 3 changes")
print(f"control: with position_ids 0..3 they move by {moved[0]:.3g}")
# the leak is 1e-2 and more; float64 rounding of this tiny model is below 1e-13
bug = moved[1] > 1e-6
broken = "" if moved[0] < 1e-12 else f"with position_ids 0..3 the past moves by {moved[0]:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
