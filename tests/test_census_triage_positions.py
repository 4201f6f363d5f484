"""Census triage: designs where what a model computes depends on absolute position, and the bugs where it should not.

- Beam scales the queries of its layers without RoPE by s(p) = (1 + (p + 1) / 2048) ** 0.1 (scalable softmax):
  a declared design (``DesignFacts.absolute_positions``, read from its modeling module), so relative_position is
  n/a on it, and the same model with the declaration removed fails the row (the check still sees the dependence).
- Mixture-of-experts models get their float64 twin: transformers' default ``grouped_mm`` experts refuse float64,
  so ``placed(dtype="float64")`` runs them through the eager loop (the same sum over the routed experts).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import properties
from harness.adapters import adapt, placed
from reports.census.shrink import build

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def beam():
    return adapt(build("beam", "BeamForCausalLM").eval())


def test_beam_declares_its_query_scale_by_absolute_position(beam):
    assert beam.cfg.absolute_positions.startswith("modeling_beam.compute_attention_scaling")
    assert adapt(build("llama", "LlamaForCausalLM")).cfg.absolute_positions is None  # textbook: none


def test_relative_position_is_na_where_declared_and_fails_where_not(beam):
    row = properties.check_model(beam, properties=["relative_position"], max_examples=10).iloc[0]
    assert row.status == "n/a" and "absolute position" in row.reason
    undeclared = placed(beam, dtype="float64")  # a copy: the float64 twin of the undeclared model is itself
    undeclared._cfg = dataclasses.replace(undeclared.cfg, absolute_positions=None)
    row = properties.check_model(undeclared, properties=["relative_position"], max_examples=10).iloc[0]
    assert row.status == "fail", row.reason


def test_a_mixture_of_experts_model_gets_its_float64_twin(beam):
    assert beam.hf_model.config._experts_implementation == "grouped_mm"  # transformers' default, float32 only
    twin = placed(beam, dtype="float64")
    assert twin.hf_model.config._experts_implementation == "eager"
    assert beam.hf_model.config._experts_implementation == "grouped_mm"  # the caller's model is untouched
    tokens = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(twin(tokens).float(), beam(tokens), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def flint():
    return adapt(build("flint", "FlintForCausalLM").eval())


def _rotary_row(model):
    return properties.check_model(model, properties=["rotary_precision"], max_examples=10).iloc[0]


def test_flint_rotates_its_sliding_layers_only(flint):
    """Flint's full-attention layers use no positions: the adapter sees which layers' rotary function runs,
    and the rotary checks read the first that does (its input, after NoPE layers only, has no positions)."""
    layers = flint.cfg.rotary_layers
    types = flint.hf_model.config.layer_types[:flint.cfg.n_layers]
    assert layers == tuple(t == "sliding_attention" for t in types) and not layers[0], (layers, types)
    row = _rotary_row(flint)
    assert row.status == "pass", row.reason
    every = _declared(flint, rotary_layers=None)  # read layer 0, which does not rotate: the old false alarm
    assert _rotary_row(every).status == "fail"
    wrong = _declared(flint, rotary_base=flint.cfg.rotary_base * 2)  # a wrong rotation on the rotating layer
    row = _rotary_row(wrong)
    assert row.status == "fail" and f"layer {layers.index(True)}" in row.counterexample, row.counterexample


def _declared(model, **facts):
    copy = placed(model, dtype="float64")  # a copy whose cfg can be changed; float64: its own twin
    copy._cfg = dataclasses.replace(copy.cfg, **facts)
    return copy


def test_a_model_that_rotates_every_layer_declares_nothing():
    assert adapt(build("llama", "LlamaForCausalLM")).cfg.rotary_layers is None


@pytest.fixture(scope="module")
def recurrent_gemma():
    return adapt(build("recurrent_gemma", "RecurrentGemmaForCausalLM").eval())


def test_recurrent_gemma_declares_its_reset_at_position_zero(recurrent_gemma):
    """Its RG-LRU resets at position 0 (a document boundary): relative_position is n/a; the rotary checks feed the
    offset run the offset-0 run's input to the attention layer, so rotary_precision checks the rotation alone."""
    assert "resets at position 0" in recurrent_gemma.cfg.absolute_positions
    frame = properties.check_model(recurrent_gemma, properties=["relative_position", "rotary_precision"],
                                   max_examples=10)
    assert dict(zip(frame.property, frame.status, strict=True)) == {"relative_position": "n/a",
                                                                    "rotary_precision": "pass"}, frame.reason.tolist()


def test_cached_decoding_continues_the_cache_a_model_made_for_itself(recurrent_gemma):
    """RecurrentGemma returns no cache (CausalLMOutput): the adapter continues from the DynamicCache the model
    made on the first call; before, each step set up fresh recurrent states. One token at a time (the model's own
    decoding path) equals the full forward; a 1-token prompt included."""
    tokens = torch.tensor([[2, 1, 5, 7, 9, 3]])
    with torch.no_grad():
        full = recurrent_gemma(tokens)
        for prompt in (1, 2):
            logits, past = recurrent_gemma.forward_with_cache(tokens[:, :prompt])
            steps = [logits]
            for i in range(prompt, tokens.shape[1]):
                logits, past = recurrent_gemma.forward_with_cache(tokens[:, i:i + 1], past=past)
                steps.append(logits)
            torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_the_bridge_keeps_a_hybrid_models_design():
    """design_of reads a hybrid stack's attention layers as HFAdapter does (it raised on RecurrentGemma, so the
    bridge fell back to textbook facts and failed relative_position): the model-wide facts carry over to the
    bridge's every-layer cfg, the per-layer ones cannot be matched up and are left undeclared."""
    from harness.adapters import BridgeAdapter
    from harness.adapters.hf_design import design_of

    assert design_of(build("recurrent_gemma", "RecurrentGemmaForCausalLM")).n_layers == 1  # its attention layer
    bridged = BridgeAdapter.from_hf(build("recurrent_gemma", "RecurrentGemmaForCausalLM").eval())
    assert bridged.cfg.n_layers == 3 and "resets at position 0" in bridged.cfg.absolute_positions
    assert bridged.cfg.attn_scales is None and bridged.cfg.sliding_window is None
