"""Batch independence: each sequence's logits do not depend on the other sequences in the batch.

Catches normalization or pooling over the batch axis. Deviation: scaled logit difference
between the batched run and each row run alone (``_common.LOGIT_RTOL``).
"""

from __future__ import annotations

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, max_len, scaled_deviation
from properties.precision import forward_capture
from properties.registry import Case, Plan, model_property
from properties.strategies import token_batches


@model_property(name="batch_independence", order=70, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE)
def batch_independence(case: Case) -> Plan:
    """``f(x)[i] == f(x[i:i+1])[0]`` for every row i of a batch of 2-3 sequences."""
    model, cfg = case.model, case.cfg

    def measure(x):
        batched, _ = forward_capture(model, x)
        worst, where = 0.0, "rows independent"
        for r in range(x.shape[0]):
            alone, _ = forward_capture(model, x[r:r + 1])
            dev, idx = scaled_deviation(batched[r], alone[0])
            if dev >= worst:
                worst, where = dev, f"row {r}: logits differ by {fmt(dev)} at (pos, vocab)={idx}"
        return worst, where

    strategy = token_batches(cfg.d_vocab, min_batch=2, max_batch=3, max_len=max_len(cfg))
    return Plan(strategy, measure)
