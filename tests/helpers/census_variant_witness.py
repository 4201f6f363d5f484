"""Witnesses for the variants census's findings (reports/census/findings.py VARIANT_FINDINGS), each independent of
the property suite: the raw Hugging Face model built from the census's shrunk config with the finding's drawn
changes (reports.census.variants.build_config), in float64 so no rounding can explain the difference. Each raises
AssertionError once the behaviour no longer reproduces.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
import transformers

from reports.census import variants
from reports.census.enumerate import by_name
from reports.census.variants import build_config

TOKENS = torch.tensor([[3, 5, 7, 11, 13, 17]])


def _model(model_type: str, changes: dict):
    mt = by_name()[model_type]
    config = build_config(mt.name, mt.class_name, changes)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, mt.class_name)._from_config(config, dtype=torch.float64)
    if hasattr(model, "set_experts_implementation"):  # grouped_mm has no float64 kernel (placement._experts_for)
        model.set_experts_implementation("eager")
    return model.eval()


def _cached_against_full(model, prefill: int) -> float:
    """Largest |logit| difference between decoding TOKENS one token at a time after a prefill and one full forward."""
    with torch.no_grad():
        full = model(input_ids=TOKENS).logits
        out = model(input_ids=TOKENS[:, :prefill], use_cache=True)
        past, steps = out.past_key_values, [out.logits[:, -1]]
        for i in range(prefill, TOKENS.shape[1]):
            out = model(input_ids=TOKENS[:, i:i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            steps.append(out.logits[:, -1])
    cached = torch.stack(steps, 1)
    return float((cached - full[:, prefill - 1:]).abs().max())


def longrope(model_type: str, original: int = 4) -> dict:
    """A LongRoPE rope_parameters dict as Phi-3 ships it (factors per rotated pair), with a short original context,
    over ``model_type``'s shrunk head size and partial rotary."""
    base = variants.base_dict(model_type, by_name()[model_type].class_name)
    partial = base["rope_parameters"].get("partial_rotary_factor", 1.0)
    head_dim = base.get("head_dim") or base["hidden_size"] // base["num_attention_heads"]
    half = int(head_dim * partial) // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 32.0,
            "original_max_position_embeddings": original, "short_factor": [1.0] * half, "long_factor": [2.0] * half}
    return {**rope, "partial_rotary_factor": partial} if "partial_rotary_factor" in base["rope_parameters"] else rope


def longrope_cached_step_differs(model_type: str = "llama") -> str:
    """LongRoPE rotates with short_factor while the sequence is within original_max_position_embeddings and with
    long_factor past it, recomputed from each call's largest position: keys cached while the sequence was short keep
    the short rotation, so cached decoding past the limit differs from a full forward. Default rope: exact."""
    changes = {"rope_parameters": longrope(model_type)}
    plain = {k: v for k, v in changes["rope_parameters"].items()
             if k in ("rope_theta", "partial_rotary_factor")}
    moved = _cached_against_full(_model(model_type, changes), prefill=3)
    exact = _cached_against_full(_model(model_type, {"rope_parameters": {**plain, "rope_type": "default"}}), prefill=3)
    # default rope is exact to float64 rounding, or to the float32 a model computes inside (DeepSeek-V3's router
    # casts to float32: 2e-8); LongRoPE's switch moves the logits by 1e-3 and more
    assert moved > 1e-6 and moved > 1e4 * exact, (moved, exact)
    return (f"{model_type}, float64: a cached step past original_max_position_embeddings=4 is off the full forward by "
            f"{moved:.3g} under longrope, {exact:.3g} under default rope")


def _impl_logits(model_type: str, changes: dict, impl: str) -> torch.Tensor:
    mt = by_name()[model_type]
    config = build_config(mt.name, mt.class_name, changes)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, mt.class_name)._from_config(config, dtype=torch.float64,
                                                                  attn_implementation=impl).eval()
    with torch.no_grad():
        return model(input_ids=TOKENS).logits


def falcon_alibi_added_twice(model_type: str = "falcon") -> str:
    """Falcon with alibi=True: FalconModel.forward folds alibi / sqrt(head_dim) into the causal mask, and the eager
    attention (also what output_attentions=True runs) adds alibi to the scores again before scaling them, so eager
    attends with slopes 2 / sqrt(head_dim) x Press's where sdpa uses 1 / sqrt(head_dim): the two give other logits.
    Without ALiBi they agree."""
    moved = float((_impl_logits(model_type, {"alibi": True}, "eager")
                   - _impl_logits(model_type, {"alibi": True}, "sdpa")).abs().max())
    plain = float((_impl_logits(model_type, {"alibi": False}, "eager")
                   - _impl_logits(model_type, {"alibi": False}, "sdpa")).abs().max())
    assert moved > 1e-4 and plain < 1e-10, (moved, plain)
    return f"falcon, float64: eager against sdpa logits differ by {moved:.3g} with alibi=True, {plain:.3g} without"


# the smallest drawn config of each type whose float16 rotary_precision row failed (docs/census_variants.json)
ROUNDED_INV_FREQ = {"granitemoe": {"num_attention_heads": 2, "num_key_value_heads": 1},
                    "qwen3_moe": {"hidden_size": 96, "num_attention_heads": 3, "num_key_value_heads": 3},
                    # the configs rotary_frequencies failed at bfloat16 (every layer's rotation against the oracle's)
                    "gemma": {"head_dim": 32, "num_attention_heads": 8, "num_key_value_heads": 1,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
                    "stablelm": {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                                 "rope_parameters": {"rope_type": "proportional", "rope_theta": 500000.0,
                                                     "partial_rotary_factor": 1.0}}}


def _rotation_error(model: Any, position: int = 127) -> float:
    """Largest per-head relative error of the model's own rotation of q and k at ``position`` against a float64
    rotation (Su et al. 2021 eq. 34, rotate_half layout) of the same inputs, over a few one-token inputs."""
    module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    inner, seen = module.apply_rotary_pos_emb, []

    def spy(q, k, cos, sin, *args, **kwargs):
        out = inner(q, k, cos, sin, *args, **kwargs)
        seen.append(((q, out[0]), (k, out[1])))
        return out

    config = model.config
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    angle = position * config.rope_parameters["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angle.cos().repeat(2), angle.sin().repeat(2)
    worst = 0.0
    module.apply_rotary_pos_emb = spy
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
        module.apply_rotary_pos_emb = inner
    return worst


def inv_freq_rounded_by_to(model_type: str) -> str:
    """``Module.to(torch.float16)`` (or bfloat16), as ``model.half()`` and attnlab's dtype copy do, rounds the rotary
    ``inv_freq`` buffer to that dtype (transformers #25681), so at position 127 the model's rotation is off a float64
    rotation of its own inputs by 8 u and more (tens of u for most) at one of the two dtypes at least; the same model
    built at that dtype (inv_freq stays float32, as ``from_pretrained(dtype=...)`` keeps it) rotates to within 2 u
    at both."""
    mt = by_name()[model_type]
    config = build_config(mt.name, mt.class_name, ROUNDED_INV_FREQ[model_type])
    cls = getattr(transformers, mt.class_name)
    found = {}
    for dtype in (torch.float16, torch.bfloat16):  # which of the two crosses an allowance depends on the head size
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            cast = cls._from_config(config, dtype=torch.float32).eval().to(dtype)
            torch.manual_seed(0)
            built = cls._from_config(config, dtype=dtype).eval()
        u = torch.finfo(dtype).eps / 2
        found[dtype] = (_rotation_error(cast) / u, _rotation_error(built) / u, cast.model.rotary_emb.inv_freq.dtype)
    # the same code and inputs, only the buffer's dtype differs: the cast model's rotation is many times worse (the
    # built one is within a couple of roundings of the float64 rotation)
    assert all(kept < 2 for _, kept, _ in found.values()), found
    assert any(rounded > 8 and rounded > 4 * kept for rounded, kept, _ in found.values()), found
    return f"{model_type} at position 127: " + "; ".join(
        f"{str(dtype).split('.')[-1]}: rotation error {rounded:.1f} u after .to() (inv_freq {inv}), {kept:.1f} u "
        f"built at that dtype (inv_freq float32)" for dtype, (rounded, kept, inv) in found.items())


def _capped_against_uncapped(model_type: str, cap: float) -> float:
    """Largest |logit| difference, float64, between ``model_type`` with ``attn_logit_softcapping=cap`` and without
    (the same seed, so the same weights)."""
    capped = _model(model_type, {"attn_logit_softcapping": cap})
    plain = _model(model_type, {"attn_logit_softcapping": None})
    with torch.no_grad():
        return float((capped(input_ids=TOKENS).logits - plain(input_ids=TOKENS).logits).abs().max())


def softcap_ignored(model_type: str = "gemma3_text") -> str:
    """Gemma 3's config declares attn_logit_softcapping, but its attention passes no softcap to the attention
    function: a cap of 0.01, which squeezes every score into (-0.01, 0.01), leaves the float64 logits as they are
    without one. Gemma 2, which passes softcap=self.attn_logit_softcapping, moves them (the witness can see a cap)."""
    ignored, honoured = _capped_against_uncapped(model_type, 0.01), _capped_against_uncapped("gemma2", 0.01)
    assert ignored == 0.0 and honoured > 1e-6, (ignored, honoured)  # float64: rounding alone is ~1e-16
    return (f"{model_type}, float64: logits with attn_logit_softcapping=0.01 differ from those without by "
            f"{ignored:.3g} (gemma2, which applies it: {honoured:.3g})")


WITNESSES = {f.__name__: f for f in (longrope_cached_step_differs, falcon_alibi_added_twice, inv_freq_rounded_by_to,
                                     softcap_ignored)}
