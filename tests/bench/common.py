"""Side-by-side timing: contenders run interleaved in the same process, so machine noise
hits them alike, and only ratios of medians are reported."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

FULL = os.environ.get("ATTNLAB_BENCH", "short") == "full"


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved round by round."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def report(benchmark, title: str, **figures: float) -> None:
    """Record figures on the pytest-benchmark row and print them for the closing table."""
    benchmark.extra_info.update(figures)
    print(f"\n[bench] {title}: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()))
