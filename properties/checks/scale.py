"""Scaled dot-product scores, as the model declares them: ``hook_attn_scores = cap(s * q.k) + mask + bias``.

Vaswani et al. 2017 §3.2.1 (eq. 1) scale the dot products by 1/sqrt(d_k); a model may declare
another factor ``s`` per layer (``cfg.attn_scales``/``attn_scale``, see ``design``), e.g. Gemma 2's
``query_pre_attn_scalar**-0.5``, and a soft-cap ``cap(x) = c * tanh(x / c)`` (``cfg.attn_softcap``).
q and k are read from ``hook_q``/``hook_k`` (``hook_rot_q``/``hook_rot_k`` after RoPE, Su et al. 2021).
Allowed entries (causal: key <= query; inside a declared sliding window) must equal that plus
the ALiBi bias (Press et al. 2022) for ALiBi models, zero otherwise. ALiBi ``"relative"`` is
``-m_h |i - j|`` and compared exactly; ``"absolute_key"`` (Bloom's ``m_h * j``) differs from it by a
per-query constant that softmax cannot see, so there residuals are compared after subtracting
their mean over each query's allowed keys. A declared learned relative bias (``cfg.relative_attention_bias``,
T5's ``b_h(i - j)``) is unknown to the check: residuals are compared after subtracting their mean over
each head's allowed entries of one offset i - j, across the batch. A declared per-key bias
(``cfg.key_score_bias``, Doge's dynamic mask ``b_h(j)`` computed from the values) is unknown too:
residuals are compared after subtracting their mean over each key's allowed queries, per row and
head (a key seen by one query is then not compared). The deviation is over
``max(1, max|s * q.k|, max|bias|)``. Tolerance 1e-4: the two float32 dot products differ by
summation order, ~d_head * 2^-24 relative. Masked entries must be <= -1e4 (their softmax weight
then underflows to 0); a masked entry above that counts as its excess over -1e4.

The expected scale is the design oracle's (``harness.oracle.scale``: from the config and the papers, e.g.
Gemma 2's ``query_pre_attn_scalar**-0.5``), never the module's own attribute, which a wrong port keeps too
(llama.cpp #8444). Where the oracle cannot say (no config, a scale field it does not know) the row takes the
factor the model declares and says so. A model that scales q before its kernel (OPT's ``query_prescale``, so
hook_q is already scaled and the scores apply 1.0) has that factor compared with the oracle's, relative.

The row's reason reports the scale measured by least squares against 1/sqrt(d_head), as information.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.adapters.protocol import all_heads
from properties import declared, design
from properties.checks._common import fmt, tokens_and_offset, where_max
from properties.precision import forward_capture
from properties.registry import Case, Plan, model_property
from properties.search import offset_text

TOLERANCE = 1e-4
MASK_CEILING = -1e4
MAX_OFFSET = 64


def _row_centered(x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``x [batch, heads, q, k]`` minus its mean over each query's allowed keys (0 where not allowed)."""
    count = allowed.sum(-1, keepdim=True).clamp(min=1)
    x = x.where(allowed, x.new_zeros(()))
    return (x - x.sum(-1, keepdim=True) / count).where(allowed, x.new_zeros(()))


def _column_centered(x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``x [batch, heads, q, k]`` minus its mean over each key's allowed queries (0 where not allowed)."""
    return _row_centered(x.transpose(-1, -2), allowed.transpose(-1, -2)).transpose(-1, -2)


def _diagonal_centered(x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``x [batch, heads, n, n]`` minus its mean over each head's allowed entries of one offset i - j (all rows)."""
    n = x.shape[-1]
    diag = torch.nn.functional.one_hot(torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1, 2 * n - 1)
    diag = diag.to(x.dtype)  # [q, k, offset]
    x = x.where(allowed, x.new_zeros(()))
    count = torch.einsum("bhqk,qkd->hd", allowed.expand_as(x).to(x.dtype), diag).clamp(min=1)
    mean = torch.einsum("hd,qkd->hqk", torch.einsum("bhqk,qkd->hd", x, diag) / count, diag)
    return (x - mean).where(allowed, x.new_zeros(()))


def _alibi(cfg, n: int, offset: int) -> tuple[torch.Tensor, bool]:
    """The expected ALiBi bias ``[heads, q, k]`` and whether it is taken modulo a per-query constant."""
    slopes, style = design.alibi_design(cfg)
    idx = torch.arange(n, dtype=torch.float64)
    if style == "absolute_key":
        return slopes[:, None, None] * (offset + idx)[None, None, :].expand(-1, n, -1), True
    return -slopes[:, None, None] * (idx[:, None] - idx[None, :]).abs(), False


def _hooks(cfg: Any) -> tuple[str, ...]:
    """q and k as the scores see them (after RoPE for rotary models) and the scores, layer by layer."""
    qn, kn = ("hook_rot_q", "hook_rot_k") if cfg.positional_embedding_type == "rotary" else ("hook_q", "hook_k")
    return tuple(f"blocks.{layer}.attn.{h}" for layer in range(cfg.n_layers) for h in (qn, kn, "hook_attn_scores"))


@model_property(name="attention_scale", order=80, calibrated=True, local_floor=True, tolerance=TOLERANCE,
                rule="relative to max(1, max|s * q.k|, max|bias|): the two float32 dot products differ by "
                     "summation order, ~d_head * 2^-24; masked scores must be <= -1e4",
                needs=_hooks, needs_doc="blocks.{layer}.attn.hook_q, hook_k (hook_rot_q, hook_rot_k if rotary), "
                                        "hook_attn_scores")
def attention_scale(case: Case) -> Plan:
    """``hook_attn_scores`` is the declared cap(scale * q.k) plus the mask plus the declared ALiBi bias."""
    model, cfg = case.model, case.cfg
    pos_type = cfg.positional_embedding_type
    names = {layer: list(case.hooks[3 * layer: 3 * layer + 3]) for layer in range(cfg.n_layers)}
    oracle = [declared.scale(cfg, layer) for layer in range(cfg.n_layers)]
    prescale = getattr(cfg, "query_prescale", None)
    # the oracle's factor is on hook_q . hook_k, unless the model applies it to q before hook_q (then it is compared
    # with that prescale, and the scores' own factor is the declared 1.0)
    scales = [fact.value if fact.known and prescale is None else design.attn_scale(cfg, layer)
              for layer, fact in enumerate(oracle)]
    sources = [fact.source if fact.known and prescale is None else "declared by the model" for fact in oracle]
    cap = design.softcap(cfg)
    relative = getattr(cfg, "relative_attention_bias", False) is True
    per_key = getattr(cfg, "key_score_bias", False) is True
    if pos_type == "alibi":
        design.alibi_design(cfg)  # a bad declaration is an error before any work
    fit = {layer: [0.0, 0.0] for layer in names}  # least-squares sums: sum(score * qk), sum(qk^2)
    strategy = tokens_and_offset(cfg, 0, MAX_OFFSET, max_batch=2)  # positions stay < n_ctx

    def measure(example):
        x, offset = example
        _, acts = forward_capture(model, x, position_offset=offset, capture=[n for v in names.values() for n in v])
        n = x.shape[1]
        worst, where = 0.0, "scores match"
        if prescale is not None and oracle[0].known:
            worst = abs(float(prescale) / oracle[0].value - 1.0)
            where = (f"q is scaled by {fmt(float(prescale))} before the kernel, expected {fmt(oracle[0].value)} "
                     f"({oracle[0].source})")
        for layer, (q_name, k_name, s_name) in names.items():
            allowed = design.allowed_keys(cfg, layer, n)
            q = all_heads(acts[q_name].double(), cfg.n_heads)
            k = all_heads(acts[k_name].double(), cfg.n_heads)
            scores = acts[s_name].double()  # [batch, n_heads, q, k]
            qk = torch.einsum("bqhd,bkhd->bhqk", q, k)
            expected = qk * scales[layer]
            if cap is not None:
                expected = cap * torch.tanh(expected / cap)
            bias, modulo_query = (_alibi(cfg, n, offset) if pos_type == "alibi"
                                  else (torch.zeros(cfg.n_heads, n, n, dtype=torch.float64), False))
            resid = (scores - expected - bias).where(allowed, scores.new_zeros(()))
            target = scores - bias
            if modulo_query:
                resid, target, qk = (_row_centered(t, allowed) for t in (resid, target, qk))
            if relative:  # the declared bias b_h(i - j) is unknown here: compare modulo it
                resid, target, qk = (_diagonal_centered(t, allowed) for t in (resid, target, qk))
            if per_key:  # the declared bias b_h(j), one per row, head and key, is unknown: compare modulo it
                resid, target, qk = (_column_centered(t, allowed.expand_as(t)) for t in (resid, target, qk))
            if cap is None:
                sel = allowed.expand_as(qk) & torch.isfinite(target)
                fit[layer][0] += float((target[sel] * qk[sel]).sum())
                fit[layer][1] += float(qk[sel].square().sum())
            # the bias as softmax sees it: centered per query where a per-query constant is invisible
            seen = _row_centered(bias.expand_as(scores), allowed) if modulo_query else bias.expand_as(scores)
            scale = max(1.0, float(expected[..., allowed].abs().max()), float(seen[..., allowed].abs().max()))
            err = (resid.abs() / scale).where(allowed, resid.new_zeros(())).nan_to_num(nan=math.inf)
            if float(err.max()) > worst:
                worst = float(err.max())
                b, h, i, j = where_max(err)
                where = (f"layer {layer} head {h} (q {i}, k {j}, row {b}): score {fmt(float(scores[b, h, i, j]))}, "
                         f"expected {fmt(float(expected[b, h, i, j] + bias[h, i, j]))} "
                         f"(q.k * {fmt(scales[layer])} from {sources[layer]}"
                         + (f", soft-cap {fmt(cap)}" if cap is not None else "")
                         + (f", ALiBi bias {fmt(float(bias[h, i, j]))}" if pos_type == "alibi" else "") + ")"
                         + (" modulo a per-query constant" if modulo_query else "")
                         + (" modulo a learned bias per head and offset i - j" if relative else "")
                         + (" modulo a bias per key" if per_key else ""))
            masked = scores.where(~allowed, scores.new_full((), -math.inf)).nan_to_num(nan=math.inf)
            excess = float(masked.max()) - MASK_CEILING
            if excess > worst:
                worst = excess
                b, h, i, j = where_max(masked)
                where = (f"layer {layer} head {h}: masked score (q {i}, k {j}, row {b}) is "
                         f"{fmt(float(scores[b, h, i, j]))}, expected <= {MASK_CEILING:g}")
        return worst, where

    def info() -> str:
        textbook = 1.0 / math.sqrt(cfg.d_head)
        measured = [num / den if den > 0 else math.nan for num, den in fit.values()]
        parts = [f"1/sqrt(d_head)={fmt(textbook)}", "expected scale " + _per_layer_text(scales)
                 + " (" + "; ".join(dict.fromkeys(sources)) + ")"]
        missing = next((fact.unknown for fact in oracle if not fact.known), "")
        if missing:
            parts.append(f"the oracle has no scale: {missing}")
        if cap is None:
            parts.append("measured " + _per_layer_text(measured) + " = "
                         + _per_layer_text([m / textbook for m in measured]) + " x 1/sqrt(d_head)")
        else:
            parts.append(f"soft-cap {fmt(cap)} (no linear fit)")
        if pos_type == "alibi":
            parts.append(f"ALiBi {design.alibi_design(cfg)[1]}")
        return "; ".join(parts)

    return Plan(strategy, measure, offset_text, info)


def _per_layer_text(values: list[float]) -> str:
    if len({fmt(v) for v in values}) == 1:
        return fmt(values[0])
    return "[" + ", ".join(fmt(v) for v in values) + "]"
