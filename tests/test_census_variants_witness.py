"""The variants census's findings reproduce on the raw HF model (tests/helpers/census_variant_witness.py), and the
length-dependent rotary scalings are declared designs, read by the adapter (harness/adapters/hf_positions.py)."""

from __future__ import annotations

import pytest

from harness.adapters import adapt
from reports.census import findings
from reports.census.findings import VARIANT_FINDINGS, for_config
from reports.census.variants import build_config
from tests.helpers import census_variant_witness as witness
from tests.helpers.census_variant_witness import WITNESSES, _model, longrope

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("finding", VARIANT_FINDINGS, ids=lambda f: f"{f.model_type}-{f.prop}")
def test_variant_finding_reproduces_without_the_suite(finding):
    assert WITNESSES[finding.witness](finding.model_type)  # raises AssertionError once the behaviour is gone


def test_a_variant_finding_holds_only_under_its_config():
    long = build_config("llama", "LlamaForCausalLM", {"rope_parameters": longrope("llama")})
    assert "kv_cache" in for_config("llama", long)
    assert "kv_cache" not in for_config("llama", build_config("llama", "LlamaForCausalLM", {}))


def test_longrope_inside_the_context_is_a_declared_dependence_on_position():
    """relative_position reads DesignFacts.absolute_positions: LongRoPE switching at position 4 of a 128-token
    context declares it; Phi-3's shipped switch at 4096 lies past the context, and default rope declares nothing."""
    declared = adapt(_model("llama", {"rope_parameters": longrope("llama")}).float()).cfg.absolute_positions
    assert declared is not None and "longrope" in declared and "=4 " in declared
    phi3 = {"rope_parameters": {**longrope("phi3"), "original_max_position_embeddings": 4096}}
    assert adapt(_model("phi3", phi3).float()).cfg.absolute_positions is None
    assert adapt(_model("llama", {}).float()).cfg.absolute_positions is None


def test_a_stack_whose_layers_never_rotate_is_position_free():
    """Cohere 2 rotates its sliding-window layers only (its full layers take no positions): a config of full layers
    alone is declared position-free, and the rotary rows are n/a instead of comparing unrotated q with a rotation."""
    full = adapt(_model("cohere2", {"layer_types": ["full_attention"] * 4}).float()).cfg
    assert full.positional_embedding_type == "none" and full.rotary_dim is None
    mixed = adapt(_model("cohere2", {}).float()).cfg
    assert mixed.positional_embedding_type == "rotary" and mixed.rotary_layers == (True, True, True, False)



def test_every_rounded_inv_freq_finding_has_its_witness_config():
    assert set(findings.ROUNDED_FREQUENCIES) == set(witness.ROUNDED_INV_FREQ) >= set(findings.ROUNDED_INV_FREQ)
