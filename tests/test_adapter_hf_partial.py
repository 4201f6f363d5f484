"""HFAdapter's partial runs (harness/adapters/hf_partial.py): TransformerLens's stop_at_layer / start_at_layer.

``stop_at_layer=l`` then ``start_at_layer=l`` gives the full forward's logits exactly, for every l, on plain,
hybrid (RecurrentGemma: blocks are its attention layers) and tuple-returning (Falcon, module hooks) stacks, with
left padding and a position offset; so the probes reuse the residual before layer l on Hugging Face models too
(prefix reuse, probes/gates.py), and leave-one-out still equals one plain forward per head.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import probes
from harness.adapters import adapt
from harness.errors import AttnlabError
from probes import gates
from probes._validate import model_info, probe_data
from reports.bench.reference import naive_head_ablation
from reports.census.shrink import build

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "falcon": "FalconForCausalLM",
         "recurrent_gemma": "RecurrentGemmaForCausalLM"}


@pytest.fixture(scope="module", params=list(ARCHS))
def model(request):
    return adapt(build(request.param, ARCHS[request.param]).eval())


def test_stop_then_start_is_the_full_forward(model):
    tokens = torch.tensor([[3, 4, 5, 6, 7], [1, 2, 3, 4, 5]]) % model.cfg.d_vocab
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        full = model(tokens, attention_mask=mask, position_offset=2)
        for layer in range(model.cfg.n_layers + 1):
            resid = model(tokens, attention_mask=mask, position_offset=2, stop_at_layer=layer)
            assert resid.shape == (2, 5, model.cfg.d_model)
            out = model(resid, attention_mask=mask, position_offset=2, start_at_layer=layer)
            assert torch.equal(out[mask.bool()], full[mask.bool()]), layer
        # a stop is the residual the block's hook_resid_pre sees
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter="blocks.0.hook_resid_pre")
        torch.testing.assert_close(model(tokens, attention_mask=mask, stop_at_layer=0),
                                   cache["blocks.0.hook_resid_pre"], atol=0, rtol=0)
    assert model(tokens).shape[-1] == model.cfg.d_vocab  # the skipped layers' forwards are back


def test_bad_partial_runs_are_one_clear_error(model):
    tokens = torch.tensor([[3, 4, 5]]) % model.cfg.d_vocab
    n = model.cfg.n_layers
    with pytest.raises(AttnlabError, match=f"stop_at_layer={n + 1} is invalid"):
        model(tokens, stop_at_layer=n + 1)
    with pytest.raises(AttnlabError, match="must be a float residual stream"):
        model(tokens, start_at_layer=0)
    with pytest.raises(AttnlabError, match="before start_at_layer"):
        model(torch.zeros(1, 3, model.cfg.d_model), start_at_layer=1, stop_at_layer=0)


def test_leave_one_out_reuses_prefixes_on_a_hugging_face_model():
    model = adapt(build("llama", "LlamaForCausalLM").eval())
    info = model_info(model)
    assert info.prefix_reuse  # HFAdapter now starts mid-stack
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 9), generator=torch.Generator().manual_seed(0))
    got = probes.head_importance(model, tokens, method="ablation")
    want = naive_head_ablation(model, tokens)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    seen = torch.tensor(got.sort_values(["layer", "head"])["loss_delta"].to_numpy()).view(L, H)
    torch.testing.assert_close(seen, want.to(seen.dtype), atol=1e-5, rtol=0)
    d = probe_data(info, tokens)
    g = torch.Generator().manual_seed(1)
    masks = (torch.rand(7, L, H, generator=g) > 0.4).float()  # multi-layer masks against a base mask
    fast = gates.masked_stats(model, info, d, masks, base=masks[3], batch_size=5)
    slow = gates.masked_stats(model, dataclasses.replace(info, prefix_reuse=False), d, masks)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
