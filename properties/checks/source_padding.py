"""The decoder's output does not depend on the encoder's padding.

With the source padded on a random side by random pad ids of random length (``source_mask`` 0 on them),
the decoder's logits equal those of each row decoded against its unpadded source alone (scaled logit
difference; the allowance is measured against a float64 twin, properties/precision.py). A pad that
leaks through the encoder or cross-attention, or left padding that moves the source's positions, moves
the logits.
"""

from __future__ import annotations

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, scaled_deviation
from properties.checks._seq2seq import WHEN_DOC, SourceExample, seq2seq_only, source_examples
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property


@model_property(name="source_padding_outputs", order=200, calibrated=True, tolerance=LOGIT_RTOL, rule=LOGIT_RULE,
                applies=Applies(when=seq2seq_only, when_doc=WHEN_DOC))
def source_padding_outputs(case: Case) -> Plan:
    """Decoder logits with a padded source equal each row's logits with its unpadded source."""
    model = case.model

    def measure(ex: SourceExample):
        padded, _ = forward_capture(model, ex.tokens, inputs=ex.inputs())
        worst, where = 0.0, "decoder logits unchanged by source padding"
        for r in range(len(ex.source.rows)):
            alone, _ = forward_capture(model, ex.tokens[r:r + 1], inputs=ex.inputs(r))
            dev, idx = scaled_deviation(padded[r], alone[0])
            if dev >= worst:
                worst = dev
                where = (f"row {r} (source {ex.source.sides[r]}-padded): decoder logits differ by {fmt(dev)} "
                         f"at (pos, vocab)={idx}")
        return worst, where

    return Plan(source_examples(case.cfg), measure, SourceExample.describe)
