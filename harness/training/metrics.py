"""Throughput accounting (FLOPs per token, device peak, MFU) and the metrics CSV.

MFU, model FLOPs utilization (Chowdhery et al. 2022, PaLM, Appendix B), is the rate of
useful model FLOPs divided by the device's peak rate.
"""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path
from typing import Any, Optional, TextIO

import pandas as pd
import torch
from torch import nn

from harness.errors import AttnlabError
from harness.run_dir import atomic_write_text

# step          the optimizer update the row ends at (1-based)
# lr            that update's learning rate
# train_loss    mean training objective (label-smoothed if configured) over the updates since the last row
# val_loss      plain cross-entropy on the fixed validation batches (empty between evaluations)
# val_accuracy  argmax accuracy on the validation targets (empty between evaluations)
# grad_norm     global gradient norm of the row's update, before clipping
# tokens_per_s  tokens (every position of the global batch) per second of update time since the last row
# elapsed_s     wall-clock seconds since the run began, summed over resumed segments
# mfu           model FLOPs utilization: flops_per_token * tokens_per_s / peak FLOP/s of all devices
CURVES = ("step", "lr", "train_loss", "val_loss", "val_accuracy")  # the learning curves: what a report reads
COLUMNS = (*CURVES, "grad_norm", "tokens_per_s", "elapsed_s", "mfu")

# Dense peak FLOP/s per GPU as (bf16, tf32), from NVIDIA's datasheets. The PCIe H100 is
# slower than the SXM part, so it is matched first.
GPU_PEAKS = (
    ("H100 PCIe", 756e12, 378e12),
    ("H200", 989e12, 494e12),
    ("H100", 989e12, 494e12),
    ("A100", 312e12, 156e12),
)


def non_embedding_params(model: nn.Module) -> int:
    """N of Kaplan et al. 2020 §2.1: parameters used in matmuls, not in table lookups.

    An embedding table tied to the unembedding counts once, as the unembedding matmul.
    """
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    matmuls = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    params = {id(p): p for p in model.parameters()}
    return sum(p.numel() for i, p in params.items() if i not in lookups or i in matmuls)


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12·L·d·T (Kaplan et al. 2020 §2.1; PaLM Appendix B).

    6N: forward (2N) plus backward (4N) multiply-adds over the weights; 12·L·d·T: the
    attention score and value products (QK^T and AV, 2·2·L·d·T forward, times 3 with the
    backward) with d = n_heads·d_head and T the sequence length.
    """
    cfg: Any = model.cfg  # a protocol model's config (nn.Module attributes are untyped)
    d_attn = cfg.n_heads * cfg.d_head
    return 6.0 * non_embedding_params(model) + 12.0 * cfg.n_layers * d_attn * seq_len


@functools.lru_cache(maxsize=8)
def cpu_matmul_rate(threads: int, n: int = 512, repeats: int = 5) -> float:
    """Measured fp32 matmul FLOP/s on this CPU with ``threads`` threads (best of ``repeats``).

    A 512^3 matmul takes milliseconds, so this costs well under a second, once per process.
    """
    gen = torch.Generator().manual_seed(0)  # never touch the global RNG: runs must stay reproducible
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    a @ b  # warm up the kernels and thread pool
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / max(best, 1e-9)


def peak_flops(device: torch.device, bf16: bool) -> float:
    """The device's peak FLOP/s: a datasheet table on CUDA (NaN if unknown), measured on CPU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, p_bf16, p_tf32 in GPU_PEAKS:
            if key in name:
                return p_bf16 if bf16 else p_tf32
        return math.nan
    return cpu_matmul_rate(torch.get_num_threads())


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest round-trip form: a resumed run's CSV compares exactly
    return str(value)


class MetricsLog:
    """``metrics.csv``, appended one row at a time and flushed, so it can be read during a run."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self.rows: list[dict] = []
        self._file: Optional[TextIO] = None

    def truncate_after(self, step: int) -> None:
        """Drop rows past ``step`` (written after the checkpoint a run resumes from), atomically."""
        if not self.enabled or not self.path.exists():
            return
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        except UnicodeDecodeError as exc:
            raise AttnlabError(f"{self.path} is corrupt: not UTF-8 text ({exc})") from None
        header = ",".join(COLUMNS) + "\n"
        if len(lines) == 1 and header.startswith(lines[0]) and lines[0] != header:
            lines = []  # a header cut short by a kill: start the file afresh
            atomic_write_text(self.path, "")
        if lines and lines[0] != header:  # appending rows under another header would misalign every column
            raise AttnlabError(f"{self.path} is corrupt: its header is {lines[0].strip()!r}: expected "
                               f"{header.strip()!r}")
        # A row cut short by a kill has no newline (or too few fields): drop it with the rest.
        complete = [ln for ln in lines[1:] if ln.endswith("\n") and ln.count(",") == len(COLUMNS) - 1]
        bad = [ln for ln in complete if not ln.split(",", 1)[0].isdigit()]
        if bad:
            raise AttnlabError(f"{self.path} is corrupt: row {bad[0].strip()!r} has no step number")
        keep = lines[:1] + [ln for ln in complete if int(ln.split(",", 1)[0]) <= step]
        if len(keep) != len(lines):
            atomic_write_text(self.path, "".join(keep))

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if not self.enabled:
            return
        if self._file is None:
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", encoding="utf-8")  # closed in close()
            if new:
                self._file.write(",".join(COLUMNS) + "\n")
        try:
            self._file.write(",".join(_fmt(row.get(c)) for c in COLUMNS) + "\n")
            self._file.flush()
        except OSError as exc:  # a full disk: say which file (a flush error carries no file name)
            raise OSError(f"cannot write {self.path}: {exc}") from None

    def sync(self) -> None:
        """fsync, so rows up to a checkpoint survive a crash with it."""
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            f, self._file = self._file, None
            try:
                f.close()
            except OSError as exc:  # the buffered rows could not be flushed (full disk)
                raise OSError(f"cannot write {self.path}: {exc}") from None

    def frame(self) -> pd.DataFrame:
        """Every row of the run: from the CSV when this process writes it, else this segment's rows."""
        if self.enabled and self.path.exists():
            return read_metrics(self.path)
        return pd.DataFrame(self.rows, columns=list(COLUMNS))


def read_metrics(path: Path) -> pd.DataFrame:
    """Read a ``metrics.csv``; ``float_precision="round_trip"`` keeps values bit-exact."""
    return pd.read_csv(path, float_precision="round_trip")


def new_row(step: int) -> dict:
    return dict.fromkeys(COLUMNS, math.nan) | {"step": step}
