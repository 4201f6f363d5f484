"""Batch independence: each sequence's logits do not depend on the other sequences in the batch.

Catches normalization or pooling over the batch axis. Deviation: scaled logit difference
between the batched run and each row run alone (``_common.LOGIT_RTOL``).

A mixture-of-experts router with an expert capacity counted over the whole batch (Fedus et al. 2021,
Switch Transformers §2.2; NLLB-MoE) drops the tokens an expert receives past its capacity, so a row's
output depends on how many tokens the other rows send to its experts: that is its declared design
(``DesignFacts.expert_capacity``, the most tokens a pass may hold, all rows together, that no router can
drop). Where it is declared, the batches drawn hold at most that many tokens in all (rows x positions;
an encoder-decoder's default source is one token a row, fewer still), so no token is dropped in the batch
or in a row alone and any difference left is a bug. Comparing only where no token was dropped would
need the router's dispatch mask, which no protocol hook shows; a capacity below 2 tokens leaves no batch
of two rows to compare (n/a). Every other batch dependence, a router normalising over the batch
included, still fails.
"""

from __future__ import annotations

from typing import Any, Optional

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, max_len, scaled_deviation
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import token_batches

MIN_ROWS, MAX_ROWS = 2, 3


def _capacity(cfg: Any) -> Optional[int]:
    value = getattr(cfg, "expert_capacity", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _comparable(model: Any) -> Optional[str]:
    """n/a where a declared batch-wide expert capacity cannot hold a batch of two one-token rows."""
    capacity = _capacity(model.cfg)
    if capacity is None or capacity >= MIN_ROWS:
        return None
    return (f"cfg.expert_capacity={capacity}: its router may drop tokens of any batch of {MIN_ROWS} or more "
            "tokens by design (capacity counted over the batch), so no batch can be compared with its rows alone")


@model_property(name="batch_independence", order=70, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE,
                applies=Applies(when=_comparable, when_doc="no declared expert capacity below 2 tokens"))
def batch_independence(case: Case) -> Plan:
    """``f(x)[i] == f(x[i:i+1])[0]`` for every row i of a batch of 2-3 sequences."""
    model, cfg = case.model, case.cfg
    capacity = _capacity(cfg)

    def measure(x):
        batched, _ = forward_capture(model, x)
        worst, where = 0.0, "rows independent"
        for r in range(x.shape[0]):
            alone, _ = forward_capture(model, x[r:r + 1])
            dev, idx = scaled_deviation(batched[r], alone[0])
            if dev >= worst:
                worst, where = dev, f"row {r}: logits differ by {fmt(dev)} at (pos, vocab)={idx}"
        return worst, where

    rows = MAX_ROWS if capacity is None else min(MAX_ROWS, capacity)
    strategy = token_batches(cfg.d_vocab, min_batch=MIN_ROWS, max_batch=rows, max_len=max_len(cfg))
    if capacity is None:
        return Plan(strategy, measure)
    # cut each batch to the declared capacity: rows x positions <= capacity, so no router drops a token
    strategy = strategy.map(lambda x: x[:, :max(1, capacity // x.shape[0])])
    return Plan(strategy, measure, info=lambda: f"batches of at most cfg.expert_capacity={capacity} tokens in all "
                                                "(a router drops tokens past it by design)")
