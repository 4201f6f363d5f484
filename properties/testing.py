"""Assertions for a project's own test suite: the property suite as one pytest-friendly call.

A three-line pytest test (the model is yours; a plain ``nn.Module`` needs ``cfg=...``)::

    def test_my_attention_is_correct():
        import properties.testing
        properties.testing.assert_properties(build_my_model(), max_examples=25)

A failed property raises ``AssertionError`` listing each one with its shrunk counterexample;
n/a rows never fail, unobservable rows (a hook the property needs never fires) do not fail
unless ``allow_unobservable=False``.

An attention kernel (transformers' AttentionInterface signature) the same way, through the kernel suite::

    def test_my_kernel():
        properties.testing.assert_kernel(my_attention_forward, dtype="bfloat16")
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

from harness.adapters.protocol import AnyModel
from harness.errors import AttnlabTypeError
from properties.kernels import check_kernel
from properties.suite import check_model


class RowsFailed(AssertionError):
    """An assertion helper's failure: the message lists every failed row; ``table`` is the whole table (the pytest
    plugin records its rows in the test's report)."""

    def __init__(self, message: str, table: pd.DataFrame):
        super().__init__(message)
        self.table = table


def _exceeded(row: Any) -> str:
    """What a failed row exceeded: its measured allowance (with the ratio) where it has one, else its tolerance."""
    allowance = getattr(row, "allowance", float("nan"))
    if allowance == allowance:  # not NaN: a calibrated row (properties/precision.py)
        return f"worst {row.worst:.3g} > allowance {allowance:.3g} (ratio {row.ratio:.3g})"
    return f"worst {row.worst:.3g} > tolerance {row.tolerance:.3g}"


def assert_properties(model: AnyModel, properties: Optional[list[str]] = None, seed: int = 0,
                      max_examples: Optional[int] = None, *, allow_unobservable: bool = True,
                      **kw: Any) -> pd.DataFrame:
    """Run :func:`properties.check_model` and raise AssertionError if any property failed.

    ``properties``, ``seed``, ``max_examples`` and ``**kw`` (e.g. ``cfg=`` for a plain module)
    go to :func:`properties.check_model`. With ``allow_unobservable=False`` an unobservable row
    fails too (its reason names the silent hook). Returns the table when nothing failed.
    """
    __tracebackhide__ = True  # under pytest a failure shows the caller's line and the rows, not this frame
    if not isinstance(allow_unobservable, bool):
        raise AttnlabTypeError(f"allow_unobservable={allow_unobservable!r} is invalid: expected True or False")
    table = check_model(model, seed=seed, max_examples=max_examples, properties=properties, **kw)
    bad = table[table.status == "fail"]
    lines = [f"- {r.property}: {_exceeded(r)}; counterexample: {r.counterexample}" for r in bad.itertuples()]
    if not allow_unobservable:
        silent = table[table.status == "unobservable"]
        lines += [f"- {r.property}: unobservable: {r.reason}" for r in silent.itertuples()]
    if lines:
        checked = int(table.status.isin(["pass", "fail"]).sum())
        raise RowsFailed(f"{len(lines)} of {len(table)} properties failed ({checked} checked, seed={seed}):\n"
                         + "\n".join(lines), table)
    return table


def assert_kernel(fn: Any, dtype: str = "float32", max_examples: Optional[int] = None, seed: int = 0,
                  **kw: Any) -> pd.DataFrame:
    """Run :func:`properties.kernels.check_kernel` on ``fn`` at ``dtype`` and raise AssertionError listing every
    failed row with its shrunk counterexample; n/a rows (a feature the kernel declares it lacks, or refuses on
    every input) never fail. ``**kw`` (e.g. ``properties=[...]``) goes to ``check_kernel``. Returns the table
    when nothing failed."""
    __tracebackhide__ = True  # pytest shows the message, not this frame
    table = check_kernel(fn, dtypes=(dtype,), max_examples=max_examples, seed=seed, **kw)
    bad = table[table.status == "fail"]
    if not bad.empty:
        lines = [f"- {r.property} ({r.dtype}): worst {r.worst:.3g} > allowance {r.allowance:.3g}; counterexample: "
                 f"{r.counterexample}" for r in bad.itertuples()]
        checked = int(table.status.isin(["pass", "fail"]).sum())
        raise RowsFailed(f"{len(bad)} of {len(table)} kernel properties failed ({checked} checked, dtype={dtype}, "
                         f"seed={seed}):\n" + "\n".join(lines), table)
    return table
