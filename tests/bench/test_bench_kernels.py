"""What the kernel suite costs, side by side with the float64 reference it computes, in one run.

``check_kernel`` on transformers' ``sdpa`` at float32 with the default examples per row (the goal: under a
minute on 2 cores), against the same number of plain float64 reference evaluations (one per row and
example) of a mid-sized grid case. The ratio ("the suite costs N reference evaluations each") moves less
with the machine's speed than seconds do, and pairing by round cancels most of the load a shared machine
adds. Printed and recorded, never asserted; what is asserted does not depend on timing: sdpa raises no
false alarm.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from properties.kernels import DEFAULT_EXAMPLES, NAMES, Case, builtins, check_kernel
from properties.kernels.reference import eager
from reports.bench.core import interleaved_times, paired_ratio
from tests.bench.common import FULL, report

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]

ROUNDS = 5 if FULL else 2


def test_kernel_suite_cost_in_reference_evaluations(benchmark):
    kernel = builtins()["sdpa"]
    frames = []
    evaluations = len(NAMES) * DEFAULT_EXAMPLES
    case = Case(b=2, h=4, h_kv=2, q=8, k=8, causal=True, mask="bool", seed=0)
    tensors = case.tensors()

    def suite():
        frames.append(check_kernel(kernel, dtypes=("float32",)))

    def reference():
        for _ in range(evaluations):
            eager(case, tensors, torch.float64)

    times = interleaved_times({"suite": suite, "reference": reference}, rounds=ROUNDS, warmup=1)
    ratio = paired_ratio(times, "suite", "reference")
    report(benchmark, f"check_kernel sdpa float32, {DEFAULT_EXAMPLES} examples x {len(NAMES)} rows",
           suite_s=statistics.median(times["suite"]), reference_s=statistics.median(times["reference"]),
           reference_evaluations=float(evaluations), ratio=ratio)
    benchmark.pedantic(reference, rounds=1, iterations=1)
    failed = frames[-1][frames[-1].status == "fail"]
    assert failed.empty, failed[["property", "counterexample"]].to_dict("records")
