"""Shape annotations are checked at run time under pytest (pyproject addopts, tests/helpers/shapecheck.py)."""

from typing import Optional

import pytest
import torch
from jaxtyping import Float, TypeCheckError
from torch import Tensor

from harness.model import positions
from tests.helpers.shapecheck import has_shape_hint


def test_a_shape_mismatch_in_an_annotated_function_raises():
    x = torch.zeros(2, 4)
    assert positions.apply_rotary(x, torch.ones(1, 4), torch.zeros(1, 4)).shape == (2, 4)  # broadcast is fine
    with pytest.raises(TypeCheckError, match="apply_rotary"):
        positions.apply_rotary(x, torch.ones(2, 6), torch.zeros(2, 6))  # d_head 4 vs 6


def test_a_wrong_dtype_raises():
    with pytest.raises(TypeCheckError, match="sinusoidal_table"):
        positions.sinusoidal_table(torch.zeros(3), 8)  # float positions: expected integer positions


def test_other_annotations_are_left_to_the_project_checks():
    # `d_model: int` is not checked by beartype: the function's own check raises its ValueError
    with pytest.raises(ValueError, match="d_model=3 is invalid"):
        positions.sinusoidal_table(torch.arange(3), 3)


def test_has_shape_hint_looks_inside_typing_constructs():
    assert has_shape_hint(Float[Tensor, "batch pos"])
    assert has_shape_hint(Optional[Float[Tensor, "batch pos"]])
    assert has_shape_hint(tuple[Float[Tensor, " batch"], dict[str, Tensor]])
    assert not has_shape_hint(Tensor) and not has_shape_hint(Optional[int])
