"""Cross-attention sees every real encoder position and no padded one, seen in its pattern.

Every decoder query's ``blocks.{l}.cross_attn.hook_pattern`` row puts weight exactly 0 on each padded
source position and weight > 0 on each real one unless its score underflows (``_seq2seq.key_coverage``,
with ``hook_attn_scores``). Cross-attention has no causal mask (Vaswani et al. 2017 §3.2.3): a decoder
position may read the whole source, so a causal mask applied here by mistake hides real keys too.
"""

from __future__ import annotations

import torch

from properties.checks._seq2seq import WHEN_DOC, SourceExample, seq2seq_only, source_examples, worst_coverage
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property


@model_property(name="cross_attention_pattern", order=190, tolerance=0.0,
                rule="exact: a masked weight underflows to exactly 0 in float32; a real key's weight is > 0",
                applies=Applies(when=seq2seq_only, when_doc=WHEN_DOC),
                needs=("blocks.{layer}.cross_attn.hook_attn_scores", "blocks.{layer}.cross_attn.hook_pattern"))
def cross_attention_pattern(case: Case) -> Plan:
    """Every decoder query's cross-attention weighs each real source position (> 0) and no padded one (= 0)."""
    model, names = case.model, list(case.hooks)

    def measure(ex: SourceExample):
        acts = capture_activations(model, ex.tokens, inputs=ex.inputs(), capture=names)
        keys = ex.source.mask.bool()
        queries = torch.ones_like(ex.tokens, dtype=torch.bool)
        worst, where = worst_coverage(acts, names, queries, keys, "decoder layer {layer} cross-attention")
        return worst, where or "every decoder query sees every real source position and no pad"

    return Plan(source_examples(case.cfg), measure, SourceExample.describe)
