"""Census triage: designs where what a model computes depends on absolute position, and the bugs where it should not.

- Beam scales the queries of its layers without RoPE by s(p) = (1 + (p + 1) / 2048) ** 0.1 (scalable softmax):
  a declared design (``DesignFacts.absolute_query_scale``, read from its modeling module), so relative_position is
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
    assert beam.cfg.absolute_query_scale.startswith("modeling_beam.compute_attention_scaling")
    assert adapt(build("llama", "LlamaForCausalLM")).cfg.absolute_query_scale is None  # textbook: none


def test_relative_position_is_na_where_declared_and_fails_where_not(beam):
    row = properties.check_model(beam, properties=["relative_position"], max_examples=10).iloc[0]
    assert row.status == "n/a" and "absolute position" in row.reason
    undeclared = placed(beam, dtype="float64")  # a copy: the float64 twin of the undeclared model is itself
    undeclared._cfg = dataclasses.replace(undeclared.cfg, absolute_query_scale=None)
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
