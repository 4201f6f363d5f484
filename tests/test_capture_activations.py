"""A capture that ends the pass at its last hook point: the same activations, no unembedding, counted passes.

Checks that read only activations (the exact pattern rows, sliding_window, kernel_consistency) capture them with
:func:`harness.adapters.protocol.capture_activations`: on a 262k vocabulary the unembedding is most of a pass.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tr

from harness import ModelConfig, Transformer
from harness.adapters import adapt
from harness.adapters.protocol import HookNotObserved, capture_activations, forward_capture
from harness.errors import AttnlabError
from properties import check_model
from properties import precision as prec
from properties.cost import counting

pytestmark = pytest.mark.usefixtures("one_thread")


def ours() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=3, d_model=32, n_heads=4, d_vocab=50, n_ctx=16)).eval()


def hf_llama():
    torch.manual_seed(0)
    cfg = tr.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return adapt(tr.LlamaForCausalLM(cfg).eval())


def unembed_calls(model) -> list:
    """Calls of the module that makes the logits (attnlab's unembedding, or the HF model's lm_head)."""
    calls: list = []
    head = model.unembed if hasattr(model, "unembed") else model.hf_model.get_output_embeddings()
    head.register_forward_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize("make", [ours, hf_llama], ids=["attnlab", "hf-llama"])
def test_the_activations_equal_a_full_pass_and_no_logits_are_made(make):
    model = make()
    x = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z"]
    calls = unembed_calls(model)
    _, full = forward_capture(model, x, attention_mask=mask, capture=names)
    assert len(calls) == 1
    stopped = capture_activations(model, x, attention_mask=mask, capture=names)
    assert len(calls) == 1  # the stopped pass never reached the unembedding
    assert stopped.keys() == full.keys()
    for name in names:
        torch.testing.assert_close(stopped[name], full[name], rtol=0, atol=0)
    # the model is usable after a stopped pass: no hook or state left behind
    again, _ = forward_capture(model, x, attention_mask=mask)
    assert len(calls) == 2 and torch.isfinite(again).all()


def test_a_patch_before_the_stop_is_applied_and_one_after_it_is_not_reported():
    model = ours()
    x = torch.tensor([[1, 2, 3, 4]])
    _, acts = forward_capture(model, x, capture=["blocks.0.hook_resid_pre", "blocks.2.hook_resid_pre"])
    zero = torch.zeros_like(acts["blocks.0.hook_resid_pre"])
    got = capture_activations(model, x, capture=["blocks.1.attn.hook_pattern"],
                              patch={"blocks.0.hook_resid_pre": zero, "blocks.2.hook_resid_pre": zero})
    _, want = forward_capture(model, x, capture=["blocks.1.attn.hook_pattern"], patch={"blocks.0.hook_resid_pre": zero})
    torch.testing.assert_close(got["blocks.1.attn.hook_pattern"], want["blocks.1.attn.hook_pattern"], rtol=0, atol=0)


def test_bad_captures_are_refused():
    model = ours()
    x = torch.tensor([[1, 2, 3]])
    with pytest.raises(AttnlabError, match="at least one hook point"):
        capture_activations(model, x, capture=[])
    with pytest.raises(HookNotObserved, match="no hook point blocks.9"):
        capture_activations(model, x, capture=["blocks.9.attn.hook_pattern"])


def test_stopped_passes_are_counted_and_twinned():
    model = ours()
    names = ["blocks.1.attn.hook_pattern"]
    x = torch.tensor([[1, 2, 3, 4]])
    twin = prec.golden_twin(model)
    with counting(model) as cost:
        for _ in range(2):
            capture_activations(model, x, capture=names)
        capture_activations(twin, x, capture=names)
    assert (cost.model_passes, cost.twin_passes) == (2, 1)
    # a row built on stopped passes still pays its twin passes and reports them
    frame = check_model(model, properties=["kernel_consistency", "sliding_window", "causal_pattern"],
                        max_examples=2).set_index("property")
    assert frame.loc["kernel_consistency", "status"] == "pass"
    assert frame.loc["kernel_consistency", "twin_passes"] >= frame.loc["kernel_consistency", "model_passes"] > 0
    assert frame.loc["causal_pattern", "model_passes"] > 0
