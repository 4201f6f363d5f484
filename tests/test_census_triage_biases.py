"""Census triage: Doge's dynamic mask attention adds a per-key bias b_h(j) = exp(A_h softplus(dt_proj(v_j))) to
its scores (``DesignFacts.key_score_bias``, read from the module's ``prepare_dynamic_mask``). attention_scale
compares modulo a bias per key: it passes on Doge, fails with the declaration removed (the bias is then a
deviation), and still fails a wrong scale (a per-key constant cannot absorb s * q.k's variation over queries): the
model's attention scaling 1.5 times the config's, which the design oracle's expected scale comes from."""

from __future__ import annotations

import dataclasses

import pytest

import properties
from harness.adapters import adapt, placed
from reports.census.shrink import build

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def doge():
    return adapt(build("doge", "DogeForCausalLM").eval())


def _scale_row(model):
    return properties.check_model(model, properties=["attention_scale"], max_examples=10).iloc[0]


def _declared(model, **facts):
    copy = placed(model, dtype="float64")  # a copy whose cfg can be changed; float64: its own twin
    copy._cfg = dataclasses.replace(copy.cfg, **facts)
    return copy


def test_doge_declares_a_per_key_bias_and_passes(doge):
    assert doge.cfg.key_score_bias is True
    assert adapt(build("llama", "LlamaForCausalLM")).cfg.key_score_bias is False
    row = _scale_row(doge)
    assert row.status == "pass", row.reason


def test_without_the_declaration_the_bias_fails(doge):
    row = _scale_row(_declared(doge, key_score_bias=False))
    assert row.status == "fail" and "modulo a bias per key" not in row.counterexample


def test_a_wrong_scale_still_fails_modulo_the_per_key_bias():
    hf = build("doge", "DogeForCausalLM").eval()
    for layer in hf.model.layers:
        layer.self_attn.scaling *= 1.5  # the kernel takes the module's scaling; the config still declares 1/sqrt(d)
    row = _scale_row(adapt(hf))
    assert row.status == "fail" and "modulo a bias per key" in row.counterexample, row.counterexample
