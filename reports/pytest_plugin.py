"""attnlab in another project's pytest run: two fixtures and two options (registered as the ``pytest11`` plugin).

Installing attnlab is all it takes; a test asks for a fixture by name::

    def test_my_model(attnlab_check):
        attnlab_check(build_my_model())          # every property of the suite; fails listing each failed row

    def test_my_kernel(attnlab_kernel):
        attnlab_kernel(my_attention_function)    # the attention-kernel conformance suite

``--attnlab-max-examples N`` sets each search's example count (default: the suite's own budget) and
``--attnlab-dtype`` the dtype a copy of the model (or the kernel's inputs) is checked at. A failure is one
``AssertionError`` whose message lists every failed row with its shrunk counterexample; each row is also
recorded as a test property (``attnlab:<property>``), so ``--junitxml`` carries the whole table.

The plugin is loaded by every pytest run in an environment where attnlab is installed, before any conftest,
so this module (in ``reports``, whose package imports nothing) imports nothing heavy: torch and the other attnlab
packages are imported by a fixture when a test first calls it. That keeps other projects' start-up fast, and
leaves ``harness`` and ``properties`` to be imported after the import hooks a test run installs (jaxtyping's
refuses to start when a package it is to check is already imported: attnlab's own tests check those two).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any, Optional

import pytest

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")


def _max_examples(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a positive integer (examples per search)")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnlab", "attnlab: attention property checks")
    group.addoption("--attnlab-max-examples", type=_max_examples, default=None, metavar="N",
                    help="examples each attnlab search draws (default: the suite's own per-row budget)")
    group.addoption("--attnlab-dtype", choices=DTYPES, default="auto",
                    help="dtype a copy of the model is checked at (auto: the model's own); a kernel is checked at "
                         "float32 under auto (default: auto)")


def _record(request: pytest.FixtureRequest, table: Any) -> None:
    """Each row of ``table`` as a test property: JUnit XML's <properties> then carry the whole table."""
    for row in table.itertuples():
        text = str(row.status)
        if "dtype" in table.columns:
            text += f" at {row.dtype}"
        if row.worst == row.worst:  # not NaN
            text += f", worst {row.worst:.3g}"
        if row.reason:
            text += f": {row.reason}"
        request.node.user_properties.append((f"attnlab:{row.property}", text))


def _call(request: pytest.FixtureRequest, assertion: str, subject: Any, kw: dict[str, Any]) -> Any:
    """Run ``properties.testing.<assertion>`` on ``subject`` with the command line's options, recording its rows
    whether it passes or fails."""
    __tracebackhide__ = True  # a failure shows the test's line and the rows, not attnlab's frames
    testing = importlib.import_module("properties.testing")
    try:
        table = getattr(testing, assertion)(subject, **kw)
    except AssertionError as failure:
        failed: Optional[Any] = getattr(failure, "table", None)  # properties.testing.RowsFailed carries it
        if failed is not None:
            _record(request, failed)
        raise
    _record(request, table)
    return table


@pytest.fixture
def attnlab_check(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``attnlab_check(model, **kw)``: :func:`properties.testing.assert_properties` on ``model`` (an HF
    ``PreTrainedModel``, a TransformerLens bridge, a protocol model, or a plain module with ``cfg=``), at the
    command line's ``--attnlab-max-examples`` and ``--attnlab-dtype`` unless ``kw`` says otherwise. Returns the
    table; raises AssertionError listing every failed row with its counterexample."""
    options = {"max_examples": request.config.getoption("attnlab_max_examples"),
               "dtype": request.config.getoption("attnlab_dtype")}

    def check(model: Any, **kw: Any) -> Any:
        __tracebackhide__ = True
        return _call(request, "assert_properties", model, {**options, **kw})

    return check


@pytest.fixture
def attnlab_kernel(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``attnlab_kernel(fn, **kw)``: :func:`properties.testing.assert_kernel` on an attention function with
    transformers' AttentionInterface signature, at ``--attnlab-dtype`` (float32 under auto) and
    ``--attnlab-max-examples``. Returns the table; raises AssertionError listing every failed row."""
    dtype = request.config.getoption("attnlab_dtype")
    options = {"max_examples": request.config.getoption("attnlab_max_examples"),
               "dtype": "float32" if dtype == "auto" else dtype}

    def check(fn: Any, **kw: Any) -> Any:
        __tracebackhide__ = True
        return _call(request, "assert_kernel", fn, {**options, **kw})

    return check
