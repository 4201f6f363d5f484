"""kernel_consistency on a window longer than the drawn inputs: one row past the edge, measured once a search.

A window past :data:`properties.checks.window.MAX_WINDOW_LEN` keys needs an input longer than it, which costs
what many short inputs do (on Gemma-3-270m, three 515-token rows were most of the row's time). The row measures
one such row first in every search and draws short masked inputs after it; the edge is still where a kernel
that widens the window (transformers #39408) is caught.
"""

from __future__ import annotations

import pytest
import torch

from properties import check_model
from properties.checks.window import MAX_WINDOW_LEN
from tests.field_bugs import models, patches

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = MAX_WINDOW_LEN + 6


def lengths_run(model) -> list[int]:
    """The sequence length of every float32 forward of ``model``'s decoder, recorded as it runs (the hook is copied
    into the float64 twin, which the dtype tells apart)."""
    seen: list[int] = []

    def record(module, args, kwargs):
        if module.embed_tokens.weight.dtype == torch.float32:
            seen.append((kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[1])

    model.model.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def test_a_long_window_row_measures_one_long_input_and_short_drawn_ones():
    model = models.mistral(attn="sdpa", window=WINDOW, n_ctx=64)
    seen = lengths_run(model)
    frame = check_model(model, properties=["kernel_consistency"], max_examples=6, seed=0).set_index("property")
    assert frame.loc["kernel_consistency", "status"] == "pass"
    long = [n for n in seen if n > MAX_WINDOW_LEN]
    assert long == [WINDOW + 3], seen  # one row past the edge
    assert len(seen) > 6  # the drawn inputs ran too, short


def test_a_kernel_that_widens_a_long_window_is_caught_on_the_row_past_its_edge():
    model = models.mistral(attn="sdpa", window=WINDOW, n_ctx=64)
    with patches.flash_window_both_sides():
        frame = check_model(model, properties=["kernel_consistency"], max_examples=3, seed=0).set_index("property")
    row = frame.loc["kernel_consistency"]
    assert row["status"] == "fail", row.to_dict()
    assert "outside" in row["counterexample"] or "differs" in row["counterexample"]
    tokens = row["counterexample"].split("tokens=")[1].split("]]")[0]
    assert tokens.count(",") + 1 == WINDOW + 3
