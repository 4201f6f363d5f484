"""The attention pattern is a probability distribution over keys (softmax, Vaswani et al. 2017 eq. 1).

For every real query (padded queries are exempt), each layer's and head's row of
``hook_pattern`` is non-negative and sums to 1 over the key axis. Deviation:
``max(|row sum - 1|, max(-weight))``. Tolerance 1e-5: a float32 softmax row of n <= 16
weights, each with relative error ~2^-24, sums to 1 within n * 2^-24 ~ 1e-6.
"""

from __future__ import annotations

from hypothesis import strategies as st

from properties.checks._common import fmt, max_len, where_max
from properties.precision import forward_capture
from properties.registry import Case, Plan, model_property
from properties.search import masked_text
from properties.strategies import padded_batches, token_batches

TOLERANCE = 1e-5


@model_property(name="pattern_distribution", order=40, calibrated=True, local_floor=True, tolerance=TOLERANCE,
                rule="a float32 softmax row of n <= 16 weights sums to 1 within n * 2^-24 ~ 1e-6",
                needs=("blocks.{layer}.attn.hook_pattern",))
def pattern_distribution(case: Case) -> Plan:
    """Every real query's ``hook_pattern`` row is non-negative and sums to 1, with or without padding."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    n = max_len(cfg)
    unpadded = token_batches(cfg.d_vocab, max_batch=2, max_len=n).map(lambda x: (x, None))
    strategies = [unpadded]
    if n >= 2:
        padded = padded_batches(cfg.d_vocab, max_len=max(1, n // 2), max_pad=max(1, n - n // 2))
        strategies.append(padded.map(lambda p: (p.tokens, p.mask)))
    strategy = st.one_of(*strategies)

    def measure(example):
        x, mask = example
        _, acts = forward_capture(model, x, attention_mask=mask, capture=names)
        real = mask.bool() if mask is not None else x.new_ones(x.shape, dtype=bool)
        worst, where = 0.0, "every row is a distribution"
        for layer, name in enumerate(names):
            p = acts[name].double()  # [batch, n_heads, q, k]
            row_err = (p.sum(-1) - 1).abs()  # [batch, n_heads, q]
            neg = (-p).clamp(min=0).amax(-1)
            err = row_err.maximum(neg).nan_to_num(nan=float("inf"))
            err = err.where(real[:, None, :], err.new_zeros(()))  # padded queries are exempt
            if float(err.max()) > worst:
                worst = float(err.max())
                b, h, q = where_max(err)
                where = (f"layer {layer} head {h} query {q} (row {b}): row sums to {fmt(float(p[b, h, q].sum()))}, "
                         f"min weight {fmt(float(p[b, h, q].min()))}")
        return worst, where

    return Plan(strategy, measure, masked_text)
