"""The encoder of an encoder-decoder is bidirectional and respects its padding, seen in its pattern.

Every real source token attends to every real source token, before and after it (weight > 0 unless the
score underflows), and to no padded one (weight exactly 0): ``_seq2seq.key_coverage`` on each encoder
layer's ``hook_pattern``, with ``hook_attn_scores`` to tell underflow from a mask. An encoder made causal
by mistake hides the later real keys (score ``-inf``); one that ignores the mask weighs the pads.
"""

from __future__ import annotations

from harness.model.protocol_facts import encoder_hook
from properties.checks._seq2seq import WHEN_DOC, SourceExample, seq2seq_only, source_examples, worst_coverage
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property


def _needs(cfg) -> tuple[str, ...]:
    return tuple(encoder_hook(layer, f"attn.{h}") for layer in range(cfg.n_encoder_layers)
                 for h in ("hook_attn_scores", "hook_pattern"))


@model_property(name="encoder_bidirectional", order=180, tolerance=0.0,
                rule="exact: a masked weight underflows to exactly 0 in float32; a real key's weight is > 0",
                applies=Applies(when=seq2seq_only, when_doc=WHEN_DOC), needs=_needs,
                needs_doc="encoder.blocks.{layer}.attn.hook_attn_scores, hook_pattern (every encoder layer)")
def encoder_bidirectional(case: Case) -> Plan:
    """Each real source token attends to every real source token (both sides) and to no padded one."""
    model, names = case.model, list(case.hooks)

    def measure(ex: SourceExample):
        acts = capture_activations(model, ex.tokens, inputs=ex.inputs(), capture=names)
        real = ex.source.mask.bool()
        worst, where = worst_coverage(acts, names, real, real, "encoder layer {layer}")
        return worst, where or "every real source token sees every real one and no pad"

    return Plan(source_examples(case.cfg), measure, SourceExample.describe)
