"""What a model declares about its design in ``cfg``, read one way by every check that follows it.

The protocol's ``cfg`` may declare where a model departs from the textbook (docs/architecture.md);
:class:`harness.adapters.design_facts.DesignFacts` says what each optional field means. This
module is the properties' one reader of them: a field a model does not declare takes its textbook
value, a TransformerLens config is read in TransformerLens's own terms (``attn_scale`` divides),
and a malformed declaration is an error naming the field before any search runs. Scale (Vaswani
et al. 2017 §3.2.1), soft-cap (Gemma 2), sliding windows (transformers' ``masking_utils``
overlays), rotary layout (Su et al. 2021) and ALiBi (Press et al. 2022) are read here.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from harness.adapters.protocol import ProtocolModel
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.positions import alibi_slopes

HALF_STYLES = ("half", "rotate_half", "neox", "llama")  # pairs (i, i + d/2), Su et al. 2021 eq. 34 re-laid
INTERLEAVED_STYLES = ("interleaved", "gptj", "pairs")  # pairs (2i, 2i + 1), the paper's own layout
ALIBI_STYLES = ("relative", "absolute_key")

__all__ = ["windows", "window", "attn_scale", "softcap", "allowed_keys", "rotary_design", "rotary_layout",
           "pairs", "pair_norms", "turn_pairs", "alibi_design", "attention_sinks", "rotary_span", "rotary_split",
           "design_summary", "is_transformer_lens_cfg", "unit_roundoff", "model_dtype"]


def windows(cfg: Any) -> tuple[Optional[int], ...]:
    """The sliding window of every layer (None: global attention)."""
    declared = getattr(cfg, "sliding_window", None)
    if declared is None:
        return (None,) * cfg.n_layers
    if isinstance(declared, int) and not isinstance(declared, bool):
        declared = (declared,) * cfg.n_layers
    declared = tuple(declared)
    if len(declared) != cfg.n_layers or any(
            w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1) for w in declared):
        raise AttnlabTypeError(f"cfg.sliding_window={cfg.sliding_window!r} is invalid: expected None, an "
                               f"integer >= 1 or one entry (None or an integer >= 1) per layer ({cfg.n_layers} layers)")
    return declared


def is_transformer_lens_cfg(cfg: Any) -> bool:
    """Whether ``cfg`` is a TransformerLens config, whose ``attn_scale`` divides q.k instead of multiplying it."""
    return any(c.__module__.startswith("transformer_lens.") for c in type(cfg).__mro__)


def attn_scale(cfg: Any, layer: int) -> float:
    """The factor the model declares on q.k in ``layer`` (default 1/sqrt(d_head), Vaswani et al. §3.2.1)."""
    if is_transformer_lens_cfg(cfg):  # TransformerLens: attn_scale is the *divisor*, <= 0 meaning sqrt(d_head)
        if not getattr(cfg, "use_attn_scale", True):
            return 1.0
        divisor = float(getattr(cfg, "attn_scale", -1.0))
        return 1.0 / (math.sqrt(cfg.d_head) if divisor <= 0 else divisor)
    per_layer = getattr(cfg, "attn_scales", None)
    if per_layer is not None:
        return float(per_layer[layer])
    scale = getattr(cfg, "attn_scale", None)
    return 1.0 / math.sqrt(cfg.d_head) if scale is None else float(scale)


def rotary_design(cfg: Any) -> tuple[int, str, float]:
    """(rotary_dim, "half" | "interleaved", base) as declared, defaults d_head, "half", 10000."""
    dim = getattr(cfg, "rotary_dim", None) or cfg.d_head
    style = str(getattr(cfg, "rotary_style", None) or "half").lower()
    if style in HALF_STYLES:
        style = "half"
    elif style in INTERLEAVED_STYLES:
        style = "interleaved"
    else:
        raise AttnlabTypeError(f"cfg.rotary_style={style!r} is not one of {list(HALF_STYLES + INTERLEAVED_STYLES)}")
    base = float(getattr(cfg, "rotary_base", None) or 10000.0)
    return int(dim), style, base


def first_rotary_layer(cfg: Any) -> int:
    """The first layer whose q/k rotate (cfg.rotary_layers; every layer when undeclared).

    The rotary checks read it: every layer before it has no positions (Flint's full layers), so its input
    does not depend on position, as layer 0's does not in a model that rotates everywhere.
    """
    layers = getattr(cfg, "rotary_layers", None)
    return 0 if not layers else next((i for i, turned in enumerate(layers) if turned), 0)


def rotary_hooks(cfg: Any) -> tuple[str, str]:
    """``hook_rot_q``, ``hook_rot_k`` of :func:`first_rotary_layer`."""
    layer = first_rotary_layer(cfg)
    return f"blocks.{layer}.attn.hook_rot_q", f"blocks.{layer}.attn.hook_rot_k"


def rotary_span(cfg: Any) -> tuple[int, int]:
    """(first rotated feature, rotation direction +1/-1) as declared (cfg.rotary_offset, cfg.rotary_direction)."""
    dim = int(getattr(cfg, "rotary_dim", None) or cfg.d_head)
    offset = getattr(cfg, "rotary_offset", None)
    offset = 0 if offset is None else offset
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset + dim > cfg.d_head:
        raise AttnlabError(f"cfg.rotary_offset={offset!r} is invalid: expected an integer in [0, d_head - rotary_dim = "
                           f"{cfg.d_head - dim}]")
    direction = getattr(cfg, "rotary_direction", None)
    direction = 1 if direction is None else direction
    if direction not in (1, -1) or isinstance(direction, bool):
        raise AttnlabError(f"cfg.rotary_direction={direction!r} is invalid: expected +1 or -1")
    return offset, int(direction)


def rotary_split(x: Tensor, dim: int, offset: int) -> tuple[Tensor, Tensor]:
    """(the rotated features ``x[..., offset:offset + dim]``, the pass-through ones) of ``x [..., d_head]``."""
    rest = torch.cat((x[..., :offset], x[..., offset + dim:]), -1)
    return x[..., offset:offset + dim], rest


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of one rounding in ``dtype`` (Higham 2002 §2.1)."""
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def model_dtype(model: ProtocolModel) -> torch.dtype:
    for p in model.parameters():
        if p.dtype.is_floating_point:
            return p.dtype
    return torch.float32


def attention_sinks(cfg: Any) -> tuple[bool, ...]:
    """Per layer, whether its softmax has a learned sink logit (cfg.attention_sinks; default none)."""
    declared = getattr(cfg, "attention_sinks", None)
    if declared is None:
        return (False,) * cfg.n_layers
    if isinstance(declared, bool):
        declared = (declared,) * cfg.n_layers
    declared = tuple(declared)
    if len(declared) != cfg.n_layers or any(not isinstance(s, bool) for s in declared):
        raise AttnlabTypeError(f"cfg.attention_sinks={cfg.attention_sinks!r} is invalid: expected None, a bool or "
                               f"one bool per layer ({cfg.n_layers} layers)")
    return declared


def window(cfg: Any, layer: int) -> Optional[int]:
    """Layer ``layer``'s sliding window (None = global attention), as :func:`windows` reads it."""
    return windows(cfg)[layer]


def softcap(cfg: Any) -> Optional[float]:
    if is_transformer_lens_cfg(cfg):  # TransformerLens names it attn_scores_soft_cap, <= 0 meaning none
        cap = float(getattr(cfg, "attn_scores_soft_cap", -1.0))
        return cap if cap > 0 else None
    declared = getattr(cfg, "attn_softcap", None)
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, (int, float))
                                 or not declared > 0):
        raise AttnlabError(f"cfg.attn_softcap={declared!r} is invalid: expected None or a number > 0")
    return None if declared is None else float(declared)


def allowed_keys(cfg: Any, layer: int, n: int) -> Tensor:
    """bool ``[query_pos, key_pos]``: which keys a query may see without padding (causal, window)."""
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    ok = torch.ones(n, n, dtype=torch.bool)
    if cfg.attention_dir == "causal":
        ok &= k <= q
    w = window(cfg, layer)
    if w is not None and cfg.attention_dir == "causal":
        ok &= (q - k) < w  # transformers' sliding_window_overlay: kv_idx > q_idx - w
    elif w is not None:
        ok &= (q - k).abs() <= w  # sliding_window_bidirectional_overlay: |q_idx - kv_idx| <= w
    return ok


def rotary_layout(cfg: Any) -> tuple[int, Optional[str]]:
    """(rotated dims per head, pair style or None when the model does not declare one)."""
    dim, style, _ = rotary_design(cfg)
    if isinstance(dim, bool) or not 2 <= dim <= cfg.d_head or dim % 2:
        raise AttnlabError(f"cfg.rotary_dim={dim!r} is invalid: expected an even integer in [2, d_head={cfg.d_head}]")
    return dim, (style if getattr(cfg, "rotary_style", None) else None)


def pairs(x: Tensor, dim: int, style: str, offset: int = 0) -> tuple[Tensor, Tensor]:
    """The two halves ``(a, b)`` of the rotated pairs of ``x [..., d_head]`` (features offset .. offset + dim):
    "half" pairs (i, i + dim/2), "interleaved" pairs (2i, 2i + 1), each ``[..., dim // 2]``."""
    r = x[..., offset:offset + dim]
    if style == "half":
        return r[..., : dim // 2], r[..., dim // 2:]
    return r[..., 0::2], r[..., 1::2]


def pair_norms(x: Tensor, dim: int, style: str, offset: int = 0) -> Tensor:
    """Norms of the rotated pairs of ``x [..., d_head]`` (features offset .. offset + dim) -> ``[..., dim // 2]``."""
    a, b = pairs(x, dim, style, offset)
    return (a.square() + b.square()).sqrt()


def turn_pairs(x: Tensor, cos: Tensor, sin: Tensor, dim: int, style: str, offset: int = 0) -> Tensor:
    """``x [..., d_head]`` with each rotated pair (a, b) turned to (a cos - b sin, a sin + b cos) (Su et al. 2021
    eq. 34), ``cos``/``sin`` broadcasting over ``[..., dim // 2]``; the features outside offset .. offset + dim pass
    through, and the turned ones keep their layout."""
    a, b = pairs(x, dim, style, offset)
    first, second = a * cos - b * sin, a * sin + b * cos
    turned = torch.cat((first, second), -1) if style == "half" else torch.stack((first, second), -1).flatten(-2)
    return torch.cat((x[..., :offset], turned, x[..., offset + dim:]), -1)


def alibi_design(cfg: Any) -> tuple[Tensor, str]:
    """(per-head slopes float64 ``[n_heads]``, style)."""
    style = getattr(cfg, "alibi_style", None) or "relative"
    if style not in ALIBI_STYLES:
        raise AttnlabError(f"cfg.alibi_style={style!r} is invalid: expected one of {list(ALIBI_STYLES)}")
    slopes = getattr(cfg, "alibi_slopes", None)
    if slopes is None:
        return alibi_slopes(cfg.n_heads), style
    slopes = torch.as_tensor(slopes, dtype=torch.float64).flatten()
    if slopes.numel() != cfg.n_heads or not bool(torch.isfinite(slopes).all()):
        raise AttnlabError(f"cfg.alibi_slopes has {slopes.numel()} entries: expected {cfg.n_heads} finite numbers")
    return slopes, style


def design_summary(cfg: Any) -> str:
    """The declared departures from the textbook, for a row's reason ("" when there are none)."""
    parts = []
    for name in ("attn_scale", "attn_scales", "attn_softcap", "sliding_window", "rotary_dim", "rotary_style",
                 "rotary_offset", "rotary_direction", "qk_norm", "alibi_style", "attention_sinks"):
        value = getattr(cfg, name, None)
        if value is not None and value is not False:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)
