"""Rotary position embedding as the config declares it: frequencies, attention factor, span and layout.

RoPE (Su et al. 2021, eq. 34) turns pair i of the rotated features of q and k at position m by
m * theta_i, theta_i = base^(-2i/d) over the d rotated features (``head_dim * partial_rotary_factor``, or
GPT-J's absolute ``rotary_dim``). A ``rope_type`` rescales the theta_i and may multiply cos/sin (and so the
rotated q and k) by an attention factor:

- ``linear`` (Chen et al. 2023, position interpolation): theta_i / factor;
- ``dynamic`` (NTK-aware scaling, bloc97 2023, as Code Llama's long-context recipe popularised): for a sequence
  of length L beyond the original context L0 the base becomes base * (factor L / L0 - (factor - 1))^(d / (d - 2));
  within L0 it is plain RoPE;
- ``yarn`` (Peng et al. 2023 §3.2-3.4): each theta_i is interpolated (theta_i / s) or kept by a ramp over the
  number of turns the pair makes in the original context, between ``beta_slow`` and ``beta_fast`` turns
  (eq. 17-18), and cos/sin are multiplied by 0.1 ln s + 1 (eq. 21) unless ``attention_factor`` says otherwise;
- ``longrope`` (Ding et al. 2024; Phi-3 technical report §2): theta_i / short_factor_i up to
  ``original_max_position_embeddings``, theta_i / long_factor_i beyond it, cos/sin times
  sqrt(1 + ln s / ln L0) with s = max_position_embeddings / L0;
- ``llama3`` (Llama 3.1's release, ``apply_scaling``): wavelengths 2 pi / theta_i longer than L0 / low_freq_factor
  are divided by factor, shorter than L0 / high_freq_factor kept, the ones between blended linearly in L0 / wavelength;
- ``proportional`` (transformers' RopeParameters documentation, Gemma 4): the first
  ``int(partial_rotary_factor * head_dim / 2)`` pairs turn at base^(-2i/head_dim), the rest not at all, all / factor.

Where transformers picks a convention the papers leave open, the function says so: the per-type attention factor
defaults and YaRN's default ``truncate`` follow transformers' ``RopeParameters`` documentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

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
from harness.oracle.scale import yarn_mscale
from harness.oracle.windows import window

# Pairs (2i, 2i + 1), the paper's own layout (Su et al. eq. 34): GPT-J's rotate_every_two (and CodeGen, its heir),
# Cohere's and GLM's x[..., ::2] layout, RoFormer, Llama 4's complex multiplication, ERNIE 4.5 (Baidu's release
# rotates adjacent pairs), Kyutai's Helium, Ergo. Every other model type pairs (i, i + d/2) (GPT-NeoX's rotate_half,
# which Llama and transformers' modeling template adopted).
INTERLEAVED = ("gptj", "codegen", "cohere", "cohere2", "cohere2_moe", "glm", "glm4", "roformer", "llama4",
               "llama4_text", "ernie4_5", "ernie4_5_moe", "helium", "ergo")
# Turned by -m instead of +m: nanochat (Karpathy 2025, its apply_rotary_emb: y1 = x1 cos + x2 sin), still a rotation
# whose scores depend on m - n only
CLOCKWISE = ("nanochat",)
# q and k RMS-normalised right after the rotation, without a weight (nanochat's "QK norm": norm(rotary(q)), at
# config.rms_norm_eps): what reaches the scores is the turned vector over its root mean square
NORMED_AFTER = ("nanochat",)
# Local layers rotate, global ones take no positions (NoPE): Cohere's Command R7B ("sliding window layers use RoPE,
# global layers no positional embeddings", Cohere2's model card), Flint, AFMoE, Lara-Mini ("the full-attention layers
# get none"); EXAONE 4.0 (LG AI Research 2025:
# "global NoPE" in its hybrid attention) and its heirs do so only where some layer is local, else every layer rotates.
LOCAL_ROPE_ONLY = ("cohere2", "cohere2_moe", "flint", "afmoe", "lara_mini")
HYBRID_NOPE = ("exaone4", "exaone_moe", "kolibri1")
SCALED_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


@dataclass(frozen=True)
class RopeSpec:
    """One layer's rotation at one sequence length: features 0 .. dim of each head turn, pair i by m * inv_freq[i]."""

    inv_freq: tuple[float, ...]
    attention_factor: float  # cos and sin are multiplied by it
    dim: int  # rotated features per head (the rest pass through)
    style: str  # "half": pairs (i, i + dim/2); "interleaved": pairs (2i, 2i + 1)
    rope_type: str
    # not None: each head's turned q/k is then divided by sqrt(mean(x^2) + eps) (NORMED_AFTER)
    normed_after: Optional[float] = None
    offset: int = 0  # the first rotated feature of a head (Multi-head Latent Attention: after the nope features)
    direction: int = 1  # +1: position m turns by +m theta_i (Su et al. eq. 34); -1: by -m (CLOCKWISE)
    # the longest sequence the rotation is declared for past the usable context: dynamic NTK scales to factor times the
    # original context (its purpose, bloc97 2023); None where the rotation declares nothing past it
    reach: Optional[int] = None


def rotary(config: Any, layer: int, seq_len: int) -> Fact:
    """The rotation of layer ``layer`` (its index in the full stack) for a sequence whose largest position is
    ``seq_len - 1``: a :class:`RopeSpec`, or unknown with the reason (the layer does not rotate, or a layout the
    oracle does not know)."""
    c = layer_config(config, layer)
    kind = model_type(c)
    # Multi-head Latent Attention (DeepSeek-V2, Liu et al. 2024 §2.1.3): each head is [q^C; q^R], the decoupled
    # qk_rope_head_dim features last; they turn over their own width (the config's head_dim is set to it), and with
    # rope_interleave they are read as pairs (2i, 2i + 1) and written as (i, i + r/2): the turned output pairs "half"
    rope_part, nope_part = integer(c, "qk_rope_head_dim"), integer(c, "qk_nope_head_dim")
    mla = (rope_part[1], nope_part[1]) if rope_part is not None and nope_part is not None else None
    offset = mla[1] if mla else 0
    no_rope = _no_rope(config, c, kind, layer)
    if no_rope:
        return unknown(no_rope)
    params, where = rope_parameters(c, layer)
    if params is None:
        if kind in ("gptj", "codegen", "roformer"):  # no base in the config: GPT-J's code and RoFormer (Su et al.
            # 2021 §3.4, the sinusoids of Vaswani et al.) fix 10000
            params, where = {"rope_type": "default", "rope_theta": 10000.0}, f"model_type={kind!r} (base 10000)"
        else:
            return unknown(where)
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in SCALED_TYPES:
        return unknown(f"{where}: rope_type {rope_type!r} is not one the oracle knows ({', '.join(SCALED_TYPES)})")
    d_head, d_source = (mla[0], f"qk_rope_head_dim={mla[0]}") if mla else head_dim(c)
    dim, dim_source = _rotated(c, params, d_head)
    base = params.get("rope_theta", read(c, "rope_theta", None))
    if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 1:
        return unknown(f"{where} names no rope_theta > 1 (got {base!r})")
    base = float(base)
    style = "interleaved" if kind in INTERLEAVED and not mla else "half"
    source = f"{where}: rope_type={rope_type}, rope_theta={base:g}, {dim_source} of {d_source}"
    try:
        inv, factor, extra = _frequencies(rope_type, params, c, base, dim, d_head, seq_len)
    except (KeyError, TypeError, ValueError) as e:
        return unknown(f"{where}: rope_type {rope_type!r} lacks a valid parameter ({type(e).__name__}: {e})")
    if rope_type == "proportional":
        dim = d_head
    max_pos = integer(c, "max_position_embeddings")
    reach = int(float(params["factor"]) * max_pos[1]) if rope_type == "dynamic" and max_pos else None
    direction = -1 if kind in CLOCKWISE else 1
    eps = float(read(c, "rms_norm_eps", 1e-6)) if kind in NORMED_AFTER else None
    return Fact(RopeSpec(tuple(inv), factor, dim, style, rope_type, eps, offset, direction, reach),
                source + extra + (", turned by -m" if direction < 0 else "")
                + (f", features {offset}.. of each head (MLA's decoupled RoPE part)" if offset else "")
                + (f", then RMS-normalised (eps {eps:g})" if eps is not None else ""))


def _no_rope(config: Any, c: Any, kind: str, layer: int) -> str:
    """Why layer ``layer`` takes no rotary positions by design ("" where it rotates)."""
    flags = read(c, "no_rope_layers", None)
    # Llama4Config / SmolLM3Config: "a 1 at an index indicates that the corresponding layer will use RoPE, 0 NoPE"
    if isinstance(flags, (list, tuple)) and layer < len(flags) and not flags[layer]:
        return f"no_rope_layers[{layer}]=0: layer {layer} takes no positions (NoPE)"
    if kind not in LOCAL_ROPE_ONLY + HYBRID_NOPE:
        return ""
    local = window(config, layer)
    if not local.known or local.value is not None:
        return ""
    n = integer(c, "num_hidden_layers")
    if kind in HYBRID_NOPE and n and all(window(config, i).value is None for i in range(n[1])):
        return ""  # no local layer anywhere: every layer rotates
    # Cohere2-MoE's dense prefix layers rotate too when prefix_dense_sliding_window_pattern is 1 (its config's rule)
    dense = read(c, "mlp_layer_types", None)
    if kind == "cohere2_moe" and read(c, "prefix_dense_sliding_window_pattern", None) == 1 \
            and isinstance(dense, (list, tuple)) and layer < len(dense) and dense[layer] == "dense":
        return ""
    return f"model_type={kind!r}: its global layer {layer} ({local.source}) takes no positions (NoPE)"


def _rotated(c: Any, params: dict, d_head: int) -> tuple[int, str]:
    """(rotated features per head, source): ``partial_rotary_factor`` (rope_parameters or the config; GPT-NeoX's
    ``rotary_pct``) times head_dim, rounded down as int() does; GPT-J's ``rotary_dim`` as given."""
    factor = params.get("partial_rotary_factor", read(c, "partial_rotary_factor", None))
    if factor is None and isinstance(read(c, "rotary_pct", None), (int, float)):
        factor = c.rotary_pct
    if factor is None:
        absolute = integer(c, "rotary_dim")
        if absolute is not None and 0 < absolute[1] <= d_head:
            return absolute[1], f"rotary_dim={absolute[1]}"
        return d_head, "all features"
    return int(d_head * float(factor)), f"partial_rotary_factor={factor}"


def _plain(base: float, dim: int) -> list[float]:
    # theta_i = base^(-2i/d), i = 0 .. ceil(d/2) - 1 (Su et al. eq. 15); an odd d keeps transformers' arange(0, d, 2)
    return [base ** (-(2 * i) / dim) for i in range((dim + 1) // 2)]


def _frequencies(rope_type: str, p: dict, c: Any, base: float, dim: int, d_head: int,
                 seq_len: int) -> tuple[list[float], float, str]:
    max_pos = integer(c, "max_position_embeddings")
    if rope_type == "default":
        return _plain(base, dim), 1.0, ""
    if rope_type == "linear":
        factor = float(p["factor"])
        return [t / factor for t in _plain(base, dim)], 1.0, f", factor={factor:g}"
    if rope_type == "dynamic":
        factor = float(p["factor"])
        original = int(max_pos[1]) if max_pos else int(p["original_max_position_embeddings"])
        length = max(seq_len, original)
        new_base = base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
        return _plain(new_base, dim), 1.0, f", factor={factor:g}, at length {length} (original {original}): " \
                                            f"base {new_base:.6g}"
    if rope_type == "yarn":
        return _yarn(p, c, base, dim)
    if rope_type == "longrope":
        original = int(p["original_max_position_embeddings"])
        factor = p.get("factor") or (max_pos[1] / original if max_pos else 1.0)
        attention = p.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        long = seq_len > original
        ext = [float(v) for v in p["long_factor" if long else "short_factor"]]
        plain = _plain(base, dim)
        if len(ext) != len(plain):
            raise ValueError(f"{'long' if long else 'short'}_factor has {len(ext)} entries, expected {len(plain)}")
        return [t / e for t, e in zip(plain, ext, strict=True)], float(attention), \
            f", {'long' if long else 'short'}_factor at length {seq_len} (original {original}), attention factor " \
            f"{float(attention):.6g}"
    if rope_type == "llama3":
        factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        context = float(p["original_max_position_embeddings"])
        out = []
        for t in _plain(base, dim):
            wavelen = 2 * math.pi / t
            if wavelen < context / high:
                out.append(t)
            elif wavelen > context / low:
                out.append(t / factor)
            else:
                smooth = (context / wavelen - low) / (high - low)
                out.append((1 - smooth) * t / factor + smooth * t)
        return out, 1.0, f", factor={factor:g}, low/high_freq_factor={low:g}/{high:g}, original {context:g}"
    # proportional
    factor = float(p.get("factor", 1.0))
    turning = int(float(p.get("partial_rotary_factor", 1.0)) * d_head // 2)
    inv = [base ** (-(2 * i) / d_head) / factor for i in range(turning)] + [0.0] * (d_head // 2 - turning)
    return inv, 1.0, f", {turning} of {d_head // 2} pairs turn, factor={factor:g}"


def _yarn(p: dict, c: Any, base: float, dim: int) -> tuple[list[float], float, str]:
    original = int(p["original_max_position_embeddings"])
    max_pos = integer(c, "max_position_embeddings")
    factor = p.get("factor")
    factor = float(factor) if factor is not None else (max_pos[1] / original if max_pos else 1.0)
    attention: Optional[float] = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all
                     else yarn_mscale(factor))
    fast, slow = float(p.get("beta_fast") or 32), float(p.get("beta_slow") or 1)

    def dim_of(turns: float) -> float:  # the pair index that turns ``turns`` times over the original context
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(fast), dim_of(slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, t in enumerate(_plain(base, dim)[: dim // 2]):
        ramp = min(1.0, max(0.0, (i - low) / (high - low)))  # 0: keep theta_i (extrapolate), 1: theta_i / s
        out.append(t / factor * ramp + t * (1 - ramp))
    return out, float(attention), f", factor={factor:g}, beta_fast/slow={fast:g}/{slow:g}, original {original}, " \
                                  f"attention factor {float(attention):.6g}"
