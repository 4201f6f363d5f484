"""Sliding windows: on a layer that declares a window w, each query attends to exactly the keys it admits.

Convention (transformers ``masking_utils``, the one Mistral, Gemma 2/3 and Qwen2 follow):
a causal window admits key j for query i when ``i - w < j <= i`` (``sliding_window_overlay``:
``kv_idx > q_idx - sliding_window``), i.e. w keys, the query's own included; a bidirectional
window admits ``|i - j| <= w`` (``sliding_window_bidirectional_overlay``), 2w + 1 keys.
The field bugs this catches: a window one wider than declared (transformers #29623, vLLM #3385,
where backends disagreed on w vs w + 1) and a window that grew to 2w + 1 (transformers #39408).

Deviation (tolerance 0): a key outside the window with positive ``hook_pattern`` weight counts
its weight; a key inside the window with weight exactly 0 counts 1, unless rounding explains the
0. An admitted key's softmax weight ``exp(s_j - logsumexp(s))`` is 0 only if it lies below the
smallest positive number of the pattern's dtype (float32 and bfloat16: exp(-103.3); float16:
2^-24 = 5.96e-8, i.e. a score only ~17 below the row's log-normaliser, which a real checkpoint
reaches: Gemma-3-270m in float16 rounds an admitted weight of 6.6e-9 to 0). Where the layer's
``hook_attn_scores`` fire, a zero weight is therefore counted only when the key is masked in the
scores (the dtype's minimum or -inf, the mask of a too-narrow window) or when its weight
recomputed in float64 from the same scores is at least that smallest positive number, so it
should have survived the cast. Without the scores hook every zero counts, as in float32.
Layers without a window (None) are left to ``causal_pattern``. Unpadded inputs only: a window
is counted in sequence indices, and with padding a model may count pads or not.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from properties.checks._common import MAX_LEN, fmt, worse
from properties.design import windows
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import LONGEST_DRAWN, long_token_batches, token_batches

MAX_WINDOW_LEN = 24  # windows up to this long get searched lengths and batches; longer ones one row past the edge


def admitted(n: int, window: int, causal: bool) -> torch.Tensor:
    """bool ``[query_pos, key_pos]``: the keys a window of ``window`` admits (transformers' convention)."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if causal:
        return (j <= i) & (j > i - window)
    return (i - j).abs() <= window


def _windowed(model: Any) -> Optional[str]:
    return None if any(w is not None for w in windows(model.cfg)) else ""


@model_property(name="sliding_window", order=130, tolerance=0.0,
                rule="exact: a key outside the window with positive weight counts its weight, an admitted key "
                     "with weight exactly 0 counts 1",
                applies=Applies(min_ctx=2, when=_windowed, when_doc="a layer declares cfg.sliding_window"),
                needs=lambda cfg: tuple(f"blocks.{layer}.attn.hook_pattern"
                                        for layer, w in enumerate(windows(cfg)) if w is not None),
                needs_doc="blocks.{layer}.attn.hook_pattern of every windowed layer")
def sliding_window(case: Case) -> Plan:
    """Every query of a windowed layer puts positive weight on exactly the keys its window admits."""
    model, cfg = case.model, case.cfg
    layers = [(layer, w) for layer, w in enumerate(windows(cfg)) if w is not None]
    names = dict(zip((layer for layer, _ in layers), case.hooks, strict=True))
    causal = cfg.attention_dir == "causal"
    # reach past the smallest window by a few keys, so that both edges of the window are seen: a real
    # checkpoint's window (Gemma-3: 512) takes inputs that long, one row each (a few seconds per pass)
    longest, strategy = past_the_edge(cfg, min(w for _, w in layers))
    scores = {layer: f"blocks.{layer}.attn.hook_attn_scores" for layer, _ in layers}
    scores = {layer: name for layer, name in scores.items() if name in case.observed}

    def measure(x):
        acts = capture_activations(model, x, capture=[*names.values(), *scores.values()])
        n = x.shape[1]
        worst, where = 0.0, "every query sees exactly its window"
        for layer, w in layers:
            pattern = acts[names[layer]]
            p = pattern.double().nan_to_num(nan=float("inf"))  # [batch, n_heads, q, k]
            inside = admitted(n, w, causal)
            leak = p.where(~inside, p.new_zeros(()))
            missing = (p == 0) & inside
            if layer in scores:
                missing &= ~rounded_to_zero(acts[scores[layer]], pattern.dtype)
            if bool(missing.any()) and 1.0 > worst:
                worst = 1.0
                b, h, i, j = (int(t) for t in missing.nonzero()[0])
                where = (f"layer {layer} head {h} (row {b}): query {i} puts weight 0 on key {j}, "
                         f"which the window w={w} admits (expected keys {_span(i, n, w, causal)})")
            worst, where = worse(leak, (worst, where), lambda top, b, h, i, j, layer=layer, w=w: (
                f"layer {layer} head {h} (row {b}): query {i} puts weight {fmt(top)} on key {j} "
                f"(distance {i - j}), outside the window w={w} (expected keys {_span(i, n, w, causal)})"))
        return worst, where

    return Plan(strategy, measure, tokens=longest if longest > MAX_WINDOW_LEN else 0)


def past_the_edge(cfg: Any, window: int) -> tuple[int, Any]:
    """(the longest length, a strategy of unpadded batches) reaching a few keys past ``window``, within n_ctx."""
    longest = min(cfg.n_ctx, max(MAX_LEN, window + 3))
    if longest <= MAX_WINDOW_LEN:
        return longest, token_batches(cfg.d_vocab, max_batch=2, min_len=min(2, longest), max_len=longest)
    if longest <= LONGEST_DRAWN:
        return longest, token_batches(cfg.d_vocab, max_batch=1, min_len=longest, max_len=longest)
    # thousands of tokens (Gemma-2's window of 4096): rows from drawn seeds
    return longest, long_token_batches(cfg.d_vocab, longest)


def rounded_to_zero(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool like ``scores``: keys whose weight is 0 in ``dtype`` by rounding, not by a mask.

    A key is masked when its score is -inf or at most half the scores' dtype minimum (the additive
    masks transformers builds use the minimum itself). An unmasked key's float64 weight
    ``softmax(scores)`` below ``finfo(dtype).smallest_normal * finfo(dtype).eps`` (the smallest subnormal)
    cannot be represented in ``dtype`` and rounds to 0.
    """
    wide = scores.double()
    masked = ~torch.isfinite(wide) | (wide <= torch.finfo(scores.dtype).min / 2)
    weight = torch.softmax(wide.masked_fill(masked, -math.inf), dim=-1).nan_to_num(nan=0.0)
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the smallest subnormal: 2^-24 in float16
    return ~masked & (weight < tiny)


def _span(i: int, n: int, w: int, causal: bool) -> str:
    lo, hi = (max(0, i - w + 1), i) if causal else (max(0, i - w), min(n - 1, i + w))
    return f"{lo}..{hi}"
