"""Census triage (issue 20): attention sinks and rotary layouts follow the model's declared design.

Attention sinks (GPT-OSS and kin): the adapter's explicit pattern keeps the per-head sink logit in
the softmax's denominator, as transformers' gpt_oss eager_attention_forward does, and
pattern_distribution checks what then holds (rows sum to 1 minus one head's sink mass). A kernel
that drops the sink still fails kernel_consistency.
"""

from __future__ import annotations

import sys

import pytest
import torch
from transformers.models.llama import modeling_llama

from harness.adapters import HFAdapter
from harness.adapters.hf_attention import explicit_pattern
from properties import check_model
from properties.checks.pattern import sink_error
from reports.census.shrink import build

pytestmark = pytest.mark.usefixtures("one_thread")


def _row(frame, name):
    return frame.set_index("property").loc[name]


@pytest.fixture(scope="module")
def gpt_oss():
    torch.manual_seed(0)
    model = build("gpt_oss", "GptOssForCausalLM")
    with torch.no_grad():  # sinks large enough that a dropped one moves the output well past rounding
        for layer in model.model.layers:
            layer.self_attn.sinks.uniform_(-1.0, 1.0)
    return model


def test_gpt_oss_declares_sinks_and_its_pattern_is_the_eager_kernels(gpt_oss):
    adapter = HFAdapter(gpt_oss)
    assert adapter.cfg.attention_sinks == (True,) * adapter.cfg.n_layers
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    _, cache = adapter.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    with torch.no_grad():  # the independent reference: the raw model's own eager weights
        raw = gpt_oss(input_ids=tokens, output_attentions=True).attentions
    for layer, weights in enumerate(raw):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(pattern, weights, rtol=1e-5, atol=1e-6)  # two float32 softmaxes of one row
        assert float(pattern.sum(-1).max()) < 0.99  # the sink holds part of every row


def test_sink_pattern_passes_its_checks_and_a_dropped_sink_fails_kernel_consistency(gpt_oss, monkeypatch):
    adapter = HFAdapter(gpt_oss)
    props = ["kernel_consistency", "pattern_distribution"]
    frame = check_model(adapter, properties=props, max_examples=10)
    assert frame["status"].tolist() == ["pass", "pass"], frame[["property", "status", "reason"]]
    module = sys.modules[type(gpt_oss.model.layers[0].self_attn).__module__]
    # the mutant: a kernel without the sink (Llama's eager attention), the adapter's pattern unchanged
    monkeypatch.setattr(module, "eager_attention_forward", modeling_llama.eager_attention_forward)
    broken = check_model(HFAdapter(gpt_oss), properties=["kernel_consistency"], max_examples=10)
    assert _row(broken, "kernel_consistency")["status"] == "fail"


def _sink_rows(scores: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return explicit_pattern(scores, sigma).double()


def test_sink_error_follows_the_formula_and_catches_inconsistent_sinks():
    torch.manual_seed(1)
    scores = torch.randn(2, 3, 5, 5) * 2
    sigma = torch.tensor([-1.0, 0.5, 2.0])
    real = torch.ones(2, 5, dtype=torch.bool)
    p = _sink_rows(scores, sigma)
    mass = 1 - p.sum(-1)
    # the sink's weight is exp(sigma) / (exp(sigma) + sum_j exp(s_j)) = sigmoid(sigma - lse(s))
    expected = torch.sigmoid(sigma[None, :, None] - torch.logsumexp(scores.double(), -1))
    torch.testing.assert_close(mass, expected, rtol=0, atol=1e-6)  # a float32 row of 6 weights: ~6 * 2^-24
    assert float(sink_error(p, scores, real).max()) < 1e-6
    # one query's row normalised without its sink: no single per-head sink explains it
    bad = p.clone()
    bad[0, 1, 2] = torch.softmax(scores[0, 1, 2].double(), -1)
    assert float(sink_error(bad, scores, real).max()) > 0.01
    # a row summing above 1 fails even without scores to compare
    assert float(sink_error(p * 2.5, None, real).max()) > 0.1
