"""Sinusoidal positions: the Gram matrix of ``hook_pos_embed`` is the same at every position offset.

Vaswani et al. 2017 §3.5 chose sinusoids because PE(pos + k) is a fixed rotation R(k) of
PE(pos); rotations keep inner products, so ``<PE(i + c), PE(j + c)>`` does not depend on c. This
needs no knowledge of the sin/cos layout. Offsets up to 64 (positions < n_ctx). Tolerance 1e-4
of ``max(1, max|Gram|)``: float32 angles up to position 72 are off by < 5e-6 rad, so a Gram
entry (a sum of d_model products <= 1) by < 2e-5 relative.
"""

from __future__ import annotations

from properties.checks._common import fmt, scaled_deviation, tokens_and_offset
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property
from properties.search import offset_text

GRAM_RTOL = 1e-4


@model_property(name="sinusoidal_shift", order=110, calibrated=True, tolerance=GRAM_RTOL,
                rule="relative to max(1, max|Gram|): float32 angles up to position 72 move a Gram entry by < 2e-5",
                applies=Applies(positional=("sinusoidal",), min_ctx=3), needs=("hook_pos_embed",))
def sinusoidal_shift(case: Case) -> Plan:
    """The Gram matrix of ``hook_pos_embed`` does not change with ``position_offset`` (sinusoidal models)."""
    model, (name,) = case.model, case.hooks

    def measure(example):
        x, offset = example
        _, at_zero = forward_capture(model, x, capture=[name])
        _, shifted = forward_capture(model, x, position_offset=offset, capture=[name])
        p0, pc = at_zero[name][0].double(), shifted[name][0].double()  # [pos, d_model]
        dev, idx = scaled_deviation(pc @ pc.T, p0 @ p0.T)
        return dev, f"<PE(i), PE(j)> changes by {fmt(dev)} at (i, j)={idx}"

    return Plan(tokens_and_offset(case.cfg, 1, 64, max_batch=1, min_len=2), measure, offset_text)
