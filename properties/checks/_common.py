"""Shared pieces of the property checks: tolerances, deviations, input bounds, where a deviation peaks.

Tolerances. The allowance of every calibrated (numeric) property is measured per example from
this model's rounding noise against a float64 twin: the rule and its derivation are owned by
properties/precision.py (docs/precision.md). The constants below are the declared float32
tolerances, used only for a model no float64 twin can be made of:
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
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from properties.strategies import position_offsets, token_batches

LOGIT_RTOL = 1e-4
LOGIT_RULE = "relative to max(1, max|logit|): float32 kernels and summation orders differ by ~1e-7..1e-6"
MAX_LEN = 8  # sequence lengths the searches draw; small keeps a search to milliseconds per example


def max_len(cfg: Any, cap: int = MAX_LEN) -> int:
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


def where_max(t: Tensor) -> tuple[int, ...]:
    """The first index of ``t``'s largest entry (NaN-free ``t``), to name where a deviation peaks."""
    return tuple(int(i) for i in (t == t.max()).nonzero()[0])


def fmt(x: float) -> str:
    return f"{x:.3g}"


def tokens_and_offset(cfg: Any, min_offset: int, max_offset: int, max_batch: int = 2, min_len: int = 1):
    """Tokens and a position offset in [min_offset, max_offset] with every position below n_ctx."""
    longest = max(min_len, min(max_len(cfg), cfg.n_ctx - min_offset))

    @st.composite
    def build(draw):
        x = draw(token_batches(cfg.d_vocab, max_batch=max_batch, min_len=min_len, max_len=longest))
        top = max(min_offset, min(max_offset, cfg.n_ctx - x.shape[1]))
        return x, draw(position_offsets(top, min_offset=min_offset))

    return build()
