"""The design oracle (harness/oracle): what a config declares, computed from the config and the papers alone.

The oracle never calls transformers' helpers; here its numbers are held against them, as two independent
implementations of one documented design: transformers' ``ROPE_INIT_FUNCTIONS`` (float32 tables: relative
tolerance 1e-6, a few float32 roundings of base**x) and the attention modules' own ``scaling``. A disagreement
is a bug in one of the two, found before it reaches a check. Then the facts the tables do not cover (windows,
NoPE layers, the usable context of a fairseq-numbered table) and the contradictory configs that must be an
answer, never a crash.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from harness import oracle
from harness.adapters import adapt
from properties import check_model

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)

ROPES = {
    "linear": dict(rope_type="linear", factor=4.0),
    "dynamic_below": dict(rope_type="dynamic", factor=4.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512),
    "yarn_mscale": dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=256, mscale=0.707,
                        mscale_all_dim=0.707, beta_fast=16, beta_slow=2),
    "yarn_untruncated": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512, truncate=False),
    "longrope_short": dict(rope_type="longrope", short_factor=[1.0, 1.5, 2.0, 2.5],
                           long_factor=[3.0, 4.0, 5.0, 6.0], original_max_position_embeddings=512),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=256),
}


def _config(rope: dict, theta: float = 10000.0, **kw):
    return AutoConfig.for_model("llama", **{**SMALL, "max_position_embeddings": 2048, **kw},
                                rope_parameters={"rope_theta": theta, **rope})


@pytest.mark.parametrize("name", sorted(ROPES))
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_frequencies_and_attention_factor_agree_with_transformers(name, theta):
    config = _config(ROPES[name], theta)
    seq = 16
    spec = oracle.rotary(config, 0, seq).value
    inv, factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu", seq_len=seq)
    torch.testing.assert_close(torch.tensor(spec.inv_freq, dtype=torch.float64), inv.double(), rtol=1e-6, atol=0)
    assert spec.attention_factor == pytest.approx(factor, rel=1e-12)


def test_longrope_beyond_the_original_context_takes_the_long_factors():
    config = _config(ROPES["longrope_short"])
    for seq in (512, 513, 2048):
        inv, factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq)
        spec = oracle.rotary(config, 0, seq).value
        torch.testing.assert_close(torch.tensor(spec.inv_freq, dtype=torch.float64), inv.double(), rtol=1e-6, atol=0)
        # s = 2048 / 512 = 4: sqrt(1 + ln 4 / ln 512) (Phi-3's LongRoPE attention factor)
        assert spec.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(512)))


def test_dynamic_ntk_rescales_the_base_past_the_original_context_only():
    config = _config(ROPES["dynamic_below"], max_position_embeddings=512)
    d = 8
    for seq, want in ((100, 10000.0), (512, 10000.0), (1024, 10000.0 * (4 * 1024 / 512 - 3) ** (d / (d - 2)))):
        spec = oracle.rotary(config, 0, seq).value
        assert spec.inv_freq[1] == pytest.approx(want ** (-2 / d), rel=1e-12)
        inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=seq)
        torch.testing.assert_close(torch.tensor(spec.inv_freq, dtype=torch.float64), inv.double(), rtol=1e-6, atol=0)
    assert oracle.rotary(config, 0, 16).value.reach == 4 * 512


@pytest.mark.parametrize(("model_type", "kw", "expected"), [
    ("llama", {}, 8 ** -0.5),
    ("gemma2", dict(head_dim=16, query_pre_attn_scalar=24), 24 ** -0.5),
    ("gemma3_text", dict(head_dim=16, query_pre_attn_scalar=24), 24 ** -0.5),
    ("granite", dict(attention_multiplier=0.03), 0.03),
    ("gpt_neo", dict(attention_types=[[["global", "local"], 1]], num_layers=2, max_position_embeddings=64,
                     window_size=4), 1.0),
])
def test_the_scale_is_the_modules_on_a_correct_model(model_type, kw, expected):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **kw})
    model = AutoModelForCausalLM.from_config(config)
    assert oracle.scale(config, 1).value == pytest.approx(expected, rel=1e-12)
    attn = [m for m in model.modules() if hasattr(m, "scaling") or type(m).__name__.endswith("SelfAttention")][0]
    assert getattr(attn, "scaling", 1.0) == pytest.approx(expected, rel=1e-12)


def test_gpt2_scales_by_the_inverse_layer_index_when_its_config_says_so():
    config = AutoConfig.for_model("gpt2", n_embd=32, n_head=4, scale_attn_by_inverse_layer_idx=True)
    scales = [oracle.scale(config, layer).value for layer in range(3)]
    assert scales == pytest.approx([8 ** -0.5 / k for k in (1, 2, 3)])
    assert oracle.scale(AutoConfig.for_model("gpt2", scale_attn_weights=False), 0).value == 1.0
    # "additionally": the inverse layer index applies without scale_attn_weights too
    both = AutoConfig.for_model("gpt2", scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True)
    assert oracle.scale(both, 1).value == 0.5


def test_multi_head_latent_attention_takes_yarns_mscale_squared():
    # DeepSeek-V2/V3's release: softmax_scale = (nope + rope)^-0.5 * mscale(s, mscale_all_dim)^2
    config = AutoConfig.for_model("deepseek_v3", qk_nope_head_dim=16, qk_rope_head_dim=8, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096, mscale=1.0,
        mscale_all_dim=1.0))
    m = 0.1 * math.log(40.0) + 1.0
    assert oracle.scale(config, 0).value == pytest.approx(24 ** -0.5 * m * m)
    spec = oracle.rotary(config, 0, 16).value  # the decoupled RoPE part: the last 8 features, written half-paired
    assert (spec.offset, spec.dim, spec.style) == (16, 8, "half")
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    torch.testing.assert_close(torch.tensor(spec.inv_freq, dtype=torch.float64), inv.double(), rtol=1e-6, atol=0)
    assert spec.attention_factor == pytest.approx(factor)


def test_an_unknown_scale_field_leaves_the_scale_undetermined():
    config = SimpleNamespace(model_type="mystery", hidden_size=32, num_attention_heads=4, softmax_scale=0.5)
    fact = oracle.scale(config, 0)
    assert not fact.known and "softmax_scale=0.5" in fact.unknown


def test_windows_follow_layer_types_and_mistrals_every_layer_rule():
    gemma = AutoConfig.for_model("gemma2", **SMALL, sliding_window=3)
    assert [oracle.window(gemma, layer).value for layer in range(2)] == [3, None]
    mistral = AutoConfig.for_model("mistral", **SMALL, sliding_window=5)
    assert [oracle.window(mistral, layer).value for layer in range(2)] == [5, 5]
    qwen = AutoConfig.for_model("qwen2", **SMALL, sliding_window=5, use_sliding_window=False)
    assert oracle.window(qwen, 1).value is None


def test_a_layer_type_that_is_no_attention_has_no_window_the_oracle_states():
    config = SimpleNamespace(model_type="hybrid", layer_types=["linear_attention", "full_attention"], sliding_window=4)
    assert not oracle.window(config, 0).known and "linear_attention" in oracle.window(config, 0).unknown
    assert oracle.window(config, 1).value is None


def test_nope_layers_take_no_rotation():
    smol = AutoConfig.for_model("smollm3", **SMALL, no_rope_layers=[1, 0])
    assert oracle.rotary(smol, 0, 8).known and "no_rope_layers[1]=0" in oracle.rotary(smol, 1, 8).unknown
    cohere = AutoConfig.for_model("cohere2", **SMALL, sliding_window=4, layer_types=["sliding_attention",
                                                                                     "full_attention"])
    assert oracle.rotary(cohere, 0, 8).value.style == "interleaved"
    assert "NoPE" in oracle.rotary(cohere, 1, 8).unknown


def test_a_rope_type_missing_a_parameter_is_an_answer_naming_it_not_a_crash():
    config = SimpleNamespace(model_type="llama", hidden_size=32, num_attention_heads=4, max_position_embeddings=64,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    fact = oracle.rotary(config, 0, 8)
    assert not fact.known and "original_max_position_embeddings" in fact.unknown
    odd = SimpleNamespace(model_type="llama", hidden_size=32, num_attention_heads=4,
                          rope_parameters={"rope_type": "su-et-al", "rope_theta": 10000.0})
    assert "'su-et-al'" in oracle.rotary(odd, 0, 8).unknown


def test_a_fairseq_table_serves_two_positions_fewer_and_roberta_is_clean():
    # RoBERTa numbers positions from padding_idx + 1: a table of n + 2 rows serves n positions
    config = AutoConfig.for_model("roberta", vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=66, pad_token_id=1)
    assert oracle.usable_context(config).value == 64
    torch.manual_seed(0)
    model = adapt(AutoModelForMaskedLM.from_config(config).eval())
    assert model.cfg.n_ctx == 64
    frame = check_model(model, seed=0, max_examples=10, properties=["attention_scale", "padding_outputs"])
    assert (frame.status == "pass").all(), frame[["property", "status", "counterexample"]].to_dict("records")
