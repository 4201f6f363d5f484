"""Causal masking, seen in the pattern: ``hook_pattern`` is exactly 0 above the diagonal.

Where the model declares a sliding window, also outside it (``design.allowed_keys``). Tolerance
0: a masked key's weight is ``exp(-inf) = 0`` or, for additive masks of -1e4 or below,
``exp(<= -1e4)``, which underflows to exactly 0 in float32 (see ``_common``); any positive
weight is a leak.
"""

from __future__ import annotations

from properties import design
from properties.checks._common import fmt, max_len, where_max
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import token_batches


@model_property(name="causal_pattern", order=30, tolerance=0.0,
                rule="exact: a masked weight underflows to exactly 0 in float32",
                applies=Applies(attention=("causal",), min_ctx=2, reason="attention_dir={cfg.attention_dir!r}"),
                needs=("blocks.{layer}.attn.hook_pattern",))
def causal_pattern(case: Case) -> Plan:
    """``hook_pattern`` is exactly 0 on every key a query may not see (causal models).

    Future keys, and with a declared ``cfg.sliding_window`` the keys at ``i - j >= w`` too
    (``design.allowed_keys``); weight inside the window is allowed.
    """
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    windows = [design.window(cfg, layer) for layer in range(cfg.n_layers)]

    def measure(x):
        acts = capture_activations(model, x, capture=names)
        worst, where = 0.0, "no weight on a key outside the causal window"
        for layer, name in enumerate(names):
            p = acts[name].double()  # [batch, n_heads, q, k]
            hidden = ~design.allowed_keys(cfg, layer, x.shape[1])
            outside = p.abs().where(hidden, p.new_zeros(())).nan_to_num(nan=float("inf"))
            if float(outside.max()) > worst:
                worst = float(outside.max())
                b, h, q, k = where_max(outside)
                kind = "future key" if k > q else f"key outside its window of {windows[layer]}"
                where = f"layer {layer} head {h}: query {q} puts weight {fmt(worst)} on {kind} {k} (row {b})"
        return worst, where

    strategy = token_batches(cfg.d_vocab, max_batch=2, min_len=2, max_len=max_len(cfg))
    return Plan(strategy, measure, info=lambda: design.design_summary(cfg))
