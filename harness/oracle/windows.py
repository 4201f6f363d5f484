"""Each layer's sliding window from the config: which keys a layer's queries may see besides causality.

transformers' configs declare windows in three documented ways:

- ``layer_types`` (one entry per layer: "sliding_attention" takes ``sliding_window``, "full_attention" none):
  Gemma 2/3 (Gemma Team 2024: local and global layers interleaved), Qwen2 (``max_window_layers``,
  ``use_sliding_window`` fold into it), Cohere2, Olmo 3 ... A full layer must have no window;
- no ``layer_types`` and an integer ``sliding_window`` (Mistral, Jiang et al. 2023 §2: "SWA" at every layer;
  ``use_sliding_window=False`` switches it off);
- GPT-Neo's ``attention_layers`` ("local" layers take ``window_size``, "global" none).

The window w counts keys as transformers' ``masking_utils`` does (its ``sliding_window_overlay``: a causal query i
sees keys i - w < j <= i). A layer type that is not plain or windowed attention (chunked attention, a linear
or recurrent mixer) has no window the oracle can state: unknown, with the type.
"""

from __future__ import annotations

from typing import Any

from harness.oracle.fields import Fact, integer, layer_config, layer_type, model_type, read, unknown

FULL = "full_attention"
SLIDING = "sliding_attention"


def window(config: Any, layer: int) -> Fact:
    """Layer ``layer``'s window (an int, or None for full attention), by its index in the full stack."""
    c = layer_config(config, layer)
    sliding = integer(c, "sliding_window")
    kind = layer_type(c, layer)
    if kind is not None:
        if kind == FULL:
            return Fact(None, f"layer_types[{layer}]={FULL!r}")
        if kind == SLIDING:
            if sliding is None or sliding[1] < 1:
                return unknown(f"layer_types[{layer}]={SLIDING!r} but sliding_window="
                               f"{read(c, 'sliding_window', None)!r}")
            return Fact(sliding[1], f"layer_types[{layer}]={SLIDING!r}, sliding_window={sliding[1]}")
        return unknown(f"layer_types[{layer}]={kind!r} is neither {FULL!r} nor {SLIDING!r}")
    neo = read(c, "attention_layers", None)
    if model_type(c) == "gpt_neo" and isinstance(neo, (list, tuple)) and layer < len(neo):
        size = integer(c, "window_size")
        if neo[layer] == "local":
            return Fact(size[1], f"attention_layers[{layer}]='local', window_size={size[1]}") if size else \
                unknown("a GPT-Neo local layer without window_size")
        return Fact(None, f"attention_layers[{layer}]={neo[layer]!r}")
    if sliding is None:
        return Fact(None, f"sliding_window={read(c, 'sliding_window', None)!r}, no layer_types")
    if read(c, "use_sliding_window", True) is False:
        return Fact(None, f"use_sliding_window=False (sliding_window={sliding[1]} unused)")
    return Fact(sliding[1], f"sliding_window={sliding[1]} on every layer (no layer_types)")
