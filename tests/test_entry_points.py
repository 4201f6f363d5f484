"""check_model and every public probe take a PreTrainedModel or a TransformerBridge directly.

The entry adapts it (harness.adapters.adapt) and the result names the adapter in ``attrs["adapter"]``;
the numbers are the ones the explicitly wrapped model gives.
"""

from __future__ import annotations

import pytest
import torch

import probes
import properties
from harness import ModelConfig, Transformer
from harness.adapters import HFAdapter
from harness.adapters.entry import adapt, describe
from tests.helpers.hf_models import VOCAB, gpt2, llama

QUICK = ["causal_outputs", "causal_pattern"]


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (3, 10), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("build", "arch"), [(gpt2, "gpt2"), (llama, "llama")])
def test_probes_take_a_pretrained_model_and_say_so(build, arch, tokens):
    hf = build()
    expected = f"HFAdapter({arch}, attention_interface)"
    results = {
        "head_importance": probes.head_importance(hf, tokens),
        "prune_curve": probes.prune_curve(hf, tokens, seeds=(0,)),
        "redundancy": probes.redundancy(hf, tokens, seeds=(0,)),
        "head_similarity": probes.head_similarity(hf, tokens),
        "head_roles": probes.head_roles(hf, tokens),
        "attention_entropy": probes.attention_entropy(hf, tokens),
    }
    for name, out in results.items():
        assert out.attrs["adapter"] == expected, name
    # the same numbers as the explicitly wrapped model (wrap reuses the one adapter of a model)
    again = probes.head_importance(HFAdapter.of(hf), tokens)
    torch.testing.assert_close(torch.tensor(again["importance"].to_numpy()),
                               torch.tensor(results["head_importance"]["importance"].to_numpy()))
    patched = probes.patch_residual(hf, tokens[:1], tokens[1:2], lambda logits: logits[0, -1, 0])
    assert patched.shape == (2, tokens.shape[1])
    assert torch.isfinite(patched).all()


@pytest.mark.parametrize(("build", "arch"), [(gpt2, "gpt2"), (llama, "llama")])
def test_check_model_takes_a_pretrained_model_and_says_so(build, arch):
    table = properties.check_model(build(), max_examples=3, properties=QUICK)
    assert table.attrs["adapter"] == f"HFAdapter({arch}, attention_interface)"
    assert list(table["status"]) == ["pass", "pass"]


def test_protocol_model_is_used_as_it_is(tokens):
    model = Transformer(ModelConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=VOCAB, n_ctx=16)).eval()
    assert adapt(model) is model
    assert probes.attention_entropy(model, tokens).attrs["adapter"] == "protocol model"
    assert properties.check_model(model, max_examples=3, properties=QUICK).attrs["adapter"] == "protocol model"


def test_bridge_goes_behind_bridge_adapter(tokens):
    builder = pytest.importorskip("transformer_lens.model_bridge.sources._bridge_builder")
    hf = gpt2()
    bridge = builder.build_bridge_from_module(hf, "GPT2LMHeadModel", hf_config=hf.config)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    assert describe(adapt(bridge)) == "BridgeAdapter"
    assert probes.head_roles(bridge, tokens).attrs["adapter"] == "BridgeAdapter"
    assert properties.check_model(bridge, max_examples=3, properties=QUICK).attrs["adapter"] == "BridgeAdapter"


def test_anything_else_keeps_the_protocol_error(tokens):
    with pytest.raises(TypeError, match="hooked torch.nn.Module"):
        probes.head_importance(torch.nn.Linear(2, 2), tokens)
    with pytest.raises(TypeError):
        properties.check_model(object())
