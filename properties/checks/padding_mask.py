"""Padding changes nothing for real tokens, seen in the pattern: no real query attends to a pad.

Tolerance 0: a padded key's weight underflows to exactly 0 (see ``_common``), so any positive
weight is a leak. The batches are ``padding_logits.padded_inputs``, each also run mirrored.
"""

from __future__ import annotations

from properties.checks._common import fmt, where_max
from properties.checks.padding_logits import padded_inputs
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import PaddedBatch


@model_property(name="padding_pattern", order=60, tolerance=0.0,
                rule="exact: a masked weight underflows to exactly 0 in float32",
                applies=Applies(min_ctx=2, reason="n_ctx < 2"), needs=("blocks.{layer}.attn.hook_pattern",))
def padding_pattern(case: Case) -> Plan:
    """No real query's ``hook_pattern`` row puts weight on a padded key, in any layer or head."""
    model, names = case.model, list(case.hooks)

    def measure(batch):
        worst, where = 0.0, "no weight on padded keys"
        for drawn in (batch, batch.mirrored()):  # every row left- and right-padded (PaddedBatch.mirrored)
            acts = capture_activations(model, drawn.tokens, attention_mask=drawn.mask, capture=names)
            real = drawn.mask.bool()
            for layer, name in enumerate(names):
                p = acts[name].double().abs().nan_to_num(nan=float("inf"))  # [batch, n_heads, q, k]
                leak = p.where(real[:, None, :, None] & ~real[:, None, None, :], p.new_zeros(()))
                if float(leak.max()) > worst:
                    worst = float(leak.max())
                    b, h, q, k = where_max(leak)
                    where = (f"layer {layer} head {h}: real query {q} puts weight {fmt(worst)} on padded key {k} "
                             f"(row {b}{'' if drawn is batch else ', mirrored: ' + drawn.describe()})")
        return worst, where

    return Plan(padded_inputs(case.cfg), measure, PaddedBatch.describe)
