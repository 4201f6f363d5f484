"""The factor a layer's attention multiplies q.k by, from the config.

Vaswani et al. 2017 §3.2.1 (eq. 1): softmax(QK^T / sqrt(d_k)), d_k the head width (``head_dim``, by default
``hidden_size / num_attention_heads``). The configs that change it say so in a documented field:

- ``query_pre_attn_scalar`` (Gemma 2 and 3, Gemma Team 2024 §2: "we use query_pre_attn_scalar**-0.5"):
  the factor is its inverse square root, whatever the head width;
- ``attention_multiplier`` (Granite, muP-style; GraniteConfig: "attention multiplier"): the factor itself;
- GPT-2's ``scale_attn_weights`` (False: raw q.k) and ``scale_attn_by_inverse_layer_idx`` (layer l's
  scores also divided by l + 1; GPT2Config's documentation, from Mistral/Stanford CRFM's stable training);
- T5 and its descendants: raw q.k (Raffel et al. 2020 fold 1/sqrt(d_k) into the initialisation); Gemma 3n and 4:
  raw q.k after per-head q/k RMS norms;
- GPT-Neo: raw q.k (its Mesh-TensorFlow original applies no 1/sqrt(d_k); transformers keeps that, documented in
  the GPT-Neo model page: "GPT-Neo does not scale the attention weights");
- Multi-head Latent Attention (DeepSeek-V2, Liu et al. 2024 §2.1.3): d_k = qk_nope_head_dim + qk_rope_head_dim,
  and with YaRN rope scaling the scale is multiplied by mscale(s, mscale_all_dim)^2 (DeepSeek-V2's release code,
  ``softmax_scale = softmax_scale * mscale * mscale``; Peng et al. 2023 eq. 21's 0.1 ln s + 1 with the factor
  ``mscale_all_dim``).

A config that names a scale field this module does not know leaves the scale undetermined (a check is n/a
and says which field), rather than assuming the textbook.
"""

from __future__ import annotations

import math
from typing import Any

from harness.oracle.fields import (
    Fact,
    head_dim,
    integer,
    layer_config,
    model_type,
    read,
    rope_parameters,
    unknown,
)

# GPT-2's layout: its config documents scale_attn_weights and scale_attn_by_inverse_layer_idx
GPT2_FAMILY = ("gpt2", "gpt_bigcode", "decision_transformer", "imagegpt")
# raw q.k by design: GPT-Neo (see the module docstring); T5 and its descendants fold 1/sqrt(d_k) into the weight
# initialisation (Raffel et al. 2020, whose Mesh-TensorFlow code and transformers' T5Attention apply no scale);
# Gemma 3n and Gemma 4 RMS-normalise q and k per head and then take q.k as it is (Gemma 3n's model card: QK-norm in
# place of the query scaling; their configs keep a query_pre_attn_scalar these models do not apply)
UNSCALED = ("gpt_neo", "t5", "mt5", "umt5", "longt5", "switch_transformers", "pop2piano", "udop", "myt5", "gemma3n",
            "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "diffusion_gemma")
# config fields that would change the factor; a type that sets one of these and is not handled is unknown
SCALE_FIELDS = ("attn_scale", "attention_scale", "softmax_scale", "query_scale", "scale_attn", "attn_scaling",
                "attention_scaling", "qk_scale", "scale_qk")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature term sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023 eq. 21), here with a multiplier on ln s."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def scale(config: Any, layer: int) -> Fact:
    """The factor on q.k in the model's layer ``layer`` (its index in the full stack)."""
    c = layer_config(config, layer)
    kind = model_type(c)
    if kind in UNSCALED:
        return Fact(1.0, f"model_type={kind!r}: raw q.k (no 1/sqrt(d_k) by design)")
    qpas = read(c, "query_pre_attn_scalar", None)
    if isinstance(qpas, (int, float)) and not isinstance(qpas, bool) and qpas > 0:
        return Fact(float(qpas) ** -0.5, f"query_pre_attn_scalar={qpas}: query_pre_attn_scalar**-0.5")
    mult = read(c, "attention_multiplier", None)
    if isinstance(mult, (int, float)) and not isinstance(mult, bool):
        return Fact(float(mult), f"attention_multiplier={mult}")
    mla = integer(c, "qk_nope_head_dim"), integer(c, "qk_rope_head_dim")
    if mla[0] is not None and mla[1] is not None:
        return _mla(c, layer, mla[0][1], mla[1][1])
    d, d_source = head_dim(c)
    if kind in GPT2_FAMILY:
        # GPT2Config: scale_attn_by_inverse_layer_idx "additionally" scales by 1 / (layer_idx + 1), with or without
        # scale_attn_weights' 1/sqrt(d_k)
        value, source = (1.0, "scale_attn_weights=False: raw q.k") if read(c, "scale_attn_weights", True) is False \
            else (d ** -0.5, f"1/sqrt({d_source})")
        if read(c, "scale_attn_by_inverse_layer_idx", False) is True:
            return Fact(value / (layer + 1), f"{source} / (layer {layer} + 1) (scale_attn_by_inverse_layer_idx=True)")
        return Fact(value, source)
    named = [f for f in SCALE_FIELDS if read(c, f, None) not in (None, False)]
    if named:
        return unknown(f"the config sets {named[0]}={read(c, named[0])!r}, a scale field the oracle does not know "
                       f"for model_type {kind!r}")
    return Fact(d ** -0.5, f"1/sqrt({d_source})")


def _mla(c: Any, layer: int, nope: int, rope: int) -> Fact:
    d = nope + rope
    value, source = d ** -0.5, f"1/sqrt(qk_nope_head_dim={nope} + qk_rope_head_dim={rope})"
    params, _ = rope_parameters(c, layer)
    if params and params.get("rope_type") == "yarn" and params.get("mscale_all_dim"):
        factor = float(params["factor"])
        m = yarn_mscale(factor, float(params["mscale_all_dim"]))
        return Fact(value * m * m, f"{source} * mscale(factor={factor}, mscale_all_dim="
                                   f"{params['mscale_all_dim']})^2 = {m:.6g}^2")
    return Fact(value, source)
