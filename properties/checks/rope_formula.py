"""RoPE as a formula (a component property): <R_m q, R_n k> depends only on m - n.

For the rotation R_m of Su et al. 2021 eq. 16, <R_m q, R_n k> equals <R_{m+s} q, R_{n+s} k> for
every shift s; hypothesis draws d_head, q, k, m, n and s. Checked on ``harness.model.positions``
(or any drop-in replacement), not on a model. Float64, so the formula is tested, not float32
rounding: tolerance 1e-9 of the scale (angles up to 4096 rad carry ~1e-12 absolute error).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from hypothesis import strategies as st

from harness.errors import AttnlabTypeError
from harness.model import positions
from properties.checks._common import fmt
from properties.registry import Plan, component_property

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


@st.composite  # at module level: see properties/strategies.py's token_batches
def _vectors_and_positions(draw):
    d = 2 * draw(st.integers(1, 8))
    # fixed-size draws cut to d, so shrinking d does not invalidate the vectors drawn after it
    q, k = draw(_vectors(16))[:d], draw(_vectors(16))[:d]
    m, n, s = (draw(st.integers(0, MAX_POS)) for _ in range(3))
    return q, k, m, n, s


@component_property(name="rotary_formula", order=10, tolerance=TOLERANCE,
                    rule="relative to max(1, |q||k|), in float64: angles up to 4096 rad carry ~1e-12 absolute error",
                    applies_to="a rotary function rotary(x, positions); default harness.model.positions")
def rotary_formula(rotary: Optional[RotaryFn] = None) -> Plan:
    """<R_m q, R_n k> == <R_{m+s} q, R_{n+s} k> for ``rotary(x, positions)`` (default: harness.model.positions)."""
    rotate = rotary or harness_rotary
    if not callable(rotate):
        raise AttnlabTypeError(f"rotary must be a callable (x, positions) -> rotated x, got {type(rotate).__name__}")

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

    return Plan(_vectors_and_positions(), measure, describe)
