"""Component-level position formulas, checked on ``harness.model.positions`` (or any drop-in replacement).

- ``rotary_formula``: for RoPE R_m (Su et al. 2021 eq. 16), <R_m q, R_n k> depends only on m - n,
  i.e. equals <R_{m+s} q, R_{n+s} k> for every shift s. Hypothesis draws d_head, q, k, m, n, s.
- ``sinusoidal_formula``: Vaswani et al. 2017 §3.5: PE(pos + k) = R(k) · PE(pos) with R(k) the
  block rotation of :func:`harness.model.positions.sinusoidal_shift_matrix`.

Both run in float64 so they test the formula, not float32 rounding: tolerance 1e-9 of the
scale (angles up to 4096 rad carry ~1e-12 absolute error in float64).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from hypothesis import strategies as st

from harness.errors import AttnlabTypeError
from harness.model import positions
from properties.checks._common import fmt
from properties.search import PropertyResult, search

ROTARY = "rotary_formula"
SINUSOIDAL = "sinusoidal_formula"
TOLERANCE = 1e-9
MAX_POS = 4096

RotaryFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def harness_rotary(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE of ``harness.model.positions``: rotate ``x [..., d_head]`` to integer positions ``pos [...]`` (float64)."""
    cos, sin = positions.rotary_cos_sin(pos, x.shape[-1], dtype=torch.float64)
    return positions.apply_rotary(x, cos, sin)


def _vectors(d: int):
    # Integer components: both sides are bilinear in (q, k), so integer vectors lose no generality,
    # and they shrink to short, readable counterexamples (float lists shrink slowly).
    ints = st.integers(-3, 3)
    return st.lists(ints, min_size=d, max_size=d).map(lambda v: torch.tensor(v, dtype=torch.float64))


def rotary_formula(rotary: Optional[RotaryFn] = None, *, seed: int = 0,
                   max_examples: Optional[int] = None) -> PropertyResult:
    """<R_m q, R_n k> == <R_{m+s} q, R_{n+s} k> for ``rotary(x, positions)`` (default: harness.model.positions)."""
    rotate = rotary or harness_rotary
    if not callable(rotate):
        raise AttnlabTypeError(f"rotary must be a callable (x, positions) -> rotated x, got {type(rotate).__name__}")

    @st.composite
    def strategy(draw):
        d = 2 * draw(st.integers(1, 8))
        # fixed-size draws cut to d, so shrinking d does not invalidate the vectors drawn after it
        q, k = draw(_vectors(16))[:d], draw(_vectors(16))[:d]
        m, n, s = (draw(st.integers(0, MAX_POS)) for _ in range(3))
        return q, k, m, n, s

    def measure(example):
        q, k, m, n, s = example
        def dot(a: int, b: int) -> float:
            return float((rotate(q, torch.tensor(a)) * rotate(k, torch.tensor(b))).sum())
        before, after = dot(m, n), dot(m + s, n + s)
        scale = max(1.0, float(q.norm() * k.norm()))
        dev = abs(after - before) / scale
        return dev, f"<R_m q, R_n k> = {fmt(before)} but shifted by s it is {fmt(after)}"

    def describe(example):
        q, k, m, n, s = example
        return f"d_head={q.numel()} q={[int(v) for v in q.tolist()]} k={[int(v) for v in k.tolist()]} m={m} n={n} s={s}"

    return search(ROTARY, TOLERANCE, strategy(), measure, describe, seed=seed, max_examples=max_examples)


def sinusoidal_formula(table: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                       shift_matrix: Optional[Callable[[int, int], torch.Tensor]] = None, *,
                       seed: int = 0, max_examples: Optional[int] = None) -> PropertyResult:
    """PE(pos + k) == R(k) @ PE(pos) for ``table(positions, d_model)`` and ``shift_matrix(k, d_model)``.

    Defaults: ``harness.model.positions.sinusoidal_table`` (in float64) and ``sinusoidal_shift_matrix``.
    """
    table = table or (lambda pos, d: positions.sinusoidal_table(pos, d, dtype=torch.float64))
    shift_matrix = shift_matrix or positions.sinusoidal_shift_matrix
    for name, fn in (("table", table), ("shift_matrix", shift_matrix)):
        if not callable(fn):
            raise AttnlabTypeError(f"{name} must be callable, got {type(fn).__name__}")
    strategy = st.tuples(st.integers(1, 32).map(lambda h: 2 * h), st.integers(0, MAX_POS), st.integers(0, MAX_POS))

    def measure(example):
        d, pos, k = example
        shifted = table(torch.tensor(pos + k), d).double()
        rotated = shift_matrix(k, d).double() @ table(torch.tensor(pos), d).double()
        err = (shifted - rotated).abs()
        i = int(err.argmax())
        return float(err.max()), f"PE(pos + k)[{i}] = {fmt(float(shifted[i]))} but (R(k) PE(pos))[{i}] = " \
                                 f"{fmt(float(rotated[i]))}"

    def describe(example):
        d, pos, k = example
        return f"d_model={d} pos={pos} k={k}"

    return search(SINUSOIDAL, TOLERANCE, strategy, measure, describe, seed=seed, max_examples=max_examples)
