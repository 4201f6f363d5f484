"""Training step (forward, backward, AdamW) of our unhooked Transformer vs a plain minimal GPT,
at the reference shape (L4 d256 T128 B16 V512)."""

import pytest
import torch

from reports.bench.core import Shape
from reports.bench.train import train_contenders, train_step_row
from tests.bench.common import FULL, report

pytestmark = pytest.mark.bench


def test_train_step_vs_plain_gpt(benchmark):
    shape = Shape(4, 256, 8, 128, 16, 512)
    row = train_step_row(shape, torch.device("cpu"), rounds=15 if FULL else 6)
    report(benchmark, f"train step {shape.label} V512", ours_s=row.ours, plain_s=row.reference,
           speed_ratio=row.ratio)
    _, steps = train_contenders(shape, torch.device("cpu"), amp=False, compile_models=False)
    benchmark.pedantic(steps["ours"], rounds=2, iterations=1)
    # Not the goal (>= 1.0, reported by the suite): a bound no noise reaches, so a failure is a regression.
    assert row.ratio > 0.5, f"grossly slower than a plain GPT ({row.ratio:.2f}x): something regressed badly"
