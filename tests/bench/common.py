"""Shared by the benchmark tests: the mode, the side-by-side timer (from :mod:`reports.bench.core`,
so ``attnlab bench`` and these tests time alike) and how a figure is recorded."""

from __future__ import annotations

import os

from reports.bench.core import interleaved_medians

FULL = os.environ.get("ATTNLAB_BENCH", "short") == "full"

__all__ = ["FULL", "interleaved_medians", "report"]


def report(benchmark, title: str, **figures: float) -> None:
    """Record figures on the pytest-benchmark row and print them for the closing table."""
    benchmark.extra_info.update(figures)
    print(f"\n[bench] {title}: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()))
