"""What a model declares about its design in ``cfg``, read one way by every check that follows it.

The protocol's ``cfg`` may declare where a model departs from the textbook (docs/architecture.md):
``sliding_window`` (one window for every layer, or a per-layer tuple with None for a global
layer), ``attn_scale`` / ``attn_scales`` (the factor on q.k, per layer), ``rotary_dim``,
``rotary_style``, ``rotary_base``, ``rope_type`` and ``alibi_style``. A field a model does not
declare takes its textbook value.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from harness.adapters.protocol import ProtocolModel
from harness.errors import AttnlabTypeError

HALF_STYLES = ("half", "rotate_half", "neox", "llama")  # pairs (i, i + d/2), Su et al. 2021 eq. 34 re-laid
INTERLEAVED_STYLES = ("interleaved", "gptj", "pairs")  # pairs (2i, 2i + 1), the paper's own layout


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


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of one rounding in ``dtype`` (Higham 2002 §2.1)."""
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def model_dtype(model: ProtocolModel) -> torch.dtype:
    for p in model.parameters():
        if p.dtype.is_floating_point:
            return p.dtype
    return torch.float32
