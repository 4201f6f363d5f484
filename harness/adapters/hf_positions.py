"""Positional designs read off a Hugging Face config: rotary scalings that follow the sequence's length, and
Falcon's ALiBi slopes.

transformers' ``dynamic_rope_update`` (modeling_rope_utils) recomputes the rotary frequencies on every call
from the largest position id it is given: ``dynamic`` (NTK-aware scaling, bloc97/emozilla) raises the base once
a sequence passes ``max_position_embeddings``, and ``longrope`` (Ding et al. 2024, LongRoPE; Phi-3) switches from
``short_factor`` to ``long_factor`` once it passes ``original_max_position_embeddings``. A token's rotation then
depends on how long the sequence is, not on its position alone: shifting every position (``position_offset``)
changes the logits, and a cached step (keys rotated while the sequence was short) differs from a full forward.
The adapter declares it as ``DesignFacts.absolute_positions`` (properties/checks/relative.py reads it).

Falcon with ``alibi=True`` (Falcon-RW, Penedo et al. 2023) scales its ALiBi bias with the scores: the original
RefinedWeb code computes ``(q.k + alibi) * inv_norm_factor``, and transformers' sdpa path adds
``alibi / sqrt(head_dim)`` to the mask, so its slopes are Press et al.'s divided by sqrt(head_dim)
(``DesignFacts.alibi_slopes``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from harness.model.positions import alibi_slopes

LENGTH_DEPENDENT = {"dynamic": "max_position_embeddings", "longrope": "original_max_position_embeddings"}


def _rope_dicts(config: Any) -> list[dict]:
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        return []
    if all(isinstance(v, dict) for v in params.values()):  # keyed by layer type
        return list(params.values())
    return [params]


def length_dependence(config: Any, n_ctx: int) -> Optional[str]:
    """The rope scaling of ``config`` whose frequencies follow the sequence's length within the protocol's context
    (positions < ``n_ctx``), in words; None if none. A limit at or past ``n_ctx`` is never crossed there (dynamic
    NTK's is max_position_embeddings itself; Phi-3 ships original_max_position_embeddings=4096)."""
    for rope in _rope_dicts(config):
        kind = str(rope.get("rope_type", rope.get("type", "default")))
        if kind not in LENGTH_DEPENDENT:
            continue
        field = LENGTH_DEPENDENT[kind]
        limit = rope.get(field) if kind == "longrope" else getattr(config, field, None)
        if isinstance(limit, int) and limit < n_ctx:
            return (f"rope_type={kind!r}: the rotary frequencies are recomputed from the sequence's largest position "
                    f"once it passes {field}={limit} (transformers' dynamic_rope_update)")
    return None


def falcon_alibi_slopes(config: Any, n_heads: int, d_head: int) -> Optional[tuple[float, ...]]:
    """Falcon-RW's effective ALiBi slopes (module docstring); None for any other model or without ALiBi."""
    if getattr(config, "model_type", "") != "falcon" or not getattr(config, "alibi", False):
        return None
    return tuple(float(s) / math.sqrt(d_head) for s in alibi_slopes(n_heads))
