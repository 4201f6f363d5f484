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
