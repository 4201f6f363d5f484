"""Kernel consistency: the configured attention kernel's output equals pattern . V, masks and windows included.

A model may compute its attention output with a fused kernel (``scaled_dot_product_attention``,
FlashAttention, an eager loop) and expose the explicit ``hook_pattern`` from a recomputation.
The two must agree: ``hook_z[b, i, h] == sum_j hook_pattern[b, h, i, j] * hook_v[b, j, h]``
(Vaswani et al. 2017 eq. 1, the output is the pattern-weighted sum of values). A kernel that
masks differently from the explicit path — a window passed as (w, w) where the mask admits w
keys (transformers #39408), padding dropped by the kernel — is invisible in the pattern and
shows here. Real queries only (a padded query's row is arbitrary by design).

Deviation: ``max |z - pattern . v| / max(1, max|v|)``. Tolerance ``max(1e-4, 16 eps)`` of the
model's dtype: two float32 evaluations of a <= 24-term weighted sum differ by ~n * 2^-24.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.adapters.protocol import all_heads
from properties.checks._common import MAX_LEN, fmt, kept, masked_inputs, max_len, real_positions, worse
from properties.checks.window import MAX_WINDOW_LEN
from properties.design import model_dtype, windows
from properties.precision import capture_activations
from properties.registry import Case, Plan, model_property
from properties.search import masked_text


def tolerance_for(dtype: torch.dtype) -> float:
    return max(1e-4, 16 * torch.finfo(dtype).eps)


@model_property(name="kernel_consistency", order=150, calibrated=True, local_floor=True,
                tolerance=lambda model: tolerance_for(model_dtype(model)),
                rule="max(1e-4, 16 eps of the model's dtype) of max(1, max|v|): two float32 evaluations of a "
                     "<= 24-term weighted sum differ by ~n * 2^-24",
                needs=("blocks.{layer}.attn.hook_pattern", "blocks.{layer}.attn.hook_v", "blocks.{layer}.attn.hook_z"))
def kernel_consistency(case: Case) -> Plan:
    """``hook_z`` (the configured kernel's output) equals ``hook_pattern`` . ``hook_v`` at every real query."""
    model, cfg = case.model, case.cfg
    names = {layer: list(case.hooks[3 * layer: 3 * layer + 3]) for layer in range(cfg.n_layers)}
    window = min((w for w in windows(cfg) if w is not None), default=None)
    n = max_len(cfg, cap=max(8, (window or 0) + 3))  # past the smallest window, so its edge is exercised
    first: tuple[Any, ...] = ()
    strategy, tokens = masked_inputs(cfg.d_vocab, n), 0
    if n > MAX_WINDOW_LEN:
        # a long window (Gemma-2's 4096): one row past its edge, measured first in every search whatever its budget
        # and priced by its patterns; the drawn inputs stay short (hypothesis draws them token by token, a padded
        # pass costs what an unpadded one does, and a second long row costs as much again for an edge the first
        # has exercised: on Gemma-3-270m one 515-token pass costs what ten short ones do)
        row = torch.randint(0, cfg.d_vocab, (1, n), generator=torch.Generator().manual_seed(0))
        strategy, first, tokens = masked_inputs(cfg.d_vocab, MAX_LEN), ((row, None),), n

    def measure(example):
        x, mask = example
        acts = capture_activations(model, x, attention_mask=mask, capture=[nm for v in names.values() for nm in v])
        real = real_positions(x, mask)
        worst, where = 0.0, "kernel output equals pattern . V"
        for layer, (pn, vn, zn) in names.items():
            p = acts[pn].double()  # [batch, n_heads, q, k]
            v = all_heads(acts[vn].double(), cfg.n_heads)  # [batch, k, n_heads, d_head]
            z = acts[zn].double()  # [batch, q, n_heads, d_head]
            expected = torch.einsum("bhqk,bkhd->bqhd", p, v)
            scale = max(1.0, float(v.abs().max()))
            err = kept((z - expected).abs().amax(-1) / scale, real[:, :, None])  # [batch, q, n_heads]
            worst, where = worse(err, (worst, where), lambda top, b, i, h, layer=layer, scale=scale: (
                f"layer {layer} head {h} query {i} (row {b}): kernel output differs from pattern . V by "
                f"{fmt(top)} (|v| up to {fmt(scale)})"))
        return worst, where

    return Plan(strategy, measure, masked_text, tokens=tokens, first=first)
