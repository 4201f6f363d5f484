"""The float64 twin's depthwise convolutions as a sum over their taps: the same numbers, many times sooner.

Hybrid models (Mamba mixers, gated DeltaNet layers: Nemotron-H, Qwen3.5, Qwen3-Next, Jamba ...) run a
depthwise 1-D convolution (``groups == channels``, a kernel of ~4 taps) over the sequence, through their
``nn.Conv1d`` or through ``F.conv1d`` on its weight (transformers' reference ``causal_conv1d_fn``). On CPU,
PyTorch's float64 depthwise convolution is far slower than its float32 one: it runs one small product per
channel (C=1024 channels over 27 positions: 11.4 ms against 0.13 ms on one AVX2 core), and in a census
of tiny models it was a tenth of all the time spent. Written as the sum it defines (``out[b, c, t] =
bias[c] + sum_j w[c, j] x[b, c, t*s + j*d - p]``, bias first, taps in order) it takes 0.05-0.3 ms and
gives the same float64 numbers, bit for bit: on 8,688 shapes (1-2048 channels, 1-200 positions, 1-5 taps,
stride, padding and dilation 1-3, with and without bias) it equals ``F.conv1d`` wherever the output has at
least two positions (with one, torch sums the taps before the bias). Outputs of one position, long ones
(past :data:`MAX_POSITIONS`, where torch's own kernel is faster) and anything not float64 (a float32
fallback twin) stay on ``F.conv1d``.

Only the twin is rerouted, never the user's model (the twin is attnlab's own copy), and only inside the
forward of a module that owns a depthwise ``nn.Conv1d``: a ``TorchFunctionMode`` there sees every
``conv1d`` call, however the module makes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

MAX_POSITIONS = 128  # output positions up to which the taps are faster than torch's float64 kernel


def reroute_depthwise(model: Any) -> int:
    """Run the forward of every module of ``model`` (a float64 twin) that owns a depthwise ``nn.Conv1d`` under
    :class:`DepthwiseTaps`; returns how many modules were rerouted."""
    owners = [m for m in (model.modules() if isinstance(model, nn.Module) else ())
              if any(_depthwise(c) for c in m.children())]
    for owner in owners:
        owner.forward = functools.partial(_under_taps, owner.forward)
    return len(owners)


def _depthwise(module: nn.Module) -> bool:
    return isinstance(module, nn.Conv1d) and module.groups == module.in_channels == module.out_channels


def _under_taps(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with DepthwiseTaps():
        return forward(*args, **kwargs)


class DepthwiseTaps(TorchFunctionMode):
    """Within the block, a float64 depthwise ``conv1d`` of 2 to :data:`MAX_POSITIONS` output positions is
    computed by :func:`taps`; every other call runs as it was made."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.conv1d:
            out = _taps_or_none(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _one(v: Any) -> Optional[int]:
    """An int, or a 1-tuple of one, as conv1d takes its stride, padding and dilation; None otherwise."""
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 1 and isinstance(v[0], int):
        return v[0]
    return None


def _taps_or_none(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Any = 1, padding: Any = 0,
                  dilation: Any = 1, groups: int = 1) -> Optional[Tensor]:
    s, p, d = _one(stride), _one(padding), _one(dilation)
    if s is None or p is None or d is None or x.dtype != torch.float64 or weight.dtype != torch.float64 \
            or x.dim() != 3 or weight.dim() != 3 or weight.shape[1] != 1 \
            or not groups == x.shape[1] == weight.shape[0] \
            or (bias is not None and (bias.dtype != torch.float64 or bias.shape != (groups,))):
        return None
    k = weight.shape[-1]
    out_len = (x.shape[-1] + 2 * p - d * (k - 1) - 1) // s + 1
    if not 2 <= out_len <= MAX_POSITIONS:
        return None
    return taps(x, weight, bias, s, p, d)


def taps(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: int, pad: int, dil: int) -> Tensor:
    """``F.conv1d(x, weight, bias, stride, pad, dil, groups=channels)`` summed tap by tap, bias first."""
    if pad:
        x = F.pad(x, (pad, pad))
    k = weight.shape[-1]
    n = (x.shape[-1] - dil * (k - 1) - 1) // stride + 1
    span = stride * (n - 1) + 1
    w = weight[:, 0, :]  # [channels, taps]
    out: Optional[Tensor] = None
    for j in range(k):
        term = x[..., j * dil: j * dil + span: stride] * w[:, j, None]
        out = (term if bias is None else bias[:, None] + term) if out is None else out + term
    assert out is not None  # k >= 1
    return out
