"""``harness.adapters.placed``: a model at the user's dtype, device and attention kernel, never the caller's cast.

Tolerances: a float64 copy of a float32 model computes the same function up to float32 rounding of
the reference (~1e-6 relative on logits of size ~1, 30 ops deep), so atol 1e-4; a bfloat16 copy is
only compared for being a different, finite function. Eager vs sdpa on the same weights differ by
summation order only (float32): atol 1e-5, as tests/test_adapter_hf.py.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import probes
import properties
from harness.adapters import BridgeAdapter, HFAdapter
from harness.adapters import placement as pl
from harness.adapters.placement import check_placement, placed, placement_of
from harness.errors import AttnlabError
from harness.model.config import ModelConfig
from harness.model.transformer import Transformer
from properties.testing import assert_properties
from tests.helpers.hf_models import VOCAB, gpt2, llama

pytestmark = pytest.mark.usefixtures("one_thread")
TOKENS = torch.tensor([[3, 9, 1, 40, 7, 22, 5], [8, 8, 2, 61, 0, 13, 4]])


def own() -> Transformer:
    return Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=VOCAB, n_ctx=16,
                                   positional_embedding_type="rotary"))


def test_nothing_to_change_is_the_model_itself():
    model = own()
    assert placed(model) is model
    assert placed(model, dtype="auto", device="cpu", attn_implementation="sdpa") is model
    adapter = HFAdapter.of(llama())
    assert placed(adapter, dtype="float32") is adapter
    assert placed(adapter.hf_model) is adapter  # a raw model is adapted, the same adapter as adapt() gives


def test_a_dtype_change_is_a_copy_and_the_caller_keeps_its_weights():
    model = own()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = model(TOKENS)
    low = placed(model, dtype="bfloat16")
    assert low is not model and low.W_E.dtype == torch.bfloat16 and low.config.dtype == "bfloat16"
    back = placed(low, dtype="float32")
    assert model.config.dtype == "float32" and model.W_E.dtype == torch.float32
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0)  # not even bf16-rounded
    assert torch.equal(model(TOKENS), ref)
    assert not torch.equal(back(TOKENS), ref)  # the round trip through bf16 did round (the copy's, not ours)
    wide = placed(model, dtype="float64")
    torch.testing.assert_close(wide(TOKENS), ref.double(), atol=1e-4, rtol=0)
    assert placement_of(wide) == {"dtype": "float64", "device": "cpu", "attn_implementation": "sdpa"}


def test_an_hf_copy_has_its_own_hooks_and_leaves_the_original_untouched():
    adapter = HFAdapter.of(llama())
    weight = adapter.hf_model.model.layers[0].self_attn.q_proj.weight
    ref = adapter(TOKENS)
    low = placed(adapter, dtype="bfloat16")
    assert isinstance(low, HFAdapter) and low.hf_model is not adapter.hf_model
    assert weight.dtype == torch.float32
    assert low.hf_model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    out = low(TOKENS)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all() and not torch.equal(out.float(), ref)
    fired: list[str] = []
    with low.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: fired.append("low"))]):
        adapter(TOKENS)  # the original's modules must not fire the copy's hook points
        assert fired == []
        low(TOKENS)
    assert fired == ["low"]
    with adapter.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: fired.append("orig"))]):
        low(TOKENS)  # nor the copy's modules the original's
    assert fired == ["low"]
    assert torch.equal(adapter(TOKENS), ref)
    assert placement_of(low) == {"dtype": "bfloat16", "device": "cpu", "attn_implementation": "sdpa"}


def test_an_attention_kernel_is_chosen_on_a_copy():
    hf = llama()
    adapter = HFAdapter.of(hf)
    eager = placed(hf, attn_implementation="eager")
    assert placement_of(eager)["attn_implementation"] == "eager"
    assert eager.hf_model.config._attn_implementation == "attnlab_eager"
    assert placement_of(adapter)["attn_implementation"] == "sdpa"  # the original still runs sdpa
    torch.testing.assert_close(eager(TOKENS), adapter(TOKENS), atol=1e-5, rtol=0)
    with pytest.raises(AttnlabError, match="attn_implementation='no_such_kernel'"):
        placed(adapter, attn_implementation="no_such_kernel")
    with pytest.raises(AttnlabError, match="attn_implementation='eager' cannot be chosen for Transformer"):
        placed(own(), attn_implementation="eager")


def test_a_bridge_is_copied_at_the_dtype():
    bridge = BridgeAdapter.from_hf(gpt2())
    ref = bridge(TOKENS)
    wide = placed(bridge, dtype="float64")
    assert isinstance(wide, BridgeAdapter) and wide is not bridge
    torch.testing.assert_close(wide(TOKENS), ref.double(), atol=1e-4, rtol=0)
    assert placement_of(bridge)["dtype"] == "float32" and placement_of(wide)["dtype"] == "float64"
    with pytest.raises(AttnlabError, match="cannot be chosen for BridgeAdapter"):
        placed(bridge, attn_implementation="eager")


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype="half"), r"dtype='half' is not a dtype attnlab runs; expected one of \['auto', 'float32'"),
    (dict(dtype=torch.float16), r"dtype=torch.float16 is not a dtype attnlab runs"),
    (dict(device="nowhere"), r"device='nowhere' is not a torch device"),
    (dict(device="cuda:7"), r"device='cuda:7' is not available on this machine"),
])
def test_bad_placements_get_one_error_before_the_model_is_touched(kwargs, match):
    if "cuda" in str(kwargs.get("device")) and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    model = own()
    with pytest.raises(AttnlabError, match=match):
        placed(model, **kwargs)
    with pytest.raises(AttnlabError, match=match):
        check_placement(**kwargs)
    assert model.W_E.dtype == torch.float32


def test_a_dtype_the_device_cannot_run_is_refused(monkeypatch):
    # A CPU build without float16 kernels raises from the matmul itself; simulate exactly that error.
    matmul = torch.Tensor.__matmul__

    def no_half(a, b):
        if a.dtype == torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return matmul(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", no_half)
    pl._runs.cache_clear()
    try:
        with pytest.raises(AttnlabError, match=r"dtype='float16' cannot run on device 'cpu' \(\"addmm_impl_cpu_\""):
            check_placement("float16", "cpu")
        assert check_placement("bfloat16", "cpu") == (torch.bfloat16, torch.device("cpu"))
    finally:
        pl._runs.cache_clear()  # the real answer for later tests


def test_the_kernel_of_a_bridge_is_its_hf_models_and_a_users_model_declares_none():
    bridge = BridgeAdapter.from_hf(gpt2())
    assert placement_of(bridge)["attn_implementation"] == bridge.bridge.original_model.config._attn_implementation
    assert pl.kernel_of(torch.nn.Linear(2, 2)) == pl.UNDECLARED


def test_check_model_and_assert_properties_run_the_placed_copy_and_say_so():
    model = own()
    frame = properties.check_model(model, dtype="float64", properties=["causal_outputs"], max_examples=3)
    assert {k: frame.attrs[k] for k in ("dtype", "device", "attn_implementation")} == \
        {"dtype": "float64", "device": "cpu", "attn_implementation": "sdpa"}
    assert model.W_E.dtype == torch.float32
    table = assert_properties(llama(), ["causal_outputs"], max_examples=3, attn_implementation="eager")
    assert table.attrs["attn_implementation"] == "eager" and table.attrs["dtype"] == "float32"
    with pytest.raises(AttnlabError, match="dtype='fp8'"):
        properties.check_model(model, dtype="fp8")


@pytest.mark.parametrize("name", [n for n in probes.__all__ if callable(getattr(probes, n))
                                  and "model" in inspect.signature(getattr(probes, n)).parameters])
def test_every_public_probe_takes_the_placement_keywords(name):
    params = inspect.signature(getattr(probes, name)).parameters
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("dtype", "device", "attn_implementation"))


def test_a_probe_runs_on_the_placed_copy():
    model = own()
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    ref = probes.head_importance(model, tokens)
    wide = probes.head_importance(model, tokens, dtype="float64")
    assert wide.attrs["dtype"] == "float64" and ref.attrs["dtype"] == "float32"
    assert model.W_E.dtype == torch.float32
    # float64 vs float32 loss deltas: the same ablations, float32 rounding of ~1e-7 relative on losses ~4
    torch.testing.assert_close(torch.tensor(wide.importance.to_numpy()), torch.tensor(ref.importance.to_numpy(),
                               dtype=torch.float64), atol=1e-4, rtol=0)
    with pytest.raises(AttnlabError, match="device='nowhere'"):
        probes.prune_curve(model, tokens, device="nowhere")
