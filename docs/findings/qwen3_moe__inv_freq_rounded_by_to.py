"""qwen3_moe (Qwen3MoeForCausalLM): rotary_precision, rotary_frequencies -- the variants census's finding, standalone.

At float16 and bfloat16 the census checks a copy cast by Module.to(dtype), as model.half() casts: transformers
rounds the rotary inv_freq buffer to the dtype with it (transformers #25681), so the rotation at high positions is
off a float64 rotation of its own inputs by tens of u (22.6 u at position 127 in float16; 1.1 u for the same model
built at float16, whose inv_freq stays float32, as from_pretrained(dtype=...) keeps it). Which configs cross the
allowance depends on the head size.

Made with transformers 5.25.0, torch 2.13.0+cpu. The model is the census's tiny random Qwen3MoeForCausalLM: CONFIG
below, weights from torch.manual_seed(0), no download. Witness in attnlab:
tests/helpers/census_variant_witness.py::inv_freq_rounded_by_to.

Expected: the float16 and bfloat16 rotations at position 127 are within a few u of a float64 rotation. Observed:
after .to(dtype) one is 8 u and more off (inv_freq rounded to the dtype) (the script prints both, with the numbers).

Lines at fault (the installed source when this file was made):
  transformers/models/qwen3_moe/modeling_qwen3_moe.py:395 (Qwen3MoeRotaryEmbedding.__init__): self.inv_freq = nn.Buffer(inv_freq, persistent=False)  -- a buffer, so Module.to(float16) rounds it

Run: python qwen3_moe__inv_freq_rounded_by_to.py  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control
the witness relies on fails).
"""

import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny qwen3_moe: the default config with every size shrunk and the structure kept.
CONFIG = {'hidden_size': 96,
          'intermediate_size': 128,
          'max_position_embeddings': 128,
          'moe_intermediate_size': 128,
          'num_attention_heads': 3,
          'num_experts_per_tok': 2,
          'num_hidden_layers': 2,
          'num_key_value_heads': 3,
          'num_local_experts': 4,
          'vocab_size': 128}
DTYPE = torch.float32  # each use picks its dtype


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.Qwen3MoeConfig(**{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


import transformers.models.qwen3_moe.modeling_qwen3_moe as modeling  # noqa: E402  (the module whose apply_rotary_pos_emb is observed)


def rotation_error(model, position=127):
    """Largest per-head relative error of the model's own rotation of q and k at position 127 against a float64
    rotation (Su et al. 2021 eq. 34, rotate_half layout) of the same inputs, over a few one-token inputs."""
    inner, seen = modeling.apply_rotary_pos_emb, []

    def spy(q, k, cos, sin, *args, **kwargs):
        out = inner(q, k, cos, sin, *args, **kwargs)
        seen.append(((q, out[0]), (k, out[1])))
        return out

    config = model.config
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    angle = position * config.rope_parameters["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angle.cos().repeat(2), angle.sin().repeat(2)
    worst = 0.0
    modeling.apply_rotary_pos_emb = spy
    try:
        for token in range(0, 128, 9):
            seen.clear()
            with torch.no_grad():
                model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[position]]))
            for x, turned in seen[0]:
                x = x.double()
                exact = x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin
                worst = max(worst, float(((turned.double() - exact).norm(dim=-1) / exact.norm(dim=-1)).max()))
    finally:
        modeling.apply_rotary_pos_emb = inner
    return worst


bug, broken = False, ""
for dtype in (torch.float16, torch.bfloat16):
    cast = build(torch.float32).to(dtype)  # as model.half() casts: inv_freq is rounded to the dtype with it
    built = build(dtype)  # built at the dtype, as from_pretrained(dtype=...) does: inv_freq stays float32
    u = torch.finfo(dtype).eps / 2  # the dtype's unit roundoff
    rounded, kept = rotation_error(cast) / u, rotation_error(built) / u
    print(f"expected: the {dtype} rotation at position 127 is within a few u of a float64 rotation of its own "
          f"inputs (built at {dtype}: {kept:.1f} u, inv_freq {built.model.rotary_emb.inv_freq.dtype}); observed "
          f"after .to({dtype}): {rounded:.1f} u (inv_freq {cast.model.rotary_emb.inv_freq.dtype})")
    # a rounded inv_freq gives 8 u and more at position 127, many times what the same code gives with a float32
    # inv_freq (under 2 u: the dtype's own rounding of q, k, cos and sin)
    bug = bug or (rounded > 8 and rounded > 4 * kept)
    broken = broken or ("" if kept < 2 else f"built at {dtype} the rotation is already {kept:.1f} u off")

if broken:
    print("a control failed: " + broken + "; the witness's premise no longer holds, look at this script")
    sys.exit(2)
print("BUG PRESENT" if bug else "fixed: behaves as expected")
sys.exit(1 if bug else 0)
