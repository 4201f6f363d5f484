"""jamba (JambaForCausalLM): kv_cache -- the census's finding, standalone.

Jamba's cached decoding of a chunk of several new tokens gives other logits than a full forward (2.3e-6 in float64,
its Mamba mixer's multi-token path under a cache); one token at a time is exact.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random JambaForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::cached_chunk_differs.

Expected: cached decoding of a chunk of two tokens equals the full forward. Observed: it is off; one token at a time
is exact (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/jamba/modeling_jamba.py:555 (mamba_scan_forward): # TODO Cyril: since `jamba_selective_scan` does not take the past state, it is WRONG if the cache is not empty. This is a very
  transformers/models/jamba/modeling_jamba.py:557 (mamba_scan_forward): scan_output = mamba_selective_scan(  -- a chunk of several tokens after the cache's state starts the scan from zero

Run: python jamba__cached_chunk_differs.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny jamba: the default config with every size shrunk and the structure kept.
CONFIG = {'attn_layer_offset': 1,
          'attn_layer_period': 2,
          'hidden_size': 64,
          'intermediate_size': 128,
          'mamba_dt_rank': 64,
          'max_position_embeddings': 128,
          'num_attention_heads': 4,
          'num_experts': 4,
          'num_hidden_layers': 2,
          'num_key_value_heads': 2,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.JambaConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.JambaForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()
tokens = torch.tensor([[1, 0, 1]])
gaps = {}
with torch.no_grad():
    full = model(tokens, use_cache=False).logits
    for split in ((1, 1, 1), (1, 2)):
        cache, outs, i = None, [], 0
        for n in split:
            out = model(tokens[:, i:i + n], use_cache=True, **({} if cache is None else {"cache": cache}))
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            outs.append(out.logits)
            i += n
        gaps[split] = float((torch.cat(outs, 1) - full).abs().max())
print(f"expected: cached decoding of a chunk of two tokens equals the full forward (0 in float64); observed: off by "
      f"{gaps[(1, 2)]:.3g}")
print(f"control: one token at a time is off by {gaps[(1, 1, 1)]:.3g}")
# the chunk's gap is ~2e-6; float64 rounding of this tiny model is below 1e-13
bug = gaps[(1, 2)] > 1e-8
broken = "" if gaps[(1, 1, 1)] < 1e-12 else "one token at a time is not exact"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
