"""Rotary precision: at every position up to n_ctx, rotary equals a float64 rotation, in the model's dtype.

RoPE (Su et al. 2021, eq. 34) turns each pair of q/k features by ``pos * theta_i`` with
``theta_i = base^(-2i/rotary_dim)``, so ``rot(pos + p) = R(p) rot(pos)``. At layer 0 (the first
rotating layer, ``cfg.rotary_layers``: the layers before it have no positions) the
input does not depend on positions (rotary models add none; where ``hook_resid_pre`` fires, the offset-p
run is given the offset-0 run's input to that layer, so it is the same input literally), so ``hook_rot_q`` at
``position_offset=p`` must equal the float64 rotation by p of ``hook_rot_q`` at offset 0 —
the reference needs neither ``hook_q`` nor the model's code, only its declared design
(``rotary_dim``, ``rotary_style``, ``rotary_base``, ``rotary_offset``, ``rotary_direction``; partial
rotary leaves the other features alone). A second, purely relative check: the rotated scores
``<rot_q_i, rot_k_j>`` at offset p equal those at offset 0 (they depend on i - j only).

Field bugs: ``inv_freq`` or the phase ``pos * inv_freq`` computed in bfloat16/float16 has a
relative phase error of 2^-9 / 2^-11, i.e. radians at a few thousand positions (transformers
#25681, #29496, #29285; EleutherAI/gpt-neox #1003). Allowed error, relative to |rot_q| per head
and position: ``16 u_dtype + 32 (p + n) u_32`` (u: unit roundoff). A phase computed in float32
is off by <= ~4 u_32 per radian of position (one rounding of theta, one of the product), cos/sin
and the bfloat16/float16 cast add a few u_dtype. Deviation: the error over the allowance
(tolerance 1.0), at the offset hypothesis finds worst, up to n_ctx - n.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from hypothesis import strategies as st

from properties.checks._common import fmt, max_len, worse
from properties.design import first_rotary_layer, rotary_design, rotary_hooks, rotary_span, turn_pairs, unit_roundoff
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, hook_gap, model_property
from properties.search import offset_text
from properties.strategies import token_batches

TOLERANCE = 1.0
U32 = unit_roundoff(torch.float32)


def rotate(x: torch.Tensor, p: int, dim: int, style: str, base: float, offset: int = 0,
           direction: int = 1) -> torch.Tensor:
    """Turn features ``offset .. offset + dim`` of ``x [..., d_head]`` (float64) by ``direction * p * theta_i``,
    Su et al. eq. 34; the others pass through."""
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = direction * p * theta
    return turn_pairs(x, ang.cos(), ang.sin(), dim, style, offset)


def _default_rope(model: Any) -> Optional[str]:
    # scaled RoPE variants (linear, dynamic, YaRN, ...) have their own angles
    return None if getattr(model.cfg, "rope_type", None) in (None, "default") else ""


@st.composite  # at module level: see properties/strategies.py's token_batches
def _far_offsets(draw, d_vocab: int, n_ctx: int, longest: int):
    x = draw(token_batches(d_vocab, max_batch=2, max_len=longest))
    top = n_ctx - x.shape[1]
    # the far end of the context first: precision is lost with position
    return x, draw(st.one_of(st.just(top), st.integers(1, top)))


@model_property(name="rotary_precision", order=160, tolerance=TOLERANCE,
                rule="the error over its allowance 16 u_dtype + 32 (p + n) u_32 of |rot_q| (u: unit roundoff)",
                applies=Applies(positional=("rotary",), min_ctx=2, when=_default_rope,
                                when_doc="unscaled RoPE (cfg.rope_type None or default)"),
                needs=rotary_hooks, needs_doc="blocks.{first rotary layer}.attn.hook_rot_q, hook_rot_k",
                # an adapter that could not read the layout or base: no reference to compare with
                declares=("rotary_style", "rotary_base"))
def rotary_precision(case: Case) -> Plan:
    """Layer-0 ``hook_rot_q``/``hook_rot_k`` at offset p equal a float64 rotation by p of offset 0's."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    layer = first_rotary_layer(cfg)
    # the offset-p run is fed the offset-0 run's input to that layer, so "the same input" is literal where
    # a layer before it depends on position by design (RecurrentGemma's recurrence resets at position 0)
    resid = f"blocks.{layer}.hook_resid_pre"
    patchable = hook_gap(model, [resid], case.observed) is None
    dim, style, base = rotary_design(cfg)
    first, direction = rotary_span(cfg)  # the first rotated feature (MLA: the last rotary_dim turn)
    n_max = max_len(cfg, cap=4)
    strategy = _far_offsets(cfg.d_vocab, cfg.n_ctx, min(n_max, cfg.n_ctx - 1))

    def measure(example):
        x, offset = example
        _, at0 = forward_capture(model, x, capture=names + ([resid] if patchable else []))
        _, atp = forward_capture(model, x, position_offset=offset, capture=names,
                                 patch={resid: at0[resid]} if patchable else None)
        dtype = at0[names[0]].dtype
        n = x.shape[1]
        allow = 16 * unit_roundoff(dtype) + 32 * (offset + n) * U32
        worst, where = 0.0, "rotations exact"
        for nm in names:
            r0, rp = at0[nm].double(), atp[nm].double()  # [batch, pos, heads, d_head]
            ref = rotate(r0, offset, dim, style, base, first, direction)
            err = ((rp - ref).norm(dim=-1) / r0.norm(dim=-1).clamp(min=1e-30)) / allow
            worst, where = worse(err, (worst, where), lambda top, b, i, h, nm=nm: (
                f"layer {layer} {nm.split('.')[-1]} head {h} position {offset + i} (row {b}): relative error "
                f"{fmt(top * allow)} vs a float64 rotation, allowed {fmt(allow)} in {dtype}"))
        q0, k0 = at0[names[0]].double(), at0[names[1]].double()
        qp, kp = atp[names[0]].double(), atp[names[1]].double()
        heads = q0.shape[2] // k0.shape[2]
        k0, kp = k0.repeat_interleave(heads, 2), kp.repeat_interleave(heads, 2)
        s0, sp = torch.einsum("bqhd,bkhd->bhqk", q0, k0), torch.einsum("bqhd,bkhd->bhqk", qp, kp)
        size = torch.einsum("bqh,bkh->bhqk", q0.norm(dim=-1), k0.norm(dim=-1)).clamp(min=1e-30)
        rel = ((sp - s0).abs() / size) / (2 * allow)
        worst, where = worse(rel, (worst, where), lambda top, b, h, i, j: (
            f"layer {layer} head {h} (row {b}): score <rot_q {i}, rot_k {j}> changes by "
            f"{fmt(top * 2 * allow)} of |q||k| between offset 0 and {offset} (allowed {fmt(2 * allow)})"))
        return worst, where

    return Plan(strategy, measure, offset_text)
