"""Relative positions: what a model with rotary, ALiBi or no positions computes depends only on offsets.

``forward(tokens, position_offset=c)`` equals ``c = 0``. RoPE scores depend on m - n only (Su et
al. 2021 eq. 16), ALiBi biases on |i - j| (Press et al. 2022), and without positions nothing
depends on position at all. Offsets reach ``MAX_OFFSET = 256`` or as far as positions stay
< n_ctx (the protocol's context): float32 rotary angles at position p carry an absolute error
~p * 2^-24 < 2e-5 rad there, far below ``_common.LOGIT_RTOL``.
"""

from __future__ import annotations

from typing import Any, Optional

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, scaled_deviation, tokens_and_offset
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property
from properties.search import offset_text

MAX_OFFSET = 256


def _absolute_by_design(model: Any) -> Optional[str]:
    """n/a where the model declares a dependence on absolute position (``DesignFacts.absolute_positions``)."""
    how = getattr(model.cfg, "absolute_positions", None)
    return None if how is None else (f"the model depends on absolute position by design ({how}): "
                                     "logits are not a function of relative positions alone")


@model_property(name="relative_position", order=90, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE,
                applies=Applies(positional=("rotary", "alibi", "none"), min_ctx=2, when=_absolute_by_design,
                                when_doc="no dependence on absolute position declared"))
def relative_position(case: Case) -> Plan:
    """``forward(tokens, position_offset=c) == forward(tokens)`` for rotary, ALiBi and position-free models."""
    model = case.model

    def measure(example):
        x, offset = example
        shifted, _ = forward_capture(model, x, position_offset=offset)
        reference, _ = forward_capture(model, x)
        dev, idx = scaled_deviation(shifted, reference)
        return dev, f"logits differ by {fmt(dev)} at (row, pos, vocab)={idx}"

    return Plan(tokens_and_offset(case.cfg, 1, MAX_OFFSET), measure, offset_text)
