"""The benchmark suite: one table, each row a ratio of two contenders timed side by side in one run.

Rows, each with its goal:
1. training step of our ``Transformer`` vs a plain minimal GPT, at three sizes (goal >= 1.0x);
2. forward with every hook point idle vs hook points bypassed (overhead <= 3%);
3. ``run_with_cache`` with every hook (<= 1.5x) and with one hook (<= 1.05x) vs a plain forward,
   and the bytes kept for one requested hook vs that activation's size (<= 1);
4. leave-one-out head ablation (batched, prefix reuse; >= 1.5x) and gradient importance (>= 5x)
   vs one forward pass per head;
5. forward and ``run_with_cache`` vs a Hugging Face GPT-2 in a ``TransformerBridge`` (>= 1.0x);
6. MFU of the training step (CPU: >= 75% of the fp32 matmul rate measured in the same run;
   CUDA: >= 45% of the bf16 datasheet peak at GPT-2-small size, L12 d768 T1024).

``run_suite(mode)``: ``"full"`` for people, ``"short"`` for CI (smaller batches, fewer rounds),
``"smoke"`` for tests (tiny shapes, one round: checks that every row runs, figures meaningless).
``python -m reports.bench [mode] [device]`` prints the table.

CPU figures and the allocator: glibc returns large freed blocks to the system and faults them in
again on the next step, which on a virtual machine can cost more than the arithmetic and differs
between two models by allocation order alone. For figures that measure the computation, run with
``MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296`` (or jemalloc/tcmalloc,
as PyTorch's CPU performance guide suggests); the default is kept because it is what users get.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Union

import pandas as pd
import torch

from harness.errors import AttnlabError, AttnlabTypeError
from reports.bench.cases import bridge_rows, cache_rows, idle_hook_row, probe_rows
from reports.bench.core import Row, Shape
from reports.bench.train import compiled_hook_check, mfu_rows, train_step_row

MODES = ("smoke", "short", "full")
COLUMNS = ["name", "ours", "reference", "unit", "ratio", "goal", "met", "note"]


@dataclass(frozen=True)
class Plan:
    """What one mode measures: the shapes of each row family and how many interleaved rounds."""

    train: tuple[Shape, ...]  # row 1, timed alone
    mfu: Shape  # row 1's largest size and row 6, timed together
    train_rounds: int
    mfu_rounds: int
    hooks: Shape
    hook_rounds: int
    probes: Shape
    probe_rounds: int
    bridge: Shape
    bridge_rounds: int
    amp: bool = False
    compile: bool = False  # torch.compile for the MFU shape (both contenders)
    compile_train: bool = False  # ... and for the smaller training shapes too (a compilation each)
    mfu_goal: float = 0.75


def plan_for(mode: str, device: torch.device) -> Plan:
    """The shapes and rounds of ``mode`` on ``device``."""
    if mode == "smoke":
        tiny = Shape(1, 32, 2, 16, 2, 64)
        return Plan(train=(tiny,), mfu=Shape(2, 32, 2, 16, 2, 64), train_rounds=1, mfu_rounds=1,
                    hooks=tiny, hook_rounds=1, probes=Shape(2, 32, 2, 16, 4, 64), probe_rounds=1,
                    bridge=tiny, bridge_rounds=1)
    full = mode == "full"
    # Three sizes, up to L6 d512 T256; L4 d256 T128 is the training benchmark's reference shape.
    # Short mode keeps the shapes and shrinks the batch of the two smaller ones, so a row means the
    # same in both modes. The MFU shape keeps 8 x 256 tokens: with fewer, AdamW's per-parameter
    # work (memory-bound, no FLOPs counted) takes a quarter of the step and MFU measures the batch.
    sizes = [(2, 128, 4, 64), (4, 256, 8, 128), (6, 512, 8, 256)]
    batches = (16, 16, 8) if full else (8, 8, 8)
    # Probes: 4 layers, the depth the prefix-reuse bound (L+1)/2L of the work is stated for; a small vocabulary,
    # as the synthetic tasks have, so the unembedding does not dominate every pass.
    probes = Shape(4, 128, 8, 64, 32 if full else 8, 128)
    hooks = Shape(4, 256, 8, 128, 16 if full else 8)
    if device.type == "cuda":
        big = [Shape(*s, batch=32) for s in sizes]
        # GPT-2 small (Radford et al. 2019) with nanoGPT's vocabulary padded to a multiple of 64.
        gpt2 = Shape(12, 768, 12, 1024, 16, 50304)
        return Plan(train=tuple(big), mfu=gpt2, train_rounds=10 if full else 5, mfu_rounds=10 if full else 5,
                    hooks=Shape(4, 256, 8, 128, 64), hook_rounds=30, probes=probes, probe_rounds=5,
                    bridge=hooks, bridge_rounds=10, amp=True, compile=True, compile_train=full, mfu_goal=0.45)
    train = tuple(Shape(*s, batch=b) for s, b in zip(sizes, batches, strict=True))
    return Plan(train=train[:2], mfu=train[2], train_rounds=10 if full else 5, mfu_rounds=10 if full else 3,
                hooks=hooks, hook_rounds=30 if full else 15, probes=probes, probe_rounds=5 if full else 3,
                bridge=hooks, bridge_rounds=10 if full else 5)


def _device(device: Union[None, str, torch.device]) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise AttnlabTypeError(f"device must be None, a str or a torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise AttnlabError(f"device={device!r} is invalid: expected 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type not in ("cpu", "cuda"):
        raise AttnlabError(f"device={device!r} is not supported: expected 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AttnlabError(f"device={device!r} was asked for but CUDA is not available on this machine")
    return dev


def run_suite(mode: str = "short", device: Union[None, str, torch.device] = None) -> pd.DataFrame:
    """Run every row; a DataFrame with ``COLUMNS``, and ``attrs`` holding the run's context.

    ``attrs["checks"]`` holds the figures that show each pair of contenders computes the same
    thing (max differences, missing cache keys); ``attrs["seconds"]`` the suite's wall time.
    """
    if mode not in MODES:
        raise AttnlabError(f"mode={mode!r} is invalid: expected one of {list(MODES)}")
    dev = _device(device)
    plan = plan_for(mode, dev)
    start, load_before = time.perf_counter(), _load()
    checks: dict = {}
    rows: list[Row] = []
    precision = torch.get_float32_matmul_precision()
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for the fp32 matmuls outside autocast, as training does
    try:
        for shape in plan.train:
            rows.append(train_step_row(shape, dev, plan.train_rounds, amp=plan.amp, compile_models=plan.compile_train))
        rows += mfu_rows(plan.mfu, dev, plan.mfu_rounds, amp=plan.amp, compile_models=plan.compile,
                         goal=plan.mfu_goal)
        rows.append(idle_hook_row(plan.hooks, dev, plan.hook_rounds))
        rows += cache_rows(plan.hooks, dev, plan.hook_rounds, checks)
        rows += probe_rows(plan.probes, dev, plan.probe_rounds, checks)
        rows += bridge_rows(plan.bridge, dev, plan.bridge_rounds, checks)
        if plan.compile:
            checks.update(compiled_hook_check(dev))
    finally:
        torch.set_float32_matmul_precision(precision)
    frame = pd.DataFrame([r.record() for r in rows], columns=COLUMNS)
    frame.attrs.update(mode=mode, device=str(dev), device_name=_device_name(dev), threads=torch.get_num_threads(),
                       torch=torch.__version__, amp=plan.amp, compile=plan.compile, checks=checks,
                       seconds=time.perf_counter() - start, load=(load_before, _load()))
    return frame


def _load() -> float:
    """The 1-minute load average: above the core count, other processes share the timed cores."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU, {torch.get_num_threads()} threads"


def _num(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "nan"
    if unit.startswith("s"):
        return f"{value * 1e3:.2f} ms"
    if unit == "FLOP/s":
        return f"{value / 1e9:.1f} GFLOP/s"
    if unit == "bytes":
        return f"{value / 2**20:.2f} MiB"
    return f"{value:.3g}"


def format_table(df: pd.DataFrame) -> str:
    """The suite's table as plain text: one line per row, then the notes and the checks."""
    if not isinstance(df, pd.DataFrame) or not set(COLUMNS) <= set(df.columns):
        raise AttnlabError(f"format_table expects the DataFrame run_suite returns, with columns {COLUMNS}")
    cells = [["row", "ours", "reference", "ratio", "goal", "met"]]
    for _, r in df.iterrows():
        cells.append([r["name"], _num(r["ours"], r["unit"]), _num(r["reference"], r["unit"]),
                      f"{r['ratio']:.3f}" if math.isfinite(r["ratio"]) else "nan", r["goal"],
                      "yes" if r["met"] else "NO"])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    a = df.attrs
    if a:
        lines.insert(0, f"attnlab bench: mode={a.get('mode')} device={a.get('device_name')} amp={a.get('amp')} "
                        f"compile={a.get('compile')} torch={a.get('torch')} ({a.get('seconds', math.nan):.0f} s, "
                        "load average {:.1f} -> {:.1f})".format(*a.get("load", (math.nan, math.nan))))
    before = a.get("load", (math.nan,))[0]  # the load after includes this run's own threads
    cores = os.cpu_count() or 1
    if a.get("device", "cpu") == "cpu" and before > 0.5 * cores:
        lines.append(f"warning: load average {before:.1f} on {cores} cores before the run: other processes shared "
                     "the timed cores, so ratios near their goal may be noise; re-run on a quiet machine")
    notes = [f"  {r['name']}: {r['note']}" for _, r in df.iterrows() if r["note"]]
    if notes:
        lines += ["notes:", *notes]
    if a.get("checks"):
        lines.append("checks: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in a["checks"].items()))
    return "\n".join(lines)
