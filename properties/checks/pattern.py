"""The attention pattern is a probability distribution over keys (softmax, Vaswani et al. 2017 eq. 1).

For every real query (padded queries are exempt), each layer's and head's row of
``hook_pattern`` is non-negative and sums to 1 over the key axis. Deviation:
``max(|row sum - 1|, max(-weight))``. Tolerance 1e-5: a float32 softmax row of n <= 16
weights, each with relative error ~2^-24, sums to 1 within n * 2^-24 ~ 1e-6.

A layer that declares attention sinks (``cfg.attention_sinks``; transformers' gpt_oss
eager_attention_forward: the softmax over ``[s_1 .. s_n, sigma_h]`` with the sink column dropped)
has rows summing to ``1 - m`` with the sink's mass ``m = exp(sigma_h) / (exp(sigma_h) + sum_j
exp(s_j)) = sigmoid(sigma_h - lse(s))``. What holds there: weights >= 0, each row sums to <= 1,
and, where ``hook_attn_scores`` fires, the missing mass is one head's sink seen through that
row's scores: with ``sigma_h = logit(m*) + lse(s*)`` read off the head's row of largest mass
(best conditioned), every other row's ``1 - sum`` equals ``sigmoid(sigma_h - lse(s))``. The
error is absolute in probability, bounded by the rounding of ``m*`` (the smaller rows' predicted
mass scales it by ``exp(lse* - lse) <= 1``), so the same tolerance holds.
"""

from __future__ import annotations

import torch

from properties.checks._common import fmt, kept, masked_inputs, max_len, real_positions, worse
from properties.design import attention_sinks
from properties.precision import forward_capture
from properties.registry import Case, Plan, model_property
from properties.search import masked_text

TOLERANCE = 1e-5


@model_property(name="pattern_distribution", order=40, calibrated=True, local_floor=True, tolerance=TOLERANCE,
                rule="a float32 softmax row of n <= 16 weights sums to 1 within n * 2^-24 ~ 1e-6",
                needs=("blocks.{layer}.attn.hook_pattern",))
def pattern_distribution(case: Case) -> Plan:
    """Every real query's ``hook_pattern`` row is non-negative and sums to 1, with or without padding."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    sinks = attention_sinks(cfg)
    scores = {layer: f"blocks.{layer}.attn.hook_attn_scores" for layer, sink in enumerate(sinks) if sink}
    scores = {layer: nm for layer, nm in scores.items() if nm in case.observed}
    n = max_len(cfg)
    strategy = masked_inputs(cfg.d_vocab, n)

    def measure(example):
        x, mask = example
        _, acts = forward_capture(model, x, attention_mask=mask, capture=names + list(scores.values()))
        real = real_positions(x, mask)
        worst, where = 0.0, "every row is a distribution"
        for layer, name in enumerate(names):
            p = acts[name].double()  # [batch, n_heads, q, k]
            row_err = (p.sum(-1) - 1).abs() if not sinks[layer] else sink_error(p, acts.get(scores.get(layer)), real)
            neg = (-p).clamp(min=0).amax(-1)
            err = kept(row_err.maximum(neg), real[:, None, :])  # padded queries are exempt
            worst, where = worse(err, (worst, where), lambda top, b, h, q, layer=layer, p=p: (
                f"layer {layer} head {h} query {q} (row {b}): row sums to {fmt(float(p[b, h, q].sum()))}, "
                f"min weight {fmt(float(p[b, h, q].min()))}"))
        return worst, where

    return Plan(strategy, measure, masked_text)


def sink_error(p: torch.Tensor, scores: torch.Tensor | None, real: torch.Tensor) -> torch.Tensor:
    """``[batch, n_heads, q]``: how far a sink layer's rows are from ``1 - sigmoid(sigma_h - lse(s))`` (module doc).

    Without scores only ``sum <= 1`` is checked. ``real [batch, q]``: the head's sink is read off real queries only.
    """
    mass = 1 - p.sum(-1)  # [batch, n_heads, q]: the sink's share of the row
    over = (-mass).clamp(min=0)  # a row may not sum above 1
    if scores is None:
        return over
    lse = torch.logsumexp(scores.double(), dim=-1)
    inside = mass.clamp(0, 1).where(real[:, None, :], mass.new_full((), -1.0))
    flat = inside.transpose(0, 1).flatten(1)  # [n_heads, batch * q]
    best = flat.argmax(-1)
    m_star = flat.gather(1, best[:, None])[:, 0].clamp(0, 1)
    lse_star = lse.transpose(0, 1).flatten(1).gather(1, best[:, None])[:, 0]
    sigma = torch.logit(m_star) + lse_star  # [n_heads]; +-inf where the sink holds all or none of the mass
    predicted = torch.sigmoid(sigma[None, :, None] - lse)
    return over.maximum((mass - predicted).abs())
