"""The bodies of the standalone reproductions of the variants census's and the bridge census's findings.

As in reports/census/repro_templates.py: each follows the script's header, mirrors its witness
(tests/helpers/census_variant_witness.py, tests/helpers/census_witness.py's bridge witnesses) and ends with the shared
verdict. The bridge bodies wrap the model with TransformerLens's public ``build_bridge_from_module``, as the bridge
census does, and compare with a second copy of the raw model (the same seed gives the same weights).
"""

from __future__ import annotations

LONGROPE_CACHED_STEP_DIFFERS = '''
TOKENS = torch.tensor([[3, 5, 7, 11, 13, 17]])


def cached_against_full(rope_parameters, prefill=3):
    """Largest |logit| gap between decoding TOKENS one token at a time after a prefill and one full forward."""
    model = build(rope_parameters=rope_parameters)
    with torch.no_grad():
        full = model(input_ids=TOKENS).logits
        out = model(input_ids=TOKENS[:, :prefill], use_cache=True)
        past, steps = out.past_key_values, [out.logits[:, -1]]
        for i in range(prefill, TOKENS.shape[1]):
            out = model(input_ids=TOKENS[:, i:i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            steps.append(out.logits[:, -1])
    return float((torch.stack(steps, 1) - full[:, prefill - 1:]).abs().max())


# LongRoPE as Phi-3 ships it (a factor per rotated pair) with original_max_position_embeddings=4, so the 6 tokens
# cross the switch from short_factor to long_factor; the same model under default rope as the control
LONGROPE = $LONGROPE
DEFAULT = $DEFAULT_ROPE
moved, exact = cached_against_full(LONGROPE), cached_against_full(DEFAULT)
print(f"expected: cached decoding past original_max_position_embeddings=4 equals the full forward (0 in float64); "
      f"observed under longrope: off by {moved:.3g}")
print(f"control: under default rope, off by {exact:.3g}")
# the stale short-factor keys move logits by 1e-4 and more; default rope is exact to float64 rounding (below 1e-13),
# or to the float32 a model computes inside (DeepSeek-V3's router: 2e-8)
bug = moved > 1e-6 and moved > 1e4 * exact
broken = "" if exact < 1e-7 else f"default rope is off by {exact:.3g}"
'''

INV_FREQ_ROUNDED_BY_TO = '''
import $MODELING as modeling  # noqa: E402  (the module whose apply_rotary_pos_emb is observed)


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
'''

_BRIDGE = '''
from transformer_lens.model_bridge.sources import build_bridge_from_module  # noqa: E402


def bridged():
    """(raw tiny model, TransformerLens bridge around an identical copy): the builder replaces modules of the model
    it wraps, so the raw model is a second copy with the same seed."""
    raw, copy = build(), build()
    bridge = build_bridge_from_module(copy, type(copy).__name__, hf_config=copy.config)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return raw, bridge

'''

BRIDGE_NOT_CAUSAL = _BRIDGE + '''
raw, bridge = bridged()
first, second = torch.tensor([[3, 5]]), torch.tensor([[3, 9]])  # differ only at position 1
ones = torch.ones_like(first)
with torch.no_grad():
    raw_moves = float((raw(input_ids=second, attention_mask=ones).logits
                       - raw(input_ids=first, attention_mask=ones).logits)[0, 0].abs().max())
    br_a, br_b = bridge(first, attention_mask=ones), bridge(second, attention_mask=ones)
    unmasked = float((bridge(second) - bridge(first))[0, 0].abs().max())
    differs = float((br_a - raw(input_ids=first, attention_mask=ones).logits).abs().max())
br_moves = float((br_b - br_a)[0, 0].abs().max())
print(f"expected: with attention_mask=[[1, 1]], position 0's logits do not see token 1 (raw model: {raw_moves:.3g}); "
      f"observed through the bridge: they move by {br_moves:.3g}, and differ from the raw model's by {differs:.3g}")
print(f"control: the bridge without the mask argument moves them by {unmasked:.3g}")
# the leak is 1e-3 and more; the raw model and the unmasked bridge are exactly causal (0)
bug = br_moves > 1e-6 and differs > 1e-6
broken = "" if raw_moves == 0.0 and unmasked == 0.0 else "the raw model or the unmasked bridge is not causal"
'''

BRIDGE_ATTN_SCORES_IS_PATTERN = _BRIDGE + '''
raw, bridge = bridged()
x = torch.tensor([[3, 5, 7]])
with torch.no_grad():
    logits, cache = bridge.run_with_cache(x)
    same_logits = float((logits - raw(input_ids=x).logits).abs().max())
scores, pattern = cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"]
off = float((scores.softmax(-1) - pattern).abs().max())
print(f"expected: hook_pattern = softmax(hook_attn_scores) (TransformerLens's definition); observed: "
      f"hook_attn_scores equals hook_pattern {'exactly' if torch.equal(scores, pattern) else 'not exactly'}, and "
      f"softmax(hook_attn_scores) is off hook_pattern by {off:.3g}")
print(f"control: the bridge's logits match the raw model's to {same_logits:.3g}")
# softmax of a probability row is off the row by 1e-2 and more; float32 rounding is below 1e-6
bug = torch.equal(scores, pattern) and off > 1e-3
broken = "" if same_logits < 1e-4 else f"the bridge's logits are {same_logits:.3g} off the raw model's"
'''

_READS = _BRIDGE + '''

def per_head(v, n_heads):
    """[batch, pos, kv_heads, d] repeated to the query heads (grouped-query attention), as the kernel shares them."""
    return v.repeat_interleave(n_heads // v.shape[2], dim=2)


def pattern_v(cache, layer, v):
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
    return torch.einsum("bhqk,bkhd->bqhd", pattern, per_head(v, pattern.shape[1]))


raw, bridge = bridged()
x = torch.tensor([[3, 5, 7]])
reads, handles = {}, []  # the raw model's own o_proj inputs and v_norm outputs, per layer index
for name, module in raw.named_modules():
    layer = next((part for part in name.split(".") if part.isdigit()), None)
    if name.endswith("self_attn.o_proj"):
        handles.append(module.register_forward_pre_hook(
            lambda m, args, key=f"o_in.{layer}": reads.__setitem__(key, args[0])))
    elif name.endswith("self_attn.v_norm"):
        handles.append(module.register_forward_hook(
            lambda m, args, out, key=f"v_norm.{layer}": reads.__setitem__(key, out)))
with torch.no_grad():
    logits, cache = bridge.run_with_cache(x)
    gap = float((logits - raw(input_ids=x).logits).abs().max())
for handle in handles:
    handle.remove()
'''

BRIDGE_Z_IS_O_PROJ_INPUT = _READS + '''
layers = sorted(int(k.split(".")[1]) for k in reads if k.startswith("o_in."))
z = {i: cache[f"blocks.{i}.attn.hook_z"] for i in layers}
at_o = max(float((z[i].flatten(2) - reads[f"o_in.{i}"]).abs().max()) for i in layers)
off = max(float((pattern_v(cache, i, cache[f"blocks.{i}.attn.hook_v"]) - z[i]).abs().max()) for i in layers)
print(f"expected: hook_z = hook_pattern . hook_v (TransformerLens's z); observed: hook_z is off it by up to {off:.3g} "
      f"and equals o_proj's input (after $STEP) to {at_o:.3g} in layers {layers}")
print(f"control: the bridge's logits match the raw model's to {gap:.3g}")
# the step between kernel and o_proj moves z by 1e-1 and more; float32 rounding is below 1e-5
bug = off > 1e-2 and at_o < 1e-4
broken = "" if layers and gap < 1e-4 else f"no o_proj found, or the bridge's logits are {gap:.3g} off the raw model's"
'''

BRIDGE_V_BEFORE_V_NORM = _READS + '''
layers = sorted(int(k.split(".")[1]) for k in reads if k.startswith("v_norm."))
normed = {i: reads[f"v_norm.{i}"] for i in layers}
normed = {i: v if v.shape[1] == cache[f"blocks.{i}.attn.hook_v"].shape[1] else v.transpose(1, 2)
          for i, v in normed.items()}  # [batch, heads, pos, d] where the module keeps heads first
z = {i: cache[f"blocks.{i}.attn.hook_z"] for i in layers}
with_norm = max(float((pattern_v(cache, i, normed[i]) - z[i]).abs().max()) for i in layers)
off = max(float((pattern_v(cache, i, cache[f"blocks.{i}.attn.hook_v"]) - z[i]).abs().max()) for i in layers)
print(f"expected: hook_z = hook_pattern . hook_v (TransformerLens's z); observed: off by up to {off:.3g}, while "
      f"hook_pattern . v_norm(v) matches hook_z to {with_norm:.3g} in layers {layers}")
print(f"control: the bridge's logits match the raw model's to {gap:.3g}")
# v_norm rescales v by factors far from 1 (gap 1e-1 and more); float32 rounding is below 1e-5
bug = off > 1e-2 and with_norm < 1e-4
broken = "" if layers and gap < 1e-4 else f"no v_norm found, or the bridge's logits are {gap:.3g} off the raw model's"
'''

SOFTCAP_IGNORED = '''
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
'''

ROTARY_DIM_IGNORED = '''
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
'''

BY_WITNESS = {"rotary_dim_ignored": ROTARY_DIM_IGNORED,
              "longrope_cached_step_differs": LONGROPE_CACHED_STEP_DIFFERS,
              "inv_freq_rounded_by_to": INV_FREQ_ROUNDED_BY_TO,
              "bridge_not_causal": BRIDGE_NOT_CAUSAL,
              "bridge_attn_scores_is_pattern": BRIDGE_ATTN_SCORES_IS_PATTERN,
              "bridge_z_is_o_proj_input": BRIDGE_Z_IS_O_PROJ_INPUT,
              "bridge_v_before_v_norm": BRIDGE_V_BEFORE_V_NORM,
              "softcap_ignored": SOFTCAP_IGNORED}
