"""Shared pieces of the property checks: tolerances, deviations, input bounds.

Tolerances (float32 models, compared in float64):
- ``LOGIT_RTOL``: two forward passes that are equal in exact arithmetic but batch, pad,
  permute or offset differently run different kernels and summation orders. Each float32
  op has relative error <= 2^-24 ~ 6e-8; through a few layers with reductions over <= 512
  terms the logits differ by ~1e-7..1e-6 of their scale (measured on harness, GPT-2 and
  Llama models). 1e-4 of ``max(1, max|logit|)`` leaves two orders of margin, while every
  mutated bug in tests/mutants moves logits by > 1e-2.
- exact checks (tolerance 0): a masked or padded key's weight is ``exp(-inf) = 0`` or, for
  additive masks of -1e4 or below, ``exp(<= -1e4)``, which underflows to exactly 0 in float32
  (the smallest subnormal is exp(-103.3)). Any positive weight is a leak.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Optional

import torch
from torch import Tensor

from harness.adapters.protocol import ProtocolModel, check_protocol, observed_hooks

LOGIT_RTOL = 1e-4
MAX_LEN = 8  # sequence lengths the searches draw; small keeps a search to milliseconds per example


def max_len(cfg, cap: int = MAX_LEN) -> int:
    return max(1, min(cap, cfg.n_ctx))


def scaled_deviation(actual: Tensor, expected: Tensor) -> tuple[float, tuple[int, ...]]:
    """``max|actual - expected| / max(1, max|expected|)`` and the index where it is largest.

    NaN or inf anywhere counts as an infinite deviation.
    """
    actual, expected = actual.double(), expected.double()
    diff = (actual - expected).abs()
    if diff.numel() == 0:
        return 0.0, ()
    bad = ~torch.isfinite(diff)
    if bool(bad.any()):
        return math.inf, tuple(int(i) for i in bad.nonzero()[0])
    flat = int(diff.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    scale = max(1.0, float(expected.abs().max()))
    return float(diff.max()) / scale, idx


def prepare(model: ProtocolModel, observed: Optional[set[str]]) -> set[str]:
    """Check the protocol's forward/cfg part and return the hooks that fire (computed if not given).

    :func:`properties.check_model` computes ``observed`` once and passes it to every check.
    """
    check_protocol(model, hooks=False)
    return observed_hooks(model) if observed is None else set(observed)


def hook_gap(model: ProtocolModel, names: Iterable[str], observed: set[str]) -> Optional[str]:
    """Why a check needing ``names`` cannot look at ``model`` (None when every hook fires)."""
    for name in names:
        if name not in model.hook_dict:
            return f"no hook point {name}"
        if name not in observed:
            return f"hook {name} exists but never fires on this model"
    return None


def fmt(x: float) -> str:
    return f"{x:.3g}"
