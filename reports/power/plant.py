"""Planted bugs of a chosen size, on attnlab's Transformer and on Hugging Face Llama-family decoders.

Each family is the kind of bug a calibrated row exists to catch, graded by one number (size 0 is
the unplanted control: the same code path with the bug switched off, which must pass):

- ``decode_offset`` (kv_cache): a cached decoding step numbers its tokens ``size`` positions too
  high (its position ids, hence its rotary phases); the prefill and the full forward are right.
- ``scale_error`` (attention_scale): the attention scale is ``(1 + size)`` times the declared one
  (Vaswani et al. 2017 eq. 1: ``softmax(q.k * scale)``, scale = 1/sqrt(d_head) unless declared).
- ``pad_leak`` (padding_outputs): a padded key is not masked but enters the softmax with its score
  plus ``ln(size)``, so it gets ``size`` times the weight a real key of that score would.
- ``causal_leak`` (causal_outputs): each query also sees the one key right after it, with its
  score plus ``ln(size)`` (size 1: the key fully visible, the causal mask off by one).
- ``window_wider`` (sliding_window): every layer declares a window of ``WINDOW`` keys
  (transformers' convention: ``i - w < j <= i``) and applies ``WINDOW + size`` (transformers #29623).
- ``batch_leak`` (batch_independence): each attention layer's input mixes in ``size`` of the next
  row's (``x + size * (roll(x, 1, batch) - x)``), as a norm or a pooling over the batch axis would;
- ``absolute_leak`` (relative_position): a rotary model adds ``size`` times its absolute rotary table
  (cos of each position's angles, tiled over d_model) to each attention layer's input, so what it
  computes depends on absolute position (RoPE alone depends on offsets: Su et al. 2021 eq. 16);
- ``rope_base_error`` (rotary_frequencies): q and k turn by a base ``(1 + size)`` times the config's
  ``rope_theta``;
- ``llama3_skipped`` (rotary_frequencies): the config declares Llama 3.1's rope scaling (factor 8, low/high
  frequency factors 1/4, an original context of a quarter of the model's) and the rotation is plain RoPE
  (size 1); the control turns by the scaled frequencies transformers computes for that config;
- ``attention_factor_twice`` (rotary_frequencies): the config declares YaRN (factor 4, an original context of a
  quarter) and cos/sin carry its attention factor twice (size 1), once in the control.
The three rotary families are planted on Hugging Face models only: the design they break is the config's.

The bug is planted by swapping the class of the model (or of its attention modules) for a subclass
that overrides one step and reads the size from an attribute, so a copy (the float64 golden twin of
properties/precision.py, ``copy.deepcopy``) carries the same bug: a bug is in both copies, never in
the floor. Plant on a fresh model, before anything has made a twin of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, cast

import torch
from torch import Tensor, nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from harness.errors import AttnlabError
from harness.model.layers import AttnContext
from harness.model.transformer import Transformer

WINDOW = 4  # the window a window family declares; the searches draw sequences past it (properties/checks/window.py)


@dataclass(frozen=True)
class Family:
    """One kind of planted bug: the row it is for, its sizes (smallest first) and what a size means."""

    name: str
    row: str
    sizes: tuple[float, ...]
    unit: str


FAMILIES = {f.name: f for f in (
    Family("decode_offset", "kv_cache", (1, 2, 4), "positions too high in a cached step"),
    Family("scale_error", "attention_scale", (0.01, 0.05, 0.2), "relative error of the attention scale"),
    Family("pad_leak", "padding_outputs", (1e-4, 1e-3, 1e-2, 1e-1), "weight of a padded key, relative"),
    Family("causal_leak", "causal_outputs", (1e-3, 1e-2, 1e-1, 1.0), "weight of the next key, relative"),
    Family("window_wider", "sliding_window", (1,), "keys wider than the declared window"),
    Family("batch_leak", "batch_independence", (1e-3, 1e-2, 1e-1), "share of the next row mixed in"),
    Family("absolute_leak", "relative_position", (1e-3, 1e-2, 1e-1), "absolute rotary table added, relative"),
    Family("rope_base_error", "rotary_frequencies", (1e-3, 1e-2, 1e-1), "relative error of the rope base"),
    Family("llama3_skipped", "rotary_frequencies", (1,), "Llama 3.1 scaling declared, plain RoPE applied"),
    Family("attention_factor_twice", "rotary_frequencies", (1,), "YaRN's attention factor applied twice"),
)}
ROTARY_BUGS = ("rope_base_error", "llama3_skipped", "attention_factor_twice")  # planted on the rotary table
INPUT_BUGS = ("batch_leak", "absolute_leak")  # planted on each attention layer's input


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise AttnlabError(f"family={name!r} is unknown: expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def plant(model: nn.Module, name: str, size: float) -> nn.Module:
    """Plant bug ``name`` of ``size`` into ``model`` (attnlab's Transformer or an HF Llama-family decoder), in place.

    Size 0 plants the control: the bug's code path, switched off (for ``window_wider``: the declared
    window, applied right). Returns ``model``.
    """
    fam = family(name)
    if not (isinstance(size, (int, float)) and math.isfinite(size) and size >= 0):
        raise AttnlabError(f"size={size!r} is invalid for {name}: expected a finite number >= 0")
    if name in ("pad_leak", "causal_leak") and size > 0 and size > 1e6:
        raise AttnlabError(f"size={size!r} is invalid for {name}: expected a weight in (0, 1e6]")
    if isinstance(model, Transformer):
        return _plant_ours(model, fam, float(size))
    return _plant_hf(model, fam, float(size))


# --- attnlab's Transformer ----------------------------------------------------------------------

def _swap(obj: nn.Module, mixin: type) -> None:
    """Give ``obj`` the class ``mixin`` + its own class (made once per pair, so copies share it)."""
    base = type(obj)
    if mixin in base.__mro__:
        return
    key = (mixin, base)
    if key not in _CLASSES:
        # in the base's module: the HF adapter finds the modeling code (its rotary function, its source) by the
        # module a class is defined in
        _CLASSES[key] = type(f"{mixin.__name__}{base.__name__}", (mixin, base), {"__module__": base.__module__})
    obj.__class__ = _CLASSES[key]


_CLASSES: dict[tuple[type, type], type] = {}


def _plant_ours(model: Transformer, fam: Family, size: float) -> Transformer:
    cfg = model.cfg
    if fam.name in ROTARY_BUGS:
        raise AttnlabError(f"{fam.name} breaks a Hugging Face config's rotary design: attnlab's Transformer declares "
                           "none for the design oracle")
    if fam.name == "window_wider":
        raise AttnlabError("window_wider needs a model that declares a sliding window: attnlab's Transformer has "
                           "no sliding_window field")
    if fam.name == "scale_error":
        for block in model.blocks:
            attn: Any = block.attn
            attn.scale = attn.scale * (1.0 + size)
        return model
    if fam.name in INPUT_BUGS:
        _rotary_for(fam.name, cfg.positional_embedding_type)
        for block in model.blocks:
            planted: Any = block.attn
            planted._planted = (fam.name, size)
            _swap(planted, _PlantedInputOurs)
        return model
    if fam.name == "decode_offset" and cfg.positional_embedding_type not in ("rotary", "standard", "sinusoidal"):
        raise AttnlabError(f"decode_offset needs positions: positional_embedding_type="
                           f"{cfg.positional_embedding_type!r}")
    setattr(model, "_planted", (fam.name, size))  # noqa: B010 (an nn.Module attribute mypy types as a submodule)
    _swap(model, _PlantedContext)
    return model


class _PlantedContext:
    """Transformer._context with the planted bug (``self._planted``) in positions or the attention mask."""

    _planted: tuple[str, float]

    def _context(self, batch: int, q: int, device: torch.device, dtype: torch.dtype, mask: Optional[Tensor],
                 offset: int, cache: Any) -> tuple[Tensor, AttnContext]:
        name, size = self._planted
        past = cache.length if cache is not None else 0
        if name == "decode_offset":
            return super()._context(batch, q, device, dtype, mask, offset + int(size) * (past > 0), cache)  # type: ignore[misc]
        positions, ctx = super()._context(batch, q, device, dtype, mask, offset, cache)  # type: ignore[misc]
        if size == 0:
            return positions, ctx
        allowed = ctx.explicit_mask(q, past + q, device)
        if allowed is None:  # a bidirectional model without padding: every key is seen already
            return positions, ctx
        q_idx = torch.arange(past, past + q, device=device)[:, None]
        k_idx = torch.arange(past + q, device=device)[None, :]
        leak = _leak(name, allowed, q_idx, k_idx)
        bias = torch.zeros(leak.shape, dtype=dtype, device=device).masked_fill(leak, math.log(size))
        bias = bias if ctx.bias is None else ctx.bias + bias
        return positions, AttnContext(cos=ctx.cos, sin=ctx.sin, allowed=allowed | leak, is_causal=False, bias=bias)


def _rotary_for(name: str, positional: str) -> None:
    if name == "absolute_leak" and positional != "rotary":
        raise AttnlabError(f"absolute_leak adds the rotary table: expected a rotary model, got "
                           f"positional_embedding_type={positional!r}")


def _input_bug(name: str, size: float, x: Tensor, cos: Optional[Tensor]) -> Tensor:
    """``x [batch, pos, d_model]`` with the planted input bug: the next row mixed in, or the rotary table added."""
    if size == 0:
        return x
    if name == "batch_leak":
        return x + size * (x.roll(1, 0) - x)
    given = cast(Tensor, cos)
    table = given.reshape(given.shape[0], given.shape[1], -1)  # [batch|1, pos, d_head]
    reps = -(-x.shape[-1] // table.shape[-1])
    return x + size * table.repeat(1, 1, reps)[..., : x.shape[-1]].to(x.dtype)


class _PlantedInputOurs:
    """attnlab's Attention with the planted input bug (``self._planted``)."""

    _planted: tuple[str, float]

    def forward(self, x: Tensor, ctx: AttnContext, cache: Any = None) -> Tensor:
        name, size = self._planted
        return super().forward(_input_bug(name, size, x, ctx.cos), ctx, cache)  # type: ignore[misc]


def _leak(name: str, allowed: Tensor, q_idx: Tensor, k_idx: Tensor) -> Tensor:
    """bool like ``allowed``: the masked keys the bug lets through (padded ones, or the next one)."""
    if name == "pad_leak":
        return ~allowed & (k_idx <= q_idx)  # masked although not in the future: padding
    return ~allowed & (k_idx == q_idx + 1)


# --- Hugging Face Llama-family decoders ---------------------------------------------------------

def _layers(model: nn.Module) -> list[nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") for layer in layers):
        raise AttnlabError(f"cannot plant into {type(model).__name__}: expected attnlab's Transformer or a Hugging "
                           f"Face decoder with model.layers[i].self_attn (Llama, Mistral, Qwen2, SmolLM2 ...)")
    return list(layers)


def _plant_rotary(model: nn.Module, fam: Family, size: float) -> nn.Module:
    """The rotary table of a Llama-family model turned wrong against its config (the config is declared first)."""
    rotary: Any = getattr(getattr(model, "model", None), "rotary_emb", None)
    config: Any = model.config
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise AttnlabError(f"{fam.name} needs a model.rotary_emb with an inv_freq table: {type(model).__name__} "
                           "has none")
    base = float(config.rope_parameters["rope_theta"])
    original = max(4, int(config.max_position_embeddings) // 4)
    if fam.name == "rope_base_error":
        d = 2 * rotary.inv_freq.numel()
        inv = (base * (1.0 + size)) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        rotary.inv_freq.copy_(inv.to(rotary.inv_freq.dtype))
        return model
    if fam.name == "llama3_skipped":
        config.rope_parameters = {"rope_type": "llama3", "rope_theta": base, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": original}
    else:
        config.rope_parameters = {"rope_type": "yarn", "rope_theta": base, "factor": 4.0,
                                  "original_max_position_embeddings": original}
    # the implementation under test computes its table with transformers' own function for the declared type
    inv, factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, rotary.inv_freq.device)
    if fam.name == "attention_factor_twice":
        rotary.attention_scaling = factor * factor if size else factor
        rotary.inv_freq.copy_(inv.to(rotary.inv_freq.dtype))
    elif not size:
        rotary.inv_freq.copy_(inv.to(rotary.inv_freq.dtype))  # the control: the scaling applied
    return model


def _plant_hf(model: nn.Module, fam: Family, size: float) -> nn.Module:
    if fam.name in ROTARY_BUGS:
        return _plant_rotary(model, fam, size)
    layers = _layers(model)
    if fam.name == "decode_offset":
        decoder: Any = model.model
        decoder._planted = (fam.name, size)
        _swap(decoder, _PlantedDecoder)
        return model
    for layer in layers:
        attn: Any = layer.self_attn
        attn._planted = (fam.name, size)
        if fam.name == "window_wider":
            attn.sliding_window = WINDOW  # what the module declares (harness/adapters/hf_design.py reads it)
        _swap(attn, _PlantedAttention)
    return model


def _cache_of(kwargs: dict[str, Any]) -> Any:
    return kwargs.get("cache", kwargs.get("past_key_values"))


class _PlantedDecoder:
    """A decoder whose cached steps (a non-empty cache) get position ids ``size`` too high."""

    _planted: tuple[str, float]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        cache, ids = _cache_of(kwargs), kwargs.get("position_ids")
        if cache is not None and ids is not None and cache.get_seq_length() > 0:
            kwargs["position_ids"] = ids + int(self._planted[1])
        return super().forward(*args, **kwargs)  # type: ignore[misc]


class _PlantedAttention:
    """An attention module whose kernel gets a wrong scale, or a mask that lets padded or next keys through or
    applies a wider window than the module declares."""

    _planted: tuple[str, float]
    scaling: float
    layer_idx: int

    def forward(self, hidden_states: Tensor, *args: Any, attention_mask: Optional[Tensor] = None,
                **kwargs: Any) -> Any:
        name, size = self._planted
        if name in INPUT_BUGS:
            rotary = kwargs.get("position_embeddings", args[0] if args else None)  # (cos, sin) [batch, pos, d_head]
            if name == "absolute_leak" and rotary is None:
                raise AttnlabError(f"absolute_leak adds the rotary table: {type(self).__name__} was given no "
                                   "position_embeddings")
            hidden_states = _input_bug(name, size, hidden_states, None if rotary is None else rotary[0][:, :, None])
            return super().forward(hidden_states, *args, attention_mask=attention_mask, **kwargs)  # type: ignore[misc]
        if name == "scale_error":
            # the module keeps declaring its scaling (the adapter reads it: harness/adapters/hf_design.py);
            # only the call its kernel gets uses the wrong one
            declared = self.scaling
            self.scaling = declared * (1.0 + size)
            try:
                return super().forward(hidden_states, *args, attention_mask=attention_mask, **kwargs)  # type: ignore[misc]
            finally:
                self.scaling = declared
        if name != "window_wider" and size == 0:
            return super().forward(hidden_states, *args, attention_mask=attention_mask, **kwargs)  # type: ignore[misc]
        cache = _cache_of(kwargs)
        q = hidden_states.shape[1]
        past = cache.get_seq_length(self.layer_idx) if cache is not None else 0
        n_k = past + q
        q_idx = torch.arange(past, n_k, device=hidden_states.device)[:, None]
        k_idx = torch.arange(n_k, device=hidden_states.device)[None, :]
        if attention_mask is None:  # sdpa's skip: a plain causal mask
            allowed = (k_idx <= q_idx)[None, None]
        elif attention_mask.dtype == torch.bool:
            allowed = attention_mask[..., :n_k]
        else:  # additive: 0 where seen, the dtype's minimum (or -inf) where masked
            allowed = attention_mask[..., :n_k] > torch.finfo(attention_mask.dtype).min / 2
        low = torch.finfo(hidden_states.dtype).min
        if name == "window_wider":
            allowed = allowed & (k_idx > q_idx - (WINDOW + int(size)))
            additive = torch.zeros(allowed.shape, dtype=hidden_states.dtype, device=hidden_states.device)
            additive = additive.masked_fill(~allowed, low)
        else:
            leak = _leak(name, allowed, q_idx, k_idx)
            additive = torch.zeros(allowed.shape, dtype=hidden_states.dtype, device=hidden_states.device)
            additive = additive.masked_fill(~allowed, low).masked_fill(leak, math.log(size))
        return super().forward(hidden_states, *args, attention_mask=additive, **kwargs)  # type: ignore[misc]
