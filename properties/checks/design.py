"""The model's declared design: optional ``cfg`` fields the checks follow instead of one textbook formula.

Scale, window and rotary layout are parsed by ``properties.checks._design`` (one owner); this
module adds soft-cap, the allowed-key mask, rotary pair norms and the ALiBi design.

A model (or the adapter in front of it, e.g. ``harness.adapters.HFAdapter``) may declare where it
departs from Vaswani et al. 2017; every field is optional and read with a default:

- ``attn_scales: tuple[float, ...]`` (one per layer) or ``attn_scale: float`` (every layer): the
  factor q.k is multiplied by; default ``1/sqrt(d_head)`` (§3.2.1). Gemma 2 declares
  ``query_pre_attn_scalar**-0.5``, Granite its multiplier, some models 1.
- ``attn_softcap: Optional[float]``: scores are ``cap * tanh(scores / cap)`` (Gemma 2) before the mask.
- ``sliding_window: tuple[Optional[int], ...]`` (one per layer, None = global) or one int for every
  layer: a causal query at index i sees keys j with ``i - j < w`` (transformers' ``sliding_window_overlay``:
  ``kv_idx > q_idx - w``), a bidirectional one ``|i - j| <= w`` (``sliding_window_bidirectional_overlay``).
- ``rotary_dim: Optional[int]`` (rotated dims per head; default all) and ``rotary_style``:
  ``"half"`` pairs (i, i + r/2) (GPT-NeoX, Llama) or ``"interleaved"`` pairs (2i, 2i + 1)
  (GPT-J, Su et al. 2021 eq. 34); None = undeclared (only whole-vector norms are compared).
- ``qk_norm: bool``: a norm sits between ``hook_q``/``hook_k`` and the rotation (Qwen3, OLMo 2).
- ``alibi_style``: ``"relative"`` (bias ``-m_h |i - j|``, Press et al. 2022) or ``"absolute_key"``
  (bias ``m_h * j``, Bloom): the two differ by a per-query constant that softmax cannot see.
  ``alibi_slopes: tuple[float, ...]``: the per-head slopes (default the paper's, as
  ``harness.model.positions.alibi_slopes``).
- ``pos_offset: int``: where a learned position table starts (OPT 2); the adapter applies it, no
  check reads it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from harness.errors import AttnlabError
from harness.model.positions import alibi_slopes
from properties.checks._design import attn_scale, is_transformer_lens_cfg, rotary_design, windows

ALIBI_STYLES = ("relative", "absolute_key")

__all__ = ["attn_scale", "window", "softcap", "allowed_keys", "rotary_layout", "pair_norms", "alibi_design",
           "design_summary"]


def window(cfg: Any, layer: int) -> Optional[int]:
    """Layer ``layer``'s sliding window (None = global attention); ``_design.windows`` owns the parsing."""
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


def pair_norms(x: Tensor, dim: int, style: str) -> Tensor:
    """Norms of the rotated pairs of ``x [..., d_head]`` -> ``[..., dim // 2]``."""
    r = x[..., :dim]
    if style == "half":
        a, b = r[..., : dim // 2], r[..., dim // 2:]
    else:
        a, b = r[..., 0::2], r[..., 1::2]
    return (a.square() + b.square()).sqrt()


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
                 "qk_norm", "alibi_style"):
        value = getattr(cfg, name, None)
        if value is not None and value is not False:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)
