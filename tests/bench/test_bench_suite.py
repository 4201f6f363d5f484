"""The whole benchmark table (``attnlab bench``), in short mode for CI or full mode for people.

Ratios are printed and recorded, not asserted against their goals: a timed assertion would
flake on a shared machine. What is asserted is what does not depend on timing: every row is
there with finite figures, each pair of contenders computes the same thing, and the cache
keeps exactly the requested activation.
"""

import math

import pytest

from reports.bench.suite import format_table, run_suite
from tests.bench.common import FULL

pytestmark = pytest.mark.bench


def test_benchmark_table(benchmark):
    frames = []
    benchmark.pedantic(lambda: frames.append(run_suite("full" if FULL else "short", device="cpu")),
                       rounds=1, iterations=1)
    df = frames[0]
    print("\n" + format_table(df))
    benchmark.extra_info.update({r["name"]: r["ratio"] for _, r in df.iterrows()})
    assert len(df) == 12 and df["name"].is_unique  # rows 1-6 on CPU: 3 + 1 + 1 + 3 + 2 + 2
    assert all(math.isfinite(v) and v > 0 for v in df["ratio"])
    checks = df.attrs["checks"]
    assert checks["cache_all_keys_missing"] == 0 and checks["cache_one_extra_keys"] == 0
    # float32 losses summed in a different order: a few ulps of a loss ~ ln(128) ~ 5.
    assert checks["ablation_vs_naive_max_abs"] < 1e-4
    assert checks["bridge_logprob_max_abs"] < 1e-4  # same weights, float32, different kernels
    memory = df[df["name"].str.contains("bytes kept")].iloc[0]
    assert memory["ratio"] == 1.0, memory["note"]
