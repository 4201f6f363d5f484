"""The float64 twin's depthwise convolutions (properties/twin_conv.py): the same numbers as torch's, sooner.

The claim the module rests on is bit-equality with ``F.conv1d``, so that is what is tested: on a grid of
shapes, and on a hybrid model's twin end to end (its logits and activations with and without the reroute).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from harness.adapters import HFAdapter
from harness.adapters.placement import placed
from harness.adapters.protocol import forward_capture
from properties import check_model, twin_conv
from properties.precision import golden_twin
from reports.census import shrink
from reports.census.enumerate import by_name

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("channels", "taps"), [(1, 4), (3, 2), (64, 4), (1024, 4), (96, 3)])
def test_the_taps_equal_torchs_float64_depthwise_conv_to_the_bit(channels, taps):
    g = torch.Generator().manual_seed(channels * 10 + taps)
    seen = 0
    for length, bias, stride, pad, dil in itertools.product((2, 5, 24, 60), (True, False), (1, 2), (0, 1, 3), (1, 2)):
        if length + 2 * pad < dil * (taps - 1) + 1:
            continue  # shorter than the kernel: conv1d refuses it
        x = torch.randn(2, channels, length, dtype=torch.float64, generator=g)
        w = torch.randn(channels, 1, taps, dtype=torch.float64, generator=g)
        b = torch.randn(channels, dtype=torch.float64, generator=g) if bias else None
        with twin_conv.DepthwiseTaps():
            got = F.conv1d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=channels)
        want = F.conv1d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=channels)
        taken = twin_conv._taps_or_none(x, w, b, stride, pad, dil, channels)
        seen += taken is not None
        assert torch.equal(got, want), (length, bias, stride, pad, dil)
        if taken is not None:
            assert torch.equal(taken, want)
    assert seen > 20  # the grid exercised the taps, not only the fallback


def test_what_the_taps_do_not_take_runs_on_torch():
    x, w = torch.randn(1, 4, 9, dtype=torch.float64), torch.randn(4, 1, 3, dtype=torch.float64)
    assert twin_conv._taps_or_none(x.float(), w.float(), None, 1, 1, 1, 4) is None  # not float64
    assert twin_conv._taps_or_none(x, w, None, 1, 0, 1, 2) is None  # not depthwise
    assert twin_conv._taps_or_none(x[..., :3], w, None, 1, 0, 1, 4) is None  # a one-position output
    assert twin_conv._taps_or_none(x, w, None, 1, "same", 1, 4) is None  # padding by name
    long = torch.randn(1, 4, twin_conv.MAX_POSITIONS + 5, dtype=torch.float64)
    assert twin_conv._taps_or_none(long, w, None, 1, 0, 1, 4) is None  # long: torch's kernel is faster


def _hybrid():
    mt = by_name()["qwen3_next"]  # gated DeltaNet layers: transformers' causal_conv1d_fn on the conv's weight
    return HFAdapter(shrink.build(mt.name, mt.class_name)).eval()


def test_a_hybrid_twin_gives_the_same_numbers_with_the_taps(monkeypatch):
    model = _hybrid()
    plain, fast = placed(model, dtype="float64").eval(), placed(model, dtype="float64").eval()
    assert twin_conv.reroute_depthwise(fast) > 0
    calls, real = [], twin_conv.taps
    monkeypatch.setattr(twin_conv, "taps", lambda *a: calls.append(1) or real(*a))
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in range(model.cfg.n_layers)]
    for shape in ((1, 2), (2, 8), (3, 17)):
        x = torch.randint(0, model.cfg.d_vocab, shape, generator=torch.Generator().manual_seed(sum(shape)))
        want, want_acts = forward_capture(plain, x, capture=hooks)
        got, got_acts = forward_capture(fast, x, capture=hooks)
        assert torch.equal(got, want) and all(torch.equal(got_acts[h], want_acts[h]) for h in hooks)
    assert calls  # the taps ran inside the model, not only the fallback


def test_the_twin_is_rerouted_and_the_users_model_is_not():
    model = _hybrid()
    twin = golden_twin(model)
    assert twin is not None and any("forward" in vars(m) for m in twin.modules())
    check_model(model, max_examples=1, properties=["causal_outputs"])
    assert not any("forward" in vars(m) for m in model.modules())
