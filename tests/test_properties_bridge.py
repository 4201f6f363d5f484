"""Hugging Face GPT-2 and Llama through TransformerLens's TransformerBridge and properties.BridgeAdapter.

The models are built from configs in memory (no network) with a large init range, so attention is
far from uniform and a broken position or mask rule moves the logits visibly. Reference for the
adapter: the Hugging Face model itself, called with the position_ids the protocol prescribes.
Tolerance 1e-5: the bridge runs the same float32 modules as HF; only the attention path
(explicit pattern in compatibility mode vs HF's SDPA) differs in summation order, ~1e-7.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from properties import BridgeAdapter, check_model, check_protocol  # noqa: E402
from tests.helpers.hf_models import VOCAB, gpt2, llama  # noqa: E402

FAST = 8  # examples per search here; nox -s properties runs the ci profile's 25


pytestmark = pytest.mark.usefixtures("one_thread")


BUILDERS = {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("name", BUILDERS)
def test_adapter_follows_protocol_and_matches_hf(name):
    reference = BUILDERS[name]()  # an unwrapped twin: the bridge rewires the model it wraps
    adapter = BridgeAdapter.from_hf(BUILDERS[name]())
    check_protocol(adapter)
    assert adapter.cfg.positional_embedding_type == ("standard" if name == "gpt2" else "rotary")
    assert adapter.cfg.attention_dir == "causal" and adapter.cfg.d_vocab == VOCAB
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    offset = 3
    position_ids = offset + (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = reference(tokens, attention_mask=mask, position_ids=position_ids).logits
        got = adapter(tokens, attention_mask=mask, position_offset=offset)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", BUILDERS)
def test_hf_models_pass_every_applicable_property(name):
    frame = check_model(BridgeAdapter.from_hf(BUILDERS[name]()), max_examples=FAST).set_index("property")
    failed = frame[frame.passed == False]  # noqa: E712
    assert failed.empty, failed.to_dict("index")
    applicable = set(frame.index[frame.applicable])
    common = {"causal_outputs", "causal_pattern", "pattern_distribution", "padding_outputs", "padding_pattern",
              "batch_independence", "attention_scale", "kernel_consistency", "finite_outputs"}
    rotary = {"relative_position", "rotary_norm", "rotary_precision"}
    assert applicable == (common if name == "gpt2" else common | rotary)
    assert set(frame.status[frame.applicable]) == {"pass"}  # every hook the checks need fires in the bridge
    assert not frame.loc["kv_cache", "applicable"]  # the adapter exposes no cache interface


class IndexPositions(BridgeAdapter):
    """A wrong adapter: Hugging Face's default, positions = index, so left padding moves them."""

    def forward(self, tokens, attention_mask=None, position_offset=0):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        ids = position_offset + torch.arange(tokens.shape[1]).expand(tokens.shape)
        return self.bridge(tokens, attention_mask=mask, position_ids=ids)


def test_padding_check_catches_index_positions_through_the_bridge():
    adapter = BridgeAdapter.from_hf(gpt2())
    wrong = IndexPositions(adapter.bridge)
    frame = check_model(wrong, max_examples=FAST, properties=["padding_outputs", "padding_pattern"])
    rows = frame.set_index("property")
    assert rows.loc["padding_outputs", "passed"] is False
    assert "left-padded" in rows.loc["padding_outputs", "counterexample"]
    assert rows.loc["padding_pattern", "passed"] is True  # the mask itself is right
