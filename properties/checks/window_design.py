"""The window layout the config declares: every layer masks exactly the keys the design oracle says.

The design oracle (``harness.oracle.window``) reads each layer's window from the config alone (``layer_types``
with ``sliding_window``, Mistral's window on every layer, GPT-Neo's ``attention_layers``): a windowed layer's
causal query i admits keys i - w < j <= i, a full layer every key j <= i. ``sliding_window`` checks windowed
layers against the window the model's cfg declares; this row checks the layout itself against the config,
full layers included, so a window applied to a full-attention layer (or a local layer left unwindowed) is red
here and not only by accident elsewhere.

Exact (tolerance 0): on unpadded inputs reaching a few keys past the smallest window, a key is masked in
``hook_attn_scores`` when its score is -inf or at most -1e4 (the masks transformers builds use the dtype's
minimum; older models -1e4). Any admitted key masked, or any other key left unmasked, counts 1. Bidirectional
windows (each side's count is a convention the models do not share) and layers the oracle cannot place are not
compared; a model with no window anywhere, by the config and by its cfg, is n/a.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from properties import declared
from properties.checks.scale import MASK_CEILING
from properties.checks.window import admitted, past_the_edge
from properties.design import windows
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property


def _placed(cfg: Any) -> list[tuple[int, Optional[int]]]:
    """(layer, the oracle's window) of every layer the oracle places."""
    facts = [(layer, declared.window(cfg, layer)) for layer in range(cfg.n_layers)]
    return [(layer, fact.value) for layer, fact in facts if fact.known]


def _applies(model: Any) -> Optional[str]:
    cfg = model.cfg
    if cfg.attention_dir != "causal":
        return ""
    placed = _placed(cfg)
    if not placed:
        return f"the design oracle places no layer: {declared.window(cfg, 0).unknown}"
    if all(w is None for _, w in placed) and all(w is None for w in windows(cfg)):
        return ""
    return None


@model_property(name="window_layout", order=135, tolerance=0.0,
                rule="exact: a key masked against the config's layout, or left unmasked, counts 1",
                applies=Applies(attention=("causal",), min_ctx=2, when=_applies,
                                when_doc="a causal model whose config or cfg declares a sliding window on some layer"),
                needs=lambda cfg: tuple(f"blocks.{layer}.attn.hook_attn_scores" for layer, _ in _placed(cfg)),
                needs_doc="blocks.{layer}.attn.hook_attn_scores of every layer the design oracle places")
def window_layout(case: Case) -> Plan:
    """Each layer's scores mask exactly the keys outside its declared window (or, on a full layer, none but causal)."""
    model, cfg = case.model, case.cfg
    placed = _placed(cfg)
    names = dict(zip((layer for layer, _ in placed), case.hooks, strict=True))
    sources = {layer: declared.window(cfg, layer).source for layer, _ in placed}
    edges = [w for _, w in placed if w is not None] + [w for w in windows(cfg) if w is not None]
    longest, strategy = past_the_edge(cfg, min(edges))

    def measure(x):
        acts = capture_activations(model, x, capture=list(names.values()))
        n = x.shape[1]
        for layer, w in placed:
            scores = acts[names[layer]].double()  # [batch, n_heads, q, k]
            masked = ~torch.isfinite(scores) | (scores <= MASK_CEILING)
            inside = admitted(n, w if w is not None else n + 1, True)
            wrong = masked == inside  # masked where admitted, or open where not
            if bool(wrong.any()):
                b, h, i, j = (int(t) for t in wrong.nonzero()[0])
                seen = "masks" if masked[b, h, i, j] else "admits"
                expected = f"keys {max(0, i - w + 1)}..{i}" if w is not None else f"every key 0..{i}"
                return 1.0, (f"layer {declared.layer_id(cfg, layer)} head {h} (row {b}): query {i} {seen} key {j}; "
                             f"the config declares {expected} ({sources[layer]})")
        return 0.0, "every layer masks as its config declares"

    return Plan(strategy, measure, tokens=longest if longest > 24 else 0)
