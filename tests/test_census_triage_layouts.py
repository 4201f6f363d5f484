"""Census triage: a module-hooks model whose attention module returns weights in another layout than the pattern's.

Longformer's self-attention returns its banded local attention, [batch, pos, n_heads, 2w + 1] (Beltagy et al.
2020 §3.1), not [batch, n_heads, query, key]: read as a pattern, its rows "summed to 0" (census: longformer
pattern_distribution). The adapter now fires ``hook_pattern`` only on a [batch, n_heads, q, q] square, so on
Longformer the hook is silent and the rows that need it say unobservable, naming it; GPT-2's still fires.
"""

from __future__ import annotations

import pytest
import torch

import properties
from harness.adapters import adapt, observed_hooks
from reports.census.shrink import build

pytestmark = pytest.mark.usefixtures("one_thread")


def test_longformer_banded_weights_are_not_read_as_a_pattern():
    model = adapt(build("longformer", "LongformerForMaskedLM").eval())
    assert model.route == "module_hooks"
    assert "blocks.0.attn.hook_pattern" not in observed_hooks(model)
    row = properties.check_model(model, properties=["pattern_distribution"], max_examples=5).iloc[0]
    assert row.status == "unobservable" and "blocks.0.attn.hook_pattern" in row.reason


def test_a_square_pattern_still_fires_on_the_module_hooks_route():
    model = adapt(build("xglm", "XGLMForCausalLM").eval())
    assert model.route == "module_hooks"
    _, cache = model.run_with_cache(torch.tensor([[3, 4, 5]]), names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert pattern.shape == (1, model.cfg.n_heads, 3, 3)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(1, model.cfg.n_heads, 3))


def test_a_float64_twin_blind_on_a_plain_input_is_no_twin():
    """ProphetNet's float64 copy gives NaN logits where the float32 model is finite: it has no floor to give (every
    gap would read 0, the allowance float64's minimum, and float32 rounding a failure), so a float32 model falls
    back to the declared tolerance, as when the copy cannot be built."""
    from properties import precision

    model = adapt(build("prophetnet", "ProphetNetForCausalLM").eval())
    assert precision.golden_twin(model) is None
    row = properties.check_model(model, properties=["batch_independence"], max_examples=5).iloc[0]
    assert row.status == "pass" and row.allowance == row.tolerance, (row.allowance, row.tolerance)


def test_minus_infinity_is_a_mask_in_additive_mask_and_bias_hooks():
    from properties.precision import nonfinite_mask

    t = torch.tensor([0.0, -float("inf"), float("inf"), float("nan")])
    assert nonfinite_mask("blocks.3.attn.compressor.hook_block_bias", t).tolist() == [False, False, True, True]
    assert nonfinite_mask("blocks.0.attn.hook_attn_scores", t).tolist() == [False, False, True, True]
    assert nonfinite_mask("blocks.0.hook_resid_post", t).tolist() == [False, True, True, True]


def test_a_bridged_mixture_of_experts_model_gets_its_float64_twin():
    """placed() runs a float64 BridgeAdapter copy's experts eagerly too (grouped_mm takes no float64): without it the
    bridge's MoE rows fell to float64's minimum allowance (the bridge census's 18 causal_outputs false alarms)."""
    from harness.adapters import BridgeAdapter, placed

    bridged = BridgeAdapter.from_hf(build("mixtral", "MixtralForCausalLM").eval())
    twin = placed(bridged, dtype="float64")
    tokens = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(twin(tokens).float(), bridged(tokens), atol=1e-4, rtol=1e-4)
