"""Sinusoids as a formula (a component property): PE(pos + k) is the block rotation R(k) of PE(pos).

Vaswani et al. 2017 §3.5, with R(k) from :func:`harness.model.positions.sinusoidal_shift_matrix`.
Checked on ``harness.model.positions`` (or drop-in replacements), not on a model. Float64, so the
formula is tested, not float32 rounding: tolerance 1e-9 absolute (entries are <= 1; angles up to
4096 rad carry ~1e-12 absolute error).
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


@component_property(name="sinusoidal_formula", order=20, tolerance=TOLERANCE,
                    rule="absolute, in float64 (entries <= 1): angles up to 4096 rad carry ~1e-12 absolute error",
                    applies_to="a table(positions, d_model) and shift_matrix(k, d_model); default "
                               "harness.model.positions")
def sinusoidal_formula(table: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                       shift_matrix: Optional[Callable[[int, int], torch.Tensor]] = None) -> Plan:
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

    return Plan(strategy, measure, describe)
