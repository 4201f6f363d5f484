"""properties.search on its own: reproducible by seed, shrinking to a minimal input, no source read per search."""

from __future__ import annotations

import hypothesis.core
from hypothesis import strategies as st

from properties.search import search


def _run(seed: int, limit: int, seen: list[int]):
    def measure(x: int):
        seen.append(x)
        return float(x), f"x={x}"

    return search("toy", limit, st.integers(0, 1000), measure, str, seed=seed, max_examples=20)


def test_the_same_seed_draws_the_same_inputs_and_a_failure_shrinks_to_the_smallest():
    a, b, c = [], [], []
    assert _run(3, 10_000, a).status == "pass" and _run(3, 10_000, b).status == "pass"
    assert a == b and len(a) == 20
    failed = _run(3, 100, c)
    assert failed.status == "fail" and failed.counterexample.startswith("101:"), failed


def test_a_search_does_not_read_its_function_source(monkeypatch):
    """Without an example database no database key is needed; hypothesis would otherwise digest the source."""
    def digest(_):
        raise AssertionError("function_digest called")

    monkeypatch.setattr(hypothesis.core, "function_digest", digest)
    assert _run(0, 10_000, []).status == "pass"
    assert _run(0, 100, []).status == "fail"
