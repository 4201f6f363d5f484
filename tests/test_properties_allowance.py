"""A measured allowance never collapses: the twin's own rounding bounds it from below (properties/precision.py).

Correct models configured as people ship them (special token ids inside the vocabulary, short windows, hybrid
layer stacks, the config classes' own defaults) are clean in the plain call a user makes,
``check_model(model, seed=0)``, at float32, bfloat16 and float16; the bound is measured from the twin's
tensors (a float64 tensor of float32 values was computed in float32), and a bug past it still fails.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from hypothesis import find

from harness.adapters import adapt
from properties import check_model
from properties.checks import pattern_distribution, sliding_window
from properties.design import unit_roundoff
from properties.precision import (
    FACTOR,
    calibrating,
    computed_unit,
    forward_capture,
    gap,
    masked_fill,
    noise_for,
    scaled_gap,
)
from properties.strategies import LONGEST_DRAWN, long_token_batches
from tests.mutants.base import RefAttention, RefConfig, RefModel

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128, vocab_size=128)
U32, U64 = unit_roundoff(torch.float32), unit_roundoff(torch.float64)


def _glm(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A small GLM at ``dtype`` as ``from_pretrained(..., dtype=)`` makes one: its rotary ``inv_freq`` stays float32
    (``model.to(torch.bfloat16)`` would round it, a real bug rotary_precision reports: transformers #25681)."""
    torch.manual_seed(0)
    config = transformers.GlmConfig(**SMALL, head_dim=16, num_key_value_heads=2, pad_token_id=0, bos_token_id=2,
                                    eos_token_id=1)
    return transformers.GlmForCausalLM._from_config(config, dtype=dtype).eval()


def test_computed_unit_reads_the_precision_a_tensor_was_computed_at():
    exact = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    assert computed_unit(exact) == U64
    assert computed_unit(exact.float().double()) == U32  # float64 storage, float32 values: a float32 softmax
    assert computed_unit(exact.float()) == U32
    assert computed_unit(exact.bfloat16()) == unit_roundoff(torch.bfloat16)
    assert computed_unit(torch.tensor([math.inf, math.nan], dtype=torch.float64)) == U64  # nothing finite to read


def test_uniform_rows_of_a_float32_softmax_are_not_a_false_alarm():
    # tokens [[0, 0, 0]]: identical keys, rows of 1/3 that the twin's float32 softmax computes to the bit, so the
    # floor reads 0; the row sums to 1 - 2^-25, which the unseen-precision bound (4 u32 x 3 keys) covers
    model = adapt(_glm())
    noise = noise_for(model, local=True)
    noise.start()
    with calibrating(noise):
        forward_capture(model, torch.zeros(1, 3, dtype=torch.long), capture=["blocks.0.attn.hook_pattern"])
    assert noise.floor == 0.0
    assert noise.allowance() >= FACTOR * U32 * 3 > 2**-25
    row = pattern_distribution(model, seed=0)
    assert row.status == "pass" and row.allowance > 0 and row.ratio <= 1


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow),
                                   pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_a_glm_with_special_ids_in_the_vocabulary_is_clean(dtype):
    frame = check_model(_glm(dtype), seed=0)
    failed = frame[frame.status == "fail"]
    assert failed.empty, failed[["property", "worst", "allowance", "counterexample"]].to_string()
    numeric = frame[frame.noise_floor.notna()]
    assert (numeric.allowance > 0).all() and numeric.allowance.map(math.isfinite).all()


def _shipped(name: str) -> torch.nn.Module:
    """Small random models configured as the edges people ship: a short window, a hybrid stack with attention on one
    layer, and the config classes' own defaults at a small size."""
    torch.manual_seed(0)
    configs = {
        "cohere2_window_8": lambda: transformers.Cohere2Config(**SMALL, sliding_window=8,
                                                                layer_types=["sliding_attention", "full_attention"]),
        "jamba_attention_on_layer_1": lambda: transformers.JambaConfig(
            **SMALL, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
            num_experts=2, num_key_value_heads=2, mamba_d_state=4, use_mamba_kernels=False),
        "gemma": lambda: transformers.GemmaConfig(**SMALL, head_dim=16, num_key_value_heads=1),
        "phi3": lambda: transformers.Phi3Config(**SMALL, pad_token_id=0),
    }
    config = configs[name]()
    return transformers.AutoModelForCausalLM.from_config(config).eval()


# a documented finding each, with a witness that does not import attnlab (docs/findings/)
FINDINGS = {"jamba_attention_on_layer_1": {"kv_cache"}}  # docs/findings/jamba__cached_chunk_differs.py


# Gemma2 at its config's defaults (a 4096-key window) is in the zoo's fast tier (tests/helpers/zoo.py FAST)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["cohere2_window_8", "jamba_attention_on_layer_1", "gemma", "phi3"])
def test_models_configured_at_the_edges_are_clean_in_the_plain_call(name):
    frame = check_model(adapt(_shipped(name)), seed=0)
    failed = frame[frame.status == "fail"]
    assert set(failed.property) == FINDINGS.get(name, set()), \
        failed[["property", "worst", "allowance", "counterexample"]].to_string()
    assert frame.status.eq("pass").sum() >= 8, frame[["property", "status", "reason"]].to_string()


class _HeavyRowsAttention(RefAttention):
    def normalize(self, scores, allowed):
        return super().normalize(scores, allowed) * (1 + 1e-4)  # rows sum to 1 + 1e-4


class _HeavyRowsModel(RefModel):
    attention_cls = _HeavyRowsAttention


def test_a_bug_past_the_bound_still_fails():
    # rows that sum to 1 + 1e-4: 50x the unseen-precision bound at 8 keys (4 u32 x 8 ~ 2e-6), whatever the floor
    row = pattern_distribution(_HeavyRowsModel(RefConfig()), seed=0, max_examples=5)
    assert row.status == "fail" and row.worst > row.allowance > 0
    assert row.worst == pytest.approx(1e-4, rel=1e-2)


def test_long_token_batches_draw_rows_past_hypothesis_buffer():
    batch = find(long_token_batches(128, 4099), lambda x: True)
    assert batch.shape == (1, 4099) and int(batch.max()) < 128 and int(batch.min()) >= 0
    again = find(long_token_batches(128, 4099), lambda x: True)
    assert torch.equal(batch, again)  # a seed's row is the same every time


def test_a_window_longer_than_hypothesis_can_draw_is_checked():
    # a window past LONGEST_DRAWN needs inputs hypothesis cannot draw token by token (Gemma-2's default window of
    # 4096 made the row raise Unsatisfiable); its rows come from drawn seeds and its passes are priced by their
    # patterns, so the row runs a few examples
    window = LONGEST_DRAWN + 8
    torch.manual_seed(0)
    config = transformers.MistralConfig(**{**SMALL, "num_hidden_layers": 1}, num_key_value_heads=2,
                                        sliding_window=window, max_position_embeddings=2 * window)
    model = adapt(transformers.MistralForCausalLM(config).eval())
    row = sliding_window(model, seed=0)
    assert row.status == "pass", row.counterexample
    assert "budget" in row.reason  # priced by its patterns: not the profile's 25 long passes


def test_a_masked_fill_is_left_out_of_the_gap():
    # a bfloat16 model writes a masked score as its dtype's minimum, its float64 twin as float64's: a fill, not rounding
    own = torch.tensor([[1.0, torch.finfo(torch.bfloat16).min]], dtype=torch.bfloat16)
    golden = torch.tensor([[1.0 + 2 ** -9, torch.finfo(torch.float64).min]], dtype=torch.float64)
    assert scaled_gap(own, golden) == pytest.approx(2 ** -9 / (1 + 2 ** -9))
    assert masked_fill(own).tolist() == [[False, True]] and masked_fill(golden).tolist() == [[False, True]]
    assert scaled_gap(own[:, 1:], golden[:, 1:]) == 0.0  # nothing unmasked: no gap


def test_the_logits_gap_is_in_the_checks_unit():
    # small logits (a random init's) round by their relative precision; the checks divide by max(1, max|logit|)
    golden = torch.tensor([0.1, -0.05], dtype=torch.float64)
    own = golden + 1e-3
    assert gap("logits", own, golden) == pytest.approx(1e-3)
    assert gap("blocks.0.attn.hook_q", own, golden) == pytest.approx(1e-2)
    big = golden * 100
    assert gap("logits", big + 1e-3, big) == pytest.approx(1e-4)  # past 1 the two units agree


def test_the_logits_floor_is_measured_at_the_compared_positions_only():
    model = adapt(_glm(torch.bfloat16))
    tokens = torch.tensor([[14, 39, 32, 65, 9, 57, 127, 32], [31, 74, 116, 23, 35, 126, 75, 114]])
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0]])

    def floor(**kw):
        noise = noise_for(model)
        noise.start()
        with calibrating(noise):
            logits, _ = forward_capture(model, tokens, attention_mask=mask, **kw)
        return noise.floor, logits

    whole, logits = floor()
    real, same = floor(compared=mask)
    pads, _ = floor(compared=1 - mask)
    assert torch.equal(logits, same)  # the model's pass is the same; only the floor's entries differ
    twin = forward_capture(noise_for(model).golden, tokens, attention_mask=mask)[0]
    assert whole == pytest.approx(gap("logits", logits, twin))
    assert real == pytest.approx(gap("logits", logits[mask.bool()], twin[mask.bool()]))
    assert pads == pytest.approx(gap("logits", logits[~mask.bool()], twin[~mask.bool()]))
    # which half rounds worse depends on the CPU's bfloat16 kernels; the whole is the worse of the
    # two (a random init's logits are under 1, so the gap is a plain maximum) and the other is below it
    assert whole == pytest.approx(max(real, pads)) and 0 < min(real, pads) < whole, (real, pads, whole)
