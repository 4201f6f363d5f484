"""What every benchmark row shares: shapes, the row record, and side-by-side timing.

Contenders run interleaved in the same process, so machine noise (other processes, frequency
changes) hits them alike; a row's ratio is the median over rounds of the two contenders' time
ratio within a round (:func:`paired_ratio`), never a wall-clock threshold.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch

from harness._checks import check_int
from harness.errors import AttnlabError
from harness.model.config import ModelConfig


@dataclass(frozen=True)
class Shape:
    """A model and batch shape: ``batch`` sequences of ``n_ctx`` tokens."""

    n_layers: int
    d_model: int
    n_heads: int
    n_ctx: int
    batch: int
    d_vocab: int = 512

    @property
    def label(self) -> str:
        return f"L{self.n_layers} d{self.d_model} T{self.n_ctx} B{self.batch}"

    def config(self, **overrides) -> ModelConfig:
        """Our model at this shape; exact GELU and an untied unembedding, as :class:`PlainGPT` has."""
        fields: dict[str, Any] = dict(n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                                      n_ctx=self.n_ctx, d_vocab=self.d_vocab, act_fn="gelu") | overrides
        return ModelConfig(**fields)

    def tokens(self, device: torch.device, extra: int = 0, seed: int = 0) -> torch.Tensor:
        """Random token ids ``[batch, n_ctx + extra]`` from a private generator (the global RNG is left alone)."""
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.d_vocab, (self.batch, self.n_ctx + extra), generator=gen).to(device)


@dataclass(frozen=True)
class Row:
    """One line of the table: ``ratio`` compared with ``goal`` by ``op`` (">=" or "<=").

    For speed rows ``ratio`` is reference time / our time (higher is better, ``op=">="``); for
    overhead rows it is our time / reference time (``op="<="``); either is paired by round
    (:func:`paired_ratio`). ``ours`` and ``reference`` (medians) are in ``unit``.
    """

    name: str
    ours: float
    reference: float
    unit: str
    ratio: float
    op: str
    goal: float
    note: str = ""

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise AttnlabError(f"Row {self.name!r}: op={self.op!r} is invalid: expected '>=' or '<='")

    @property
    def met(self) -> bool:
        if not math.isfinite(self.ratio):
            return False
        return self.ratio >= self.goal if self.op == ">=" else self.ratio <= self.goal

    def record(self) -> dict:
        return {"name": self.name, "ours": self.ours, "reference": self.reference, "unit": self.unit,
                "ratio": self.ratio, "goal": f"{self.op} {self.goal:g}", "met": self.met, "note": self.note}


def device_sync(device: Optional[torch.device]) -> Callable[[], None]:
    """A function that waits for queued work on ``device``: CUDA kernels run asynchronously, so a
    timer read without it measures only the kernel launches."""
    if device is not None and torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def interleaved_times(fns: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 2,
                     device: Optional[torch.device] = None) -> dict[str, list[float]]:
    """Seconds of every call of each function, ``rounds`` per function, calls interleaved round by round.

    The order within a round alternates (forward, then reversed), so a contender is not always the
    one that runs right after another (warm caches, a freshly trimmed heap).
    """
    if not fns:
        raise AttnlabError("interleaved_times needs at least one function to time, got none")
    for name, value in (("rounds", rounds), ("warmup", warmup)):
        low = 1 if name == "rounds" else 0
        check_int(name, value, low)
    sync = device_sync(device)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 2,
                        device: Optional[torch.device] = None) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved round by round."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(fns, rounds, warmup, device).items()}


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of ``num``'s time / ``den``'s time in the same round.

    Pairing by round cancels load that changes between rounds (a shared machine), which a ratio
    of two medians taken over different moments does not.
    """
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=True))


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(ts) for name, ts in times.items()}
