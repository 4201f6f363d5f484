"""Census triage: attention sinks and rotary layouts follow the model's declared design.

Attention sinks (GPT-OSS and kin): the adapter's explicit pattern keeps the per-head sink logit in
the softmax's denominator, as transformers' gpt_oss eager_attention_forward does, and
pattern_distribution checks what then holds (rows sum to 1 minus one head's sink mass). A kernel
that drops the sink still fails kernel_consistency.

Rotary layouts: Multi-head Latent Attention turns the last qk_rope_head_dim features of a head
(``cfg.rotary_offset``), nanochat turns by -p (``cfg.rotary_direction``); rotary_norm and
rotary_precision follow the declaration and fail on a wrong one.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from transformers.models.llama import modeling_llama

from harness.adapters import HFAdapter
from harness.adapters.hf_attention import explicit_pattern
from properties import check_model
from properties.checks.pattern import sink_error
from properties.checks.rotary_phase import rotate
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


@pytest.fixture(scope="module")
def deepseek_v3():
    torch.manual_seed(0)
    return build("deepseek_v3", "DeepseekV3ForCausalLM")


def test_mla_declares_its_last_features_rotary_and_passes_rotary_checks(deepseek_v3):
    cfg = HFAdapter(deepseek_v3).cfg
    text = deepseek_v3.config
    # the design read off the module: [q_nope, q_rope], the last qk_rope_head_dim turn (rope_interleave writes "half")
    assert (cfg.rotary_dim, cfg.rotary_offset, cfg.rotary_style) == (text.qk_rope_head_dim, text.qk_nope_head_dim,
                                                                     "half")
    frame = check_model(HFAdapter(deepseek_v3), properties=["rotary_norm", "rotary_precision"], max_examples=10)
    assert frame["status"].tolist() == ["pass", "pass"], frame[["property", "status", "reason"]]


def test_rotate_turns_only_the_declared_span_and_direction():
    x = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    turned = rotate(x, 7, 8, "half", 10000.0, 8)
    torch.testing.assert_close(turned[..., :8], x[..., :8], rtol=0, atol=0)  # the pass-through features
    torch.testing.assert_close(turned[..., 8:], rotate(x[..., 8:], 7, 8, "half", 10000.0), rtol=0, atol=0)
    # a rotation by -p undoes one by +p (nanochat's direction), to float64 rounding
    back = rotate(rotate(x, 7, 16, "half", 10000.0), 7, 16, "half", 10000.0, 0, -1)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-12)


def test_a_rotation_on_the_first_features_fails_when_mla_declares_the_last(deepseek_v3, monkeypatch):
    adapter = HFAdapter(deepseek_v3)
    # the mutant: a declaration that the first features turn (the check's old assumption) on the real MLA model
    monkeypatch.setattr(adapter, "_cfg", dataclasses.replace(adapter.cfg, rotary_offset=0))
    frame = check_model(adapter, properties=["rotary_norm"], max_examples=10)
    assert _row(frame, "rotary_norm")["status"] == "fail"


def test_nanochat_declares_a_negative_direction_and_a_positive_one_fails(monkeypatch):
    torch.manual_seed(0)
    adapter = HFAdapter(build("nanochat", "NanoChatForCausalLM"))
    assert adapter.cfg.rotary_direction == -1  # modeling_nanochat.rotate_half is cat((x2, -x1))
    assert _row(check_model(adapter, properties=["rotary_precision"], max_examples=10),
                "rotary_precision")["status"] == "pass"
    monkeypatch.setattr(adapter, "_cfg", dataclasses.replace(adapter.cfg, rotary_direction=None))
    assert _row(check_model(adapter, properties=["rotary_precision"], max_examples=10),
                "rotary_precision")["status"] == "fail"
