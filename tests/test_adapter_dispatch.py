"""A model accelerate dispatched over devices, part of it offloaded to disk, behind the adapter.

On CPU: a tiny Llama saved and loaded back with ``from_pretrained(device_map="auto", max_memory=...,
offload_folder=...)``, a budget that forces most of it to disk (its weights are ``meta`` placeholders
that accelerate loads per pass), and one dispatched by ``accelerate.dispatch_model`` with an explicit
map (its embedding on disk, so the first parameter is ``meta``). Logits are compared with 0.0: the
adapter calls the model's own forward, and accelerate only moves weights, it does not change a sum.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers as tr
from accelerate import dispatch_model

import probes
from harness.adapters import adapt, placed
from harness.adapters.dispatch import NO_TWIN, device_map, input_device, is_dispatched
from harness.adapters.protocol import forward_capture, model_device, observed_hooks
from harness.errors import AttnlabError
from properties import check_model

pytestmark = pytest.mark.usefixtures("one_thread")
V = 64
CONFIG = dict(vocab_size=V, max_position_embeddings=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2)
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])
PROPS = ["causal_pattern", "padding_outputs", "attention_scale", "kv_cache", "finite_outputs"]


def fresh() -> tr.PreTrainedModel:
    torch.manual_seed(0)
    return tr.LlamaForCausalLM(tr.LlamaConfig(**CONFIG)).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    fresh().save_pretrained(folder)
    return folder


def offloaded(folder, tmp_path) -> tr.PreTrainedModel:
    """Loaded by transformers with a CPU budget of ~one layer: the rest goes to disk."""
    return tr.LlamaForCausalLM.from_pretrained(folder, device_map="auto", max_memory={"cpu": 60_000},
                                               offload_folder=str(tmp_path / "offload"), dtype=torch.float32).eval()


def by_map(tmp_path) -> tr.PreTrainedModel:
    mapping = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk",
               "model.layers.2": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
    return dispatch_model(fresh(), device_map=mapping, offload_dir=str(tmp_path / "offload"))


def test_offloaded_model_runs_behind_the_adapter(saved, tmp_path):
    model = offloaded(saved, tmp_path)
    assert "disk" in set(device_map(model).values()) and is_dispatched(model)
    assert any(p.device.type == "meta" for p in model.parameters())  # weights really are off the CPU
    adapter, plain = adapt(model), adapt(fresh())
    assert is_dispatched(adapter) and model_device(adapter) == input_device(adapter) == torch.device("cpu")
    own = model(input_ids=TOKENS).logits
    assert torch.equal(adapter(TOKENS), own) and torch.equal(own, plain(TOKENS))  # 0.0: the same sums
    assert observed_hooks(adapter) == observed_hooks(plain)  # every hook that fires undispatched fires here
    _, acts = forward_capture(adapter, TOKENS, capture=["blocks.1.attn.hook_pattern", "blocks.2.hook_resid_post"])
    _, ref = forward_capture(plain, TOKENS, capture=["blocks.1.attn.hook_pattern", "blocks.2.hook_resid_post"])
    assert all(torch.equal(acts[n], ref[n]) for n in ref)


def test_dispatch_model_with_embedding_on_disk(tmp_path):
    model = by_map(tmp_path)
    adapter = adapt(model)
    assert model.model.embed_tokens.weight.device.type == "meta" and model_device(adapter) == torch.device("cpu")
    assert torch.equal(adapter(TOKENS), adapt(fresh())(TOKENS))


def test_a_dispatched_model_is_never_copied(saved, tmp_path):
    adapter = adapt(offloaded(saved, tmp_path))
    assert placed(adapter) is adapter and placed(adapter, device="cpu") is adapter  # nothing to change: no copy
    for change in ({"dtype": "float64"}, {"attn_implementation": "eager"}):
        with pytest.raises(AttnlabError, match=r"dispatched by accelerate over \['cpu', 'disk'\].*hf_device_map"):
            placed(adapter, **change)


def test_properties_run_on_it_judged_by_the_declared_tolerance(saved, tmp_path):
    table = check_model(offloaded(saved, tmp_path), properties=PROPS, max_examples=6).set_index("property")
    assert (table["status"] == "pass").all(), table[["status", "reason"]]
    calibrated = ["padding_outputs", "attention_scale", "kv_cache"]
    assert all(table.loc[p, "reason"].startswith(NO_TWIN) for p in calibrated)  # the row says why there is no floor
    assert table.loc[calibrated, "noise_floor"].isna().all() and (table.loc[calibrated, "twin_passes"] == 0).all()
    assert not table.loc["causal_pattern", "reason"].startswith(NO_TWIN)  # exact rows need no twin


def test_a_bug_in_a_dispatched_model_is_caught(saved, tmp_path):
    model = offloaded(saved, tmp_path)

    def batch_mean(module, args, output):  # attention output leaks across the batch (a pooling bug) in layer 1
        return (output[0] + output[0].mean(0, keepdim=True), *output[1:])

    model.model.layers[1].self_attn.register_forward_hook(batch_mean)
    row = check_model(model, properties=["batch_independence"], max_examples=6).iloc[0]
    assert row["status"] == "fail" and row["reason"].startswith(NO_TWIN) and math.isnan(row["noise_floor"])
    assert row["worst"] > 100 * row["tolerance"]  # the declared float32 tolerance, far past


def test_head_importance_on_it_equals_the_undispatched_model(saved, tmp_path):
    got = probes.head_importance(offloaded(saved, tmp_path), TOKENS)
    want = probes.head_importance(fresh(), TOKENS)
    assert len(got) == 3 * 4
    torch.testing.assert_close(torch.tensor(got["importance"].to_numpy()), torch.tensor(want["importance"].to_numpy()),
                               atol=0.0, rtol=0.0)  # the same forward passes, weights only moved
