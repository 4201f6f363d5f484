"""bart (BartForCausalLM): padding_outputs, kv_cache -- the census's finding, standalone.

its causal-LM forward takes no position_ids and numbers learned positions by index, so a masked left pad moves every
real token one position on (the mask itself works: the pad's id changes nothing); left-padded batches give other
logits than the unpadded prompt.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random BartForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_witness.py::left_padding_moves_positions.

Expected: a masked left pad changes no real token's logits, cached or not. Observed: they move: every real token is
numbered one position on (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/bart/modeling_bart.py:1240 (BartForCausalLM.forward): def forward(  -- no position_ids parameter
  transformers/models/bart/modeling_bart.py:622 (BartDecoder.forward): position_ids = torch.arange(seq_length, device=inputs_embeds.device) + cache_length

Run: python bart__left_padding_moves_positions.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny bart: the default config with every size shrunk and the structure kept.
CONFIG = {'d_model': 64,
          'decoder_attention_heads': 4,
          'decoder_ffn_dim': 128,
          'decoder_layers': 2,
          'encoder_attention_heads': 4,
          'encoder_ffn_dim': 128,
          'encoder_layers': 2,
          'id2label': {0: 'LABEL_0', 1: 'LABEL_1'},
          'is_decoder': True,
          'max_position_embeddings': 128,
          'vocab_size': 128}
DTYPE = torch.float64  # no rounding can blur the evidence


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.BartConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.BartForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


model = build()


def logits(tokens, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits


# The same real tokens [5, 7], alone and after one masked left pad (id 0, then id 1).
plain = logits([[5, 7]], [[1, 1]])
padded = logits([[0, 5, 7]], [[0, 1, 1]])[:, 1:]
other_pad = logits([[1, 5, 7]], [[0, 1, 1]])[:, 1:]
moved = float((plain - padded).abs().max())
pad_seen = float((padded - other_pad).abs().max())
print(f"expected: a masked left pad leaves the real tokens' logits unchanged (0 up to {DTYPE}'s rounding); "
      f"observed: they move "
      f"by {moved:.3g}")
print(f"control: changing the masked pad's id moves them by {pad_seen:.3g} (the mask itself works)")
check_cache = True  # the type's kv_cache finding: the same numbering met through the cache
cached_moved = 0.0
if check_cache:
    # cached decoding of the left-padded prompt [pad, 5] then 7, as generate() runs it, against the unpadded forward
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[0, 5]]), attention_mask=torch.tensor([[0, 1]]), use_cache=True)
        step = model(input_ids=torch.tensor([[7]]), attention_mask=torch.tensor([[0, 1, 1]]),
                     past_key_values=out.past_key_values, use_cache=True).logits[:, -1]
    cached_moved = float((step - plain[:, -1]).abs().max())
    print(f"expected: cached decoding after a masked left pad gives the unpadded logits; observed: off by "
          f"{cached_moved:.3g}")
# the bug moves logits by 1e-2 and more (positions one on); rounding of this tiny model is below 1e-13 in float64,
# 1e-6 in float32
rounding = 1e-10 if DTYPE == torch.float64 else 1e-5
bug = moved > 1e-4 and (cached_moved > 1e-4 or not check_cache)
broken = "" if pad_seen < rounding else f"the pad's id moves the logits by {pad_seen:.3g}"

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
