"""Rotary frequencies as the config declares them: every rotary layer turns q and k by the oracle's angles.

For each layer the design oracle (``harness.oracle.rotary``) computes, from the config and the papers, the
rotation that layer must apply at a given sequence length: the inverse frequencies of its ``rope_type``
(default, linear, dynamic NTK, YaRN, LongRoPE, Llama 3, proportional; per layer type where
``rope_parameters`` is keyed by type), the attention factor scaled RoPE multiplies cos/sin by (YaRN's
0.1 ln s + 1, LongRoPE's sqrt(1 + ln s / ln L0)), the rotated span (``partial_rotary_factor``) and the pair
layout. ``hook_rot_q``/``hook_rot_k`` must equal that rotation of ``hook_q``/``hook_k`` (the rotation's
inputs, after any q/k norm) at positions offset .. offset + n - 1: q_rot = a R(m) q on the rotated features,
the others passed through (a key is compared with the nearest turned key head: grouped key heads are
repeated per hook as the model repeats them there, in an order that need not agree). A wrong base, a skipped
Llama 3 correction, an attention factor applied twice, a local layer given the global layers' base all keep every
invariant and fail here.

Where ``hook_q``/``hook_k`` do not fire (partial rotary applied outside a (q, k) rotary function: Phi, StableLM;
GPT-J's own function; Llama 4's complex product) the layer is checked relatively, from ``hook_rot_q``/``hook_rot_k``
alone: the offset-p pass is given the offset-0 pass's input to every such layer (``hook_resid_pre``), so its q and
k are the same vectors, and q_rot at p must be the oracle's rotation to p + i of q_rot at i turned back, times
a_p / a_0 -- the frequencies of every rope_type are compared; a position-independent attention factor cancels.

Lengths straddle what frequencies depend on: offsets are drawn up to the usable context, the far end first
(precision is lost with position), which for LongRoPE crosses ``original_max_position_embeddings``. Dynamic
NTK is defined by the length of the sequence at hand; transformers caches frequencies at the longest
length seen, so each example is preceded by a one-token call that returns that cache to the original context
(a model without such a cache is unaffected).

Allowance, relative to the expected |rot_q| per head and position: ``16 u_dtype + 32 (p + n) u_32`` (rotary_precision's:
a phase computed in float32 is off by a few u_32 per radian, cos/sin and the cast to the dtype add a few
u_dtype). Deviation: the error over the allowance (tolerance 1.0). A bfloat16/float16 model's pass is replayed on its
float64 twin (the same code, rounding 2^-53): a bug under the low dtype's rounding is reported hidden, not missed.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from harness.oracle import RopeSpec
from properties import declared
from properties.checks._common import fmt, max_len, worse
from properties.checks.rotary_phase import _far_offsets
from properties.design import turn_pairs, unit_roundoff
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property
from properties.search import offset_text

TOLERANCE = 1.0
U32 = unit_roundoff(torch.float32)


def rotary_layers(cfg: Any) -> list[int]:
    """The checked layers the oracle gives a rotation (at the usable context's length)."""
    return [layer for layer in range(cfg.n_layers) if declared.rotation(cfg, layer, cfg.n_ctx).known]


def _undetermined(model: Any) -> Optional[str]:
    cfg = model.cfg
    if rotary_layers(cfg):
        return None
    return f"the design oracle gives no rotation: {declared.rotation(cfg, 0, cfg.n_ctx).unknown}"


def _hooks(cfg: Any) -> tuple[str, ...]:
    # per layer: the rotated q and k, and the rotation's inputs, or the layer's input for the relative comparison
    names = []
    for layer in rotary_layers(cfg):
        attn, resid = f"blocks.{layer}.attn", f"blocks.{layer}.hook_resid_pre"
        names += [f"{attn}.hook_rot_q", f"{attn}.hook_rot_k", f"{attn}.hook_q|{resid}", f"{attn}.hook_k|{resid}"]
    return tuple(names)


def turn(x: torch.Tensor, positions: torch.Tensor, spec: RopeSpec, factor: Optional[float] = None,
         normalise: bool = True) -> torch.Tensor:
    """``x [batch, pos, heads, d_head]`` (float64) turned as ``spec`` says to ``positions [pos]`` (Su et al. eq. 34),
    the turned features times ``factor`` (default the spec's attention factor), the rest passed through, then
    RMS-normalised where the spec says (and ``normalise``)."""
    inv = torch.tensor(spec.inv_freq, dtype=torch.float64)
    width = 2 * inv.numel()
    scale = spec.attention_factor if factor is None else factor
    ang = spec.direction * positions.double()[:, None] * inv[None, :]  # [pos, pairs]
    cos, sin = (ang.cos() * scale)[None, :, None], (ang.sin() * scale)[None, :, None]
    out = turn_pairs(x, cos, sin, width, spec.style, spec.offset)
    if spec.normed_after is not None and normalise:
        out = out * torch.rsqrt(out.square().mean(-1, keepdim=True) + spec.normed_after)
    return out


def _gap(after: torch.Tensor, expected: torch.Tensor, key: bool) -> torch.Tensor:
    """|after - expected| per [batch, pos, head] over |expected|; a key head may match any expected key head: an
    adapter repeats grouped key heads for each hook as the model does at that point, in an order that need not agree
    (JetMoE)."""
    gap = (after[..., :, None, :] - expected[..., None, :, :]).norm(dim=-1)  # [batch, pos, heads, heads]
    gap = gap.min(-1).values if key else gap.diagonal(dim1=-2, dim2=-1)
    return gap / expected.norm(dim=-1).clamp(min=1e-30)


def _where(top: float, b: int, p: int, h: int, *, layer: int, hook: str, offset: int, allow: float, how: str,
           source: str, dtype: torch.dtype) -> str:
    return (f"layer {layer} {hook} head {h} position {offset + p} (row {b}): relative error {fmt(top * allow)} against "
            f"the declared rotation of {how} ({source}), allowed {fmt(allow)} in {dtype}")


@model_property(name="rotary_frequencies", order=95, tolerance=TOLERANCE, twin_replay=True,
                rule="the error over its allowance 16 u_dtype + 32 (p + n) u_32 of the expected |rot_q| "
                     "(u: unit roundoff)",
                applies=Applies(positional=("rotary",), min_ctx=2, when=_undetermined,
                                when_doc="the design oracle gives a rotation for the config's layers"),
                needs=_hooks, needs_doc="blocks.{layer}.attn.hook_rot_q, hook_rot_k, and hook_q, hook_k (else "
                                        "blocks.{layer}.hook_resid_pre) of every layer the oracle gives a rotation")
def rotary_frequencies(case: Case) -> Plan:
    """Each rotary layer's ``hook_rot_q``/``hook_rot_k`` are the oracle's rotation of ``hook_q``/``hook_k``."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    layers = rotary_layers(cfg)
    hooks = {layer: names[4 * i: 4 * i + 4] for i, layer in enumerate(layers)}
    relative = [layer for layer in layers if hooks[layer][2].endswith("hook_resid_pre")]
    specs = [declared.rotation(cfg, layer, cfg.n_ctx).value for layer in layers]
    dynamic = any(spec.rope_type == "dynamic" for spec in specs)
    # past the usable context only where the rotation is declared for it (dynamic NTK: factor times the original)
    reach = max([cfg.n_ctx] + [spec.reach for spec in specs if spec.reach is not None])
    n_max = max_len(cfg, cap=4)
    strategy = _far_offsets(cfg.d_vocab, reach, min(n_max, cfg.n_ctx - 1))
    wanted = list(dict.fromkeys(names))
    inputs = [hooks[layer][2] for layer in relative]

    def run(x: torch.Tensor, offset: int, patch: Optional[dict] = None) -> dict:
        if dynamic:  # a short call returns a cached dynamic-NTK table to the original context
            capture_activations(model, x[:1, :1], capture=wanted[:1])
        return capture_activations(model, x, position_offset=offset, capture=wanted, patch=patch)

    def measure(example):
        x, offset = example
        n = x.shape[1]
        base = run(x, 0) if relative else {}
        # the offset-p pass, on the offset-0 pass's inputs to the layers compared relatively
        acts = run(x, offset, {name: base[name] for name in inputs} if relative else None)
        positions = offset + torch.arange(n)
        dtype = acts[names[0]].dtype
        allow = 16 * unit_roundoff(dtype) + 32 * (offset + n) * U32
        worst, where = 0.0, "rotations as declared"
        for layer in layers:
            rot_q, rot_k, raw_q, raw_k = hooks[layer]
            fact = declared.rotation(cfg, layer, offset + n)
            spec = fact.value
            spec0 = declared.rotation(cfg, layer, n).value if layer in relative else spec  # the offset-0 pass's
            for key, (rot, raw) in enumerate(((rot_q, raw_q), (rot_k, raw_k))):
                after = acts[rot].double()
                if layer in relative:
                    back = turn(base[rot].double(), -torch.arange(n), spec0, 1.0 / spec0.attention_factor,
                                normalise=False)
                    expected = turn(back, positions, spec, normalise=False)
                    how = f"the turned-back offset-0 {rot.split('.')[-1]}"
                else:
                    expected = turn(acts[raw].double(), positions, spec)
                    how = raw.split(".")[-1]
                err = _gap(after, expected, bool(key)) / allow
                worst, where = worse(err, (worst, where), functools.partial(
                    _where, layer=declared.layer_id(cfg, layer), hook=rot.split(".")[-1], offset=offset, allow=allow,
                    how=how, source=fact.source, dtype=dtype))
        return worst, where

    def info() -> str:
        specs = {declared.rotation(cfg, layer, cfg.n_ctx).source for layer in layers}
        checked = ("; layers " + ", ".join(str(declared.layer_id(cfg, layer)) for layer in relative)
                   + " compared relatively (hook_q silent): their attention factor cancels") if relative else ""
        return "expected from " + " | ".join(sorted(specs)) + checked

    return Plan(strategy, measure, offset_text, info)
