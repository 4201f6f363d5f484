"""Rotary frequencies as the config declares them: every rotary layer turns q and k by the oracle's angles.

For each layer the design oracle (``harness.oracle.rotary``) computes, from the config and the papers, the
rotation that layer must apply at a given sequence length: the inverse frequencies of its ``rope_type``
(default, linear, dynamic NTK, YaRN, LongRoPE, Llama 3, proportional; per layer type where
``rope_parameters`` is keyed by type), the attention factor scaled RoPE multiplies cos/sin by (YaRN's
0.1 ln s + 1, LongRoPE's sqrt(1 + ln s / ln L0)), the rotated span (``partial_rotary_factor``) and the pair
layout. ``hook_rot_q``/``hook_rot_k`` must equal that rotation of ``hook_q``/``hook_k`` (the rotation's
inputs, after any q/k norm) at positions offset .. offset + n - 1: q_rot = a R(m) q on the rotated features,
the others passed through. A wrong base, a skipped Llama 3 correction, an attention factor applied twice, a
local layer given the global layers' base all keep every invariant and fail here.

Lengths straddle what frequencies depend on: offsets are drawn up to the usable context, the far end first
(precision is lost with position), which for LongRoPE crosses ``original_max_position_embeddings``. Dynamic
NTK is defined by the length of the sequence at hand; transformers caches frequencies at the longest
length seen, so each example is preceded by a one-token call that returns that cache to the original context
(a model without such a cache is unaffected).

Allowance, relative to |a q| per head and position: ``16 u_dtype + 32 (p + n) u_32`` (rotary_precision's:
a phase computed in float32 is off by a few u_32 per radian, cos/sin and the cast to the dtype add a few
u_dtype). Deviation: the error over the allowance (tolerance 1.0).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from harness.oracle import RopeSpec
from properties import declared
from properties.checks._common import fmt, max_len, worse
from properties.checks.rotary_phase import _far_offsets
from properties.design import unit_roundoff
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property
from properties.search import offset_text

TOLERANCE = 1.0
U32 = unit_roundoff(torch.float32)
POINTS = ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k")


def rotary_layers(cfg: Any) -> list[int]:
    """The checked layers the oracle gives a rotation (at the usable context's length)."""
    return [layer for layer in range(cfg.n_layers) if declared.rotation(cfg, layer, cfg.n_ctx).known]


def _undetermined(model: Any) -> Optional[str]:
    cfg = model.cfg
    if rotary_layers(cfg):
        return None
    return f"the design oracle gives no rotation: {declared.rotation(cfg, 0, cfg.n_ctx).unknown}"


def _hooks(cfg: Any) -> tuple[str, ...]:
    return tuple(f"blocks.{layer}.attn.{p}" for layer in rotary_layers(cfg) for p in POINTS)


def turn(x: torch.Tensor, positions: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """``x [batch, pos, heads, d_head]`` (float64) turned as ``spec`` says at ``positions [pos]`` (Su et al. eq. 34),
    the turned features times the attention factor, the rest passed through."""
    inv = torch.tensor(spec.inv_freq, dtype=torch.float64)
    width = 2 * inv.numel()
    ang = positions.double()[:, None] * inv[None, :]  # [pos, pairs]
    cos, sin = (ang.cos() * spec.attention_factor)[None, :, None], (ang.sin() * spec.attention_factor)[None, :, None]
    rot, rest = x[..., :width], x[..., width:]
    if spec.style == "half":
        a, b = rot[..., : width // 2], rot[..., width // 2:]
        turned = torch.cat((a * cos - b * sin, a * sin + b * cos), -1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        turned = torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)
    return torch.cat((turned, rest), -1)


@model_property(name="rotary_frequencies", order=95, tolerance=TOLERANCE,
                rule="the error over its allowance 16 u_dtype + 32 (p + n) u_32 of |a q| (u: unit roundoff)",
                applies=Applies(positional=("rotary",), min_ctx=2, when=_undetermined,
                                when_doc="the design oracle gives a rotation for the config's layers"),
                needs=_hooks, needs_doc="blocks.{layer}.attn.hook_q, hook_k, hook_rot_q, hook_rot_k of every layer "
                                        "the oracle gives a rotation")
def rotary_frequencies(case: Case) -> Plan:
    """Each rotary layer's ``hook_rot_q``/``hook_rot_k`` are the oracle's rotation of ``hook_q``/``hook_k``."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    layers = rotary_layers(cfg)
    specs = [declared.rotation(cfg, layer, cfg.n_ctx).value for layer in layers]
    dynamic = any(spec.rope_type == "dynamic" for spec in specs)
    # past the usable context only where the rotation is declared for it (dynamic NTK: factor times the original)
    reach = max([cfg.n_ctx] + [spec.reach for spec in specs if spec.reach is not None])
    n_max = max_len(cfg, cap=4)
    strategy = _far_offsets(cfg.d_vocab, reach, min(n_max, cfg.n_ctx - 1))

    def measure(example):
        x, offset = example
        if dynamic:  # a short call returns a cached dynamic-NTK table to the original context
            capture_activations(model, x[:1, :1], capture=names[:1])
        acts = capture_activations(model, x, position_offset=offset, capture=names)
        n = x.shape[1]
        positions = offset + torch.arange(n)
        dtype = acts[names[0]].dtype
        allow = 16 * unit_roundoff(dtype) + 32 * (offset + n) * U32
        worst, where = 0.0, "rotations as declared"
        for i, layer in enumerate(layers):
            fact = declared.rotation(cfg, layer, offset + n)
            spec = fact.value
            for raw, rot in ((0, 2), (1, 3)):
                before, after = acts[names[4 * i + raw]].double(), acts[names[4 * i + rot]].double()
                expected = turn(before, positions, spec)
                size = (before.norm(dim=-1) * max(1.0, spec.attention_factor)).clamp(min=1e-30)
                err = (after - expected).norm(dim=-1) / size / allow  # [batch, pos, heads]
                label = POINTS[rot]
                worst, where = worse(err, (worst, where), lambda top, b, p, h, label=label, layer=layer, fact=fact: (
                    f"layer {declared.layer_id(cfg, layer)} {label} head {h} position {offset + p} (row {b}): relative "
                    f"error {fmt(top * allow)} against the declared rotation ({fact.source}), allowed {fmt(allow)} "
                    f"in {dtype}"))
        return worst, where

    def info() -> str:
        specs = {declared.rotation(cfg, layer, cfg.n_ctx).source for layer in layers}
        return "expected from " + " | ".join(sorted(specs))

    return Plan(strategy, measure, offset_text, info)
