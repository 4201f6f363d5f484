"""``check_model``: every model-level property, one row each, in one table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import pandas as pd

from harness.adapters.entry import adapt, describe
from harness.adapters.protocol import check_protocol
from properties.checks import (
    attention_scale,
    batch_independence,
    causal_outputs,
    causal_pattern,
    kv_cache,
    padding_outputs,
    padding_pattern,
    pattern_distribution,
    permutation_equivariance,
    relative_position,
    rotary_norm,
    sinusoidal_shift,
)
from properties.search import PropertyResult, check_search_args

# Model-level properties in report order. The component-level formulas (rotary_formula,
# sinusoidal_formula) check harness.positions rather than a model, so they are not rows here.
PROPERTIES: dict[str, Callable[..., PropertyResult]] = {
    "permutation_equivariance": permutation_equivariance,
    "causal_outputs": causal_outputs,
    "causal_pattern": causal_pattern,
    "pattern_distribution": pattern_distribution,
    "padding_outputs": padding_outputs,
    "padding_pattern": padding_pattern,
    "batch_independence": batch_independence,
    "attention_scale": attention_scale,
    "relative_position": relative_position,
    "rotary_norm": rotary_norm,
    "sinusoidal_shift": sinusoidal_shift,
    "kv_cache": kv_cache,
}
COLUMNS = ["property", "applicable", "passed", "worst", "tolerance", "counterexample"]


def check_model(model: Any, *, seed: int = 0, max_examples: Optional[int] = None,
                properties: Optional[list[str]] = None) -> pd.DataFrame:
    """Run the property checks on a model that follows the protocol; one row per property.

    Columns: ``property, applicable, passed, worst, tolerance, counterexample``. ``worst`` is
    the largest deviation seen, ``counterexample`` the shrunk input that broke the property
    ("" when it held); ``passed`` is None where the property does not apply. ``seed`` makes
    the searches reproducible; ``max_examples`` caps each search (default: the loaded
    hypothesis profile's). ``properties`` selects a subset by name. A model that does not
    follow the protocol raises TypeError listing what is missing.
    """
    check_search_args(seed, max_examples)
    names = list(PROPERTIES) if properties is None else list(properties)
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown or not names:
        raise ValueError(f"properties={properties!r} is invalid: expected names from {list(PROPERTIES)}")
    model = adapt(model)  # a PreTrainedModel or TransformerBridge goes behind its adapter
    check_protocol(model)
    was_training = getattr(model, "training", False)
    model.eval()  # dropout or other train-mode noise would break every equality
    try:
        rows = [PROPERTIES[n](model, seed=seed, max_examples=max_examples) for n in names]
    finally:
        model.train(was_training)
    frame = pd.DataFrame([{c: getattr(r, c) for c in COLUMNS} for r in rows], columns=COLUMNS)
    frame["passed"] = frame["passed"].astype(object)
    frame.attrs["adapter"] = describe(model)
    return frame
