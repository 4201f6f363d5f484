"""Rotary norms (metamorphic): RoPE turns pairs of q/k features by angles set by the position alone.

So the same layer-0 input at two position offsets gives the same ``|hook_rot_q|``/``|hook_rot_k|``
per head and position; with a declared ``cfg.rotary_style`` each rotated pair's norm, with a
declared ``cfg.rotary_dim`` (from ``cfg.rotary_offset``: MLA rotates the last features) the
pass-through dims unchanged. Comparing two rotations (not
rotation vs ``hook_q``) lets q/k-norm between ``hook_q`` and the rotation (Qwen3) pass.
Relative tolerance 1e-5 of the head vector's norm (a float32 rotation changes a norm by ~3 * 2^-24).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from properties import design
from properties.checks._common import fmt, max_len, where_max
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, hook_gap, model_property
from properties.strategies import position_offsets, token_batches

MAX_OFFSET = 256
NORM_RTOL = 1e-5


@st.composite  # at module level: see properties/strategies.py's token_batches
def _two_offsets(draw, d_vocab: int, n_ctx: int, longest: int):
    x = draw(token_batches(d_vocab, max_batch=2, max_len=longest))
    top = max(1, min(MAX_OFFSET, n_ctx - x.shape[1]))
    second = draw(position_offsets(top, min_offset=1))
    return x, draw(st.integers(0, second - 1)), second


@model_property(name="rotary_norm", order=100, calibrated=True, local_floor=True, tolerance=NORM_RTOL,
                rule="relative to the head vector's norm: a float32 rotation changes a norm by ~3 * 2^-24",
                applies=Applies(positional=("rotary",),
                                reason="positional_embedding_type={cfg.positional_embedding_type!r}"),
                needs=design.rotary_hooks, needs_doc="blocks.{first rotary layer}.attn.hook_rot_q, hook_rot_k")
def rotary_norm(case: Case) -> Plan:
    """The same layer-0 input at two offsets gives equal ``|hook_rot_q|``, ``|hook_rot_k|`` per head and position."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    dim, style = design.rotary_layout(cfg)
    offset, _ = design.rotary_span(cfg)  # the turning direction does not change a norm
    # feeding the second run the first run's layer-0 input makes "the same input" literal, so an
    # absolute position leak (relative_position's business) cannot pose as a norm change
    layer = design.first_rotary_layer(cfg)  # the layers before it have no positions (cfg.rotary_layers)
    resid = f"blocks.{layer}.hook_resid_pre"
    patchable = hook_gap(model, [resid], case.observed) is None
    longest = max(1, min(max_len(cfg), cfg.n_ctx - 1))

    def norms(t):
        t = t.double()
        whole = t.norm(dim=-1)  # [batch, pos, heads]
        rot, kept = design.rotary_split(t, dim, offset)
        turned = design.pair_norms(t, dim, style, offset) if style is not None else rot.norm(dim=-1, keepdim=True)
        return whole, turned, kept

    def measure(example):
        x, first, second = example
        _, a = forward_capture(model, x, position_offset=first, capture=names + ([resid] if patchable else []))
        _, b = forward_capture(model, x, position_offset=second, capture=names,
                               patch={resid: a[resid]} if patchable else None)
        worst, where = 0.0, "norms kept"
        for name, which in zip(names, ("q", "k"), strict=True):
            whole, turned_a, kept_a = norms(a[name])
            _, turned_b, kept_b = norms(b[name])
            denom = whole.clamp(min=1e-12)[..., None]
            err = torch.cat(((turned_b - turned_a).abs() / denom, (kept_b - kept_a).abs() / denom), -1)
            err = err.nan_to_num(nan=float("inf")).amax(-1)  # [batch, pos, heads]
            if float(err.max()) > worst:
                worst = float(err.max())
                bi, p, h = where_max(err)
                seen, before = float(b[name][bi, p, h].norm()), float(a[name][bi, p, h].norm())
                where = (f"layer {layer} {which}, head {h} pos {p} (row {bi}): |rot_{which}| {fmt(seen)} at offset "
                         f"{second} vs {fmt(before)} at offset {first}")
        return worst, where

    def describe(example):
        x, first, second = example
        return f"tokens={x.tolist()} position_offsets={first},{second}"

    layout = f"rotary_dim={dim}" + (f" from feature {offset}, " if offset else ", ") + \
        (f"{style} pairs" if style else "pair layout undeclared: whole-vector norms")
    if not patchable:
        layout += f"; layer-{layer} input not patched (hook_resid_pre unobserved)"
    return Plan(_two_offsets(cfg.d_vocab, cfg.n_ctx, longest), measure, describe, info=lambda: layout)
