"""Padding changes nothing for real tokens, seen in the outputs.

With random left or right padding of random length and random pad ids (``attention_mask`` 0 on
pads), the logits at real positions equal each row run alone unpadded (scaled logit difference,
``_common.LOGIT_RTOL``). By the protocol a token's position counts only the real tokens before
it, so left padding moves no position. Each batch also runs mirrored (every row padded on its other
side, :meth:`PaddedBatch.mirrored`), so every example has a left-padded row. ``padding_pattern``
(padding_mask.py) checks the mask.
"""

from __future__ import annotations

from typing import Any

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, max_len, scaled_deviation
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import PaddedBatch, padded_batches


def padded_inputs(cfg: Any):
    """The padded batches both padding properties draw: up to 10 positions, about 3/5 of them real."""
    n = max_len(cfg, cap=10)
    return padded_batches(cfg.d_vocab, max_batch=2, max_len=max(1, n * 3 // 5), max_pad=max(1, n - n * 3 // 5))


@model_property(name="padding_outputs", order=50, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE,
                applies=Applies(min_ctx=2, reason="n_ctx < 2"))
def padding_outputs(case: Case) -> Plan:
    """Logits at real positions of a padded batch equal each row's unpadded logits."""
    model = case.model

    def measure(batch):
        alone = [forward_capture(model, batch.tokens.new_tensor([row]))[0][0] for row in batch.rows]
        worst, where = -1.0, ""
        for drawn in (batch, batch.mirrored()):  # every row left- and right-padded (PaddedBatch.mirrored)
            # the floor over the real positions, the ones compared (precision.forward_capture)
            padded, _ = forward_capture(model, drawn.tokens, attention_mask=drawn.mask, compared=drawn.mask)
            for r in range(len(drawn.rows)):
                dev, idx = scaled_deviation(padded[r, drawn.real_positions(r)], alone[r])
                if dev > worst:  # on a tie the drawn batch, whose tokens the counterexample prints
                    worst = dev
                    how = "" if drawn is batch else f", mirrored: {drawn.describe()}"
                    where = (f"row {r} ({drawn.sides[r]}-padded{how}): logits differ by {fmt(dev)} "
                             f"at (real pos, vocab)={idx}")
        return worst, where

    return Plan(padded_inputs(case.cfg), measure, PaddedBatch.describe)
