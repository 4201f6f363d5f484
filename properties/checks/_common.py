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
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor

from properties.strategies import padded_batches, position_offsets, token_batches

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


def kept(err: Tensor, keep: Tensor) -> Tensor:
    """``err`` with NaN read as an infinite deviation and the entries outside ``keep`` (broadcast) exempt (0)."""
    return err.nan_to_num(nan=math.inf).where(keep, err.new_zeros(()))


def worse(err: Tensor, kept_so_far: tuple[float, str], say: Callable[..., str]) -> tuple[float, str]:
    """The worst deviation and where it is, after ``err`` (NaN-free): ``kept_so_far`` unless ``err`` beats it, else
    its largest entry and ``say(value, *index)`` (the index of that entry), the step of every check that keeps the
    worst deviation and names where it is."""
    top = float(err.max())
    return (top, say(top, *where_max(err))) if top > kept_so_far[0] else kept_so_far


def fmt(x: float) -> str:
    return f"{x:.3g}"


def masked_inputs(d_vocab: int, n: int):
    """``(tokens, mask)`` of up to ``n`` positions: unpadded rows (mask None) or, from ``n = 2``, rows padded on
    either side, each with one pad at least; shrinks towards one unpadded row of zeros."""
    inputs = [token_batches(d_vocab, max_batch=2, max_len=n).map(lambda x: (x, None))]
    if n >= 2:
        padded = padded_batches(d_vocab, max_len=max(1, n // 2), max_pad=max(1, n - n // 2))
        inputs.append(padded.map(lambda p: (p.tokens, p.mask)))
    return st.one_of(*inputs)


def draw_chunks(draw, d_vocab: int, rows: int, new_max: int, max_chunk: int) -> list:
    """Inside a composite: up to ``new_max`` new tokens for each of ``rows`` rows, in chunks of 1..``max_chunk``
    decoded one call at a time (ids ``[rows][size]`` per chunk); shrinks towards one chunk of one token."""
    chunks: list = []
    left = new_max
    while left > 0 and (not chunks or draw(st.booleans())):
        size = draw(st.integers(1, min(max_chunk, left)))
        row = st.lists(st.integers(0, d_vocab - 1), min_size=size, max_size=size)
        chunks.append(draw(st.lists(row, min_size=rows, max_size=rows)))
        left -= size
    return chunks


def real_positions(x: Tensor, mask: Any) -> Tensor:
    """bool ``[batch, pos]``: the real (unpadded) positions of ``x`` under ``mask`` (all when None)."""
    return mask.bool() if mask is not None else torch.ones(x.shape, dtype=torch.bool)


def tokens_and_offset(cfg: Any, min_offset: int, max_offset: int, max_batch: int = 2, min_len: int = 1):
    """Tokens and a position offset in [min_offset, max_offset] with every position below n_ctx."""
    longest = max(min_len, min(max_len(cfg), cfg.n_ctx - min_offset))
    return _tokens_and_offset(cfg.d_vocab, cfg.n_ctx, min_offset, max_offset, max_batch, min_len, longest)


@st.composite  # at module level: see properties/strategies.py's token_batches
def _tokens_and_offset(draw, d_vocab: int, n_ctx: int, min_offset: int, max_offset: int, max_batch: int,
                       min_len: int, longest: int):
    x = draw(token_batches(d_vocab, max_batch=max_batch, min_len=min_len, max_len=longest))
    top = max(min_offset, min(max_offset, n_ctx - x.shape[1]))
    return x, draw(position_offsets(top, min_offset=min_offset))
