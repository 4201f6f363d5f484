"""Every attention pattern of a batch, computed no further than the last one asked for.

``attention_patterns(model, tokens)`` is ``run_with_cache`` filtered to ``hook_pattern``, without the
work nobody reads: the pass ends as the last requested layer's pattern is written (that layer's value
mixing and output, the later layers, ``ln_final`` and the unembedding never run; at GPT-2 small's shape
the unembedding alone is a third of a forward pass), and only the patterns are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from harness.adapters.protocol import AnyModel
from harness.errors import AttnlabError, AttnlabTypeError
from probes import _patterns
from probes._validate import KINDS, ModelInfo, check_batch_size, check_choice, probe_inputs, takes_any_model


def _layers(layers: Any, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise AttnlabTypeError(f"layers must be None or a sequence of layer indices, got {type(layers).__name__}")
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise AttnlabError(f"layers holds {layer!r}: expected integers in [0, {n_layers})")
        out.append(layer)
    if not out:
        raise AttnlabError("layers is empty: expected at least one layer index")
    if len(set(out)) != len(out):
        raise AttnlabError(f"layers {list(layers)} repeats a layer: expected distinct indices")
    return out


@takes_any_model
def attention_patterns(model: AnyModel, tokens: Tensor, *, layers: Optional[Sequence[int]] = None,
                       attention_mask: Optional[Tensor] = None, batch_size: Optional[int] = None,
                       kind: Optional[str] = None, source_tokens: Optional[Tensor] = None,
                       source_mask: Optional[Tensor] = None) -> Float[Tensor, "layer batch head query key"]:
    """The attention patterns ``[len(layers), batch, n_heads, query_pos, key_pos]`` (float32, on the model's
    device), in the order of ``layers`` (default every layer): what ``blocks.{l}.attn.hook_pattern`` sees.

    An encoder-decoder's three stacks have patterns of three shapes, so ``kind`` says which stack to read
    (``encoder``: ``[.., src_pos, src_pos]``; ``decoder``: ``[.., pos, pos]``; ``cross``: ``[.., pos, src_pos]``),
    ``layers`` counting within it, given ``source_tokens``/``source_mask`` as :func:`probes.head_importance` takes
    them; a decoder-only model takes no ``kind``.

    ``batch_size``: sequences per forward pass (default: all of them in one pass)."""
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, need_pattern=True, attention_mask=attention_mask,
                                     need_loss=False, source_tokens=source_tokens, source_mask=source_mask)
    stack = _check_kind(kind, info)
    wanted = _layers(layers, len(stack))
    chunks = [per_layer for _, per_layer in
              _patterns.stream(model, info, data, batch_size=data.n if batch_size is None else batch_size,
                               rows=[stack[layer] for layer in wanted])]
    if len(chunks) == 1:
        return torch.stack(chunks[0])
    return torch.stack([torch.cat([c[i] for c in chunks]) for i in range(len(wanted))])


def _check_kind(kind: Any, info: ModelInfo) -> list[int]:
    """The mask rows of the stack ``kind`` names, by layer."""
    if not info.kinds:
        if kind is not None:
            raise AttnlabError(f"kind={kind!r} is for an encoder-decoder (cfg.is_encoder_decoder); this model has one "
                               f"stack: expected kind=None")
        return list(range(info.n_layers))
    if kind is None:
        raise AttnlabError(f"the model is an encoder-decoder, whose stacks' patterns differ in shape: expected kind= "
                           f"one of {list(KINDS)}")
    return info.rows_of(check_choice("kind", kind, KINDS))
