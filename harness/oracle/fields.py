"""Reading a Hugging Face config as its documentation defines it, and the oracle's answer type.

transformers documents each config field on the model's config class (``LlamaConfig``: "head_dim: The
attention head dimension. If None, it will default to hidden_size // num_attention_heads"), and since
v5 keeps every rotary setting in ``rope_parameters`` (one dict, or one per layer type keyed as
``layer_types`` names them: Gemma 3, Olmo 3). These readers take those documented meanings; they never
consult a model or its modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from harness.errors import AttnlabError


@dataclass(frozen=True)
class Fact:
    """What the config declares about one design fact: a value and its source, or why it is not determined."""

    value: Any = None
    source: str = ""  # the config fields the value comes from, e.g. "query_pre_attn_scalar=256"
    unknown: str = ""  # non-empty: the config does not determine the fact for this model (the reason)

    @property
    def known(self) -> bool:
        return not self.unknown


def unknown(reason: str) -> Fact:
    return Fact(unknown=reason)


def text_config(config: Any) -> Any:
    """The language model's config: a multimodal config's text part, else the config itself."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def read(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, or None where it is unset or cannot be read globally (a heterogeneous config raises for a
    per-layer field read on the whole model: read it on :func:`layer_config`)."""
    try:
        return getattr(config, name, default)
    except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError and kin: not one value for the model
        return None


def layer_config(config: Any, layer: int) -> Any:
    """The config as layer ``layer`` sees it: a heterogeneous config's per-layer view (``per_layer_config[layer]``,
    Gemma 4), else the (text) config itself."""
    c = text_config(config)
    views = read(c, "per_layer_config")
    if views is not None:
        try:
            return views[layer]
        except (IndexError, KeyError, TypeError):
            return c
    return c


def model_type(config: Any) -> str:
    return str(getattr(text_config(config), "model_type", "") or getattr(config, "model_type", ""))


def integer(config: Any, *names: str) -> Optional[tuple[str, int]]:
    """The first of ``names`` the config sets to an integer, as (name, value)."""
    for name in names:
        value = read(config, name)
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value
    return None


def heads(config: Any) -> tuple[str, int]:
    # an encoder-decoder's cfg describes its decoder (BART's num_attention_heads maps to the encoder's)
    found = integer(config, "decoder_attention_heads", "num_attention_heads", "n_head", "n_heads", "num_heads")
    if found is None:
        raise AttnlabError(f"config of {model_type(config)!r} names no head count (num_attention_heads/n_head/n_heads)")
    return found


def width(config: Any) -> tuple[str, int]:
    found = integer(config, "hidden_size", "d_model", "n_embd")
    if found is None:
        raise AttnlabError(f"config of {model_type(config)!r} names no width (hidden_size/d_model/n_embd)")
    return found


def head_dim(config: Any) -> tuple[int, str]:
    """(d_head, source): ``head_dim`` where the config sets it, else ``hidden_size // num_attention_heads``
    (the documented default of every config class that has the field; Vaswani et al. 2017 §3.2.2: d_k = d_model/h)."""
    explicit = integer(config, "head_dim", "attention_head_size", "head_size", "d_kv")
    if explicit is not None and explicit[1] > 0:
        return explicit[1], f"{explicit[0]}={explicit[1]}"
    (w_name, w), (h_name, h) = width(config), heads(config)
    return w // h, f"{w_name}={w} / {h_name}={h}"


def layer_type(config: Any, layer: int) -> Optional[str]:
    """``config.layer_types[layer]`` ("full_attention", "sliding_attention", ...), None where there is no list."""
    types = read(config, "layer_types")
    if isinstance(types, (list, tuple)) and 0 <= layer < len(types):
        return str(types[layer])
    return None


def rope_parameters(config: Any, layer: int) -> tuple[Optional[dict], str]:
    """(the rotary parameters of ``layer``, where they come from); (None, why) where the layer does not rotate.

    ``rope_parameters`` is either one dict for every layer or a dict of them keyed by layer type; a type
    keyed to None does not rotate (its layers take no positions in attention).
    """
    params = read(config, "rope_parameters")
    if not isinstance(params, dict) or not params:
        return None, "the config has no rope_parameters"
    if all(v is None or isinstance(v, dict) for v in params.values()):
        kind = layer_type(config, layer)
        if kind is None or kind not in params:
            return None, (f"rope_parameters is keyed by layer type ({sorted(params)}) but layer {layer} has type "
                          f"{kind!r}")
        if params[kind] is None:
            return None, f"rope_parameters[{kind!r}] is None: layer {layer} ({kind}) does not rotate"
        return dict(params[kind]), f"rope_parameters[{kind!r}]"
    return dict(params), "rope_parameters"
