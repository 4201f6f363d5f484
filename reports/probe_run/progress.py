"""Progress of `attnlab probe` on stderr, terminal or not: a line per method, and a rate-limited percentage.

The percentage counts forward passes as they happen (a forward pre-hook on the model: rows x
layers run, in units of the whole data through the whole model, as probes.compare.PassCounter
counts them) against the method's planned passes; the time left is the plan's rate measured on
the passes done so far. At most one percentage line per ``every`` seconds, so a log stays short.

With a ``deadline`` (the budget's end, on the same clock) the first pass that starts after it raises
:class:`BudgetSpent` out of the running method: the re-plan between methods works from rates measured after
the fact, so a machine that slows down in the middle of a long method would otherwise carry the run past its
budget by the rest of that method.

Each method's finish line gives the process's peak RSS so far where Linux can measure it (``VmHWM``, the
loaded model included); the memory a method freed goes back to the system before the next one starts.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, TextIO

from probes.compare import pass_share
from reports.probe_run.plan import Step, fmt_seconds

EVERY_S = 5.0
_STATUS = Path("/proc/self/status")


def peak_rss_gb() -> Optional[float]:
    """This process's peak RSS so far in GB (10^9 bytes), Linux's ``VmHWM``; None where unknown.

    Never reset (``/proc/self/clear_refs``): that would also lower what ``/usr/bin/time`` and ``getrusage``
    report as the process's peak."""
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return None
    kb = next((int(line.split()[1]) for line in lines if line.startswith("VmHWM:")), None)
    return None if kb is None else kb * 1024 / 1e9


def release_memory() -> None:
    """Give the memory a finished method freed back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    torch's CPU tensors come from malloc, and glibc keeps freed chunks in per-thread arenas: after the
    attribution pass SmolLM2-135M's probe held 1.71 GB resident against 1.04 GB trimmed, and the next method's
    peak (leave-one-out: 2.25 GB) stood on top of that instead of reusing it."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class BudgetSpent(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the pass counter when a pass would start after the budget's end; ``done`` of ``planned`` passes
    (the plan's units) had run."""

    def __init__(self, method: str, done: float, planned: float):
        super().__init__(f"{method}: the budget ran out after {done:.1f} of {planned:.1f} passes")
        self.method, self.done, self.planned = method, done, planned


class Progress:
    """Prints a probe run's stages and percentages; ``enabled=False`` prints nothing."""

    def __init__(self, n_layers: int, sequences: int, *, enabled: bool = True, stream: Optional[TextIO] = None,
                 every: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.n_layers, self.sequences = n_layers, sequences
        self.enabled, self.stream, self.every, self.clock = enabled, stream, every, clock
        self.done = 0.0  # passes run by the current method, in the plan's units
        self.forward = 0.0  # the same, as layers x rows only (a count that does not depend on a timing)
        self.peak_gb: Optional[float] = None  # the process's peak RSS when the last method finished
        self.tail = 0.0  # the share of a pass after the last layer (plan.Shape.tail): a call that runs it counts it
        self.deadline: Optional[float] = None  # on ``clock``: no pass starts after it (BudgetSpent)
        self._planned, self._name, self._start, self._last = 1.0, "", 0.0, 0.0
        self._first: Optional[float] = None  # when the current method's first pass started
        self._end: Optional[float] = None  # when its latest pass ended

    @property
    def span(self) -> float:
        """Seconds from the current method's first pass start to its last pass end: its passes and the work between
        them (a loss per pass), without the setup before them or the analysis after (roles, distances), which do
        not grow with the passes. The re-plan's rate is this over the passes (0.0 when none ran)."""
        return 0.0 if self._first is None or self._end is None else max(self._end - self._first, 0.0)

    def say(self, line: str) -> None:
        if self.enabled:
            print(f"probe: {line}", file=self.stream or sys.stderr, flush=True)

    @contextmanager
    def step(self, index: int, total: int, step: Step, model: Any) -> Iterator[None]:
        """Around one method: its start line, its percentages while its passes run, and its finish line."""
        # forward passes only: a forward + backward step runs one forward over the data (its backward is
        # in the plan's passes, not in what the forward pre-hook counts)
        self._planned = max(min(step.passes, 1.0) if "bwd" in step.variant.name else step.passes, 1e-9)
        self._name, self.done, self.forward = step.method, 0.0, 0.0
        self._start = self._last = self.clock()
        self._first = self._end = None
        self.say(f"[{index}/{total}] {step.method} ({step.variant.name}): ~{step.passes:.1f} passes, "
                 f"~{fmt_seconds(step.seconds)}")
        handles = [model.register_forward_pre_hook(self._count, with_kwargs=True),
                   model.register_forward_hook(self._ended, always_call=True)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            release_memory()
        self.peak_gb = peak_rss_gb()
        peak = "" if self.peak_gb is None else f", peak RSS so far {self.peak_gb:.2f} GB"
        self.say(f"[{index}/{total}] {step.method}: done in {fmt_seconds(self.clock() - self._start)} "
                 f"(planned ~{fmt_seconds(step.seconds)}){peak}")

    def _ended(self, module: Any, args: tuple, output: Any) -> None:
        self._end = self.clock()

    def _count(self, module: Any, args: tuple, kwargs: dict) -> None:
        if self.deadline is not None and self.clock() >= self.deadline:
            raise BudgetSpent(self._name, self.done, self._planned)
        x = args[0] if args else kwargs.get("tokens", kwargs.get("input", None))
        rows = int(x.shape[0]) if x is not None and hasattr(x, "shape") else 0
        layers = pass_share(rows, kwargs, self.n_layers, self.sequences)
        if self._first is None:
            self._first = self.clock()
        self.forward += layers  # whole passes' worth of layers (probes.compare.PassCounter's count)
        # in the plan's units (plan.Shape.masked): the layers run, and the tail whole when the call runs to the end
        tail = rows / self.sequences * self.tail if kwargs.get("stop_at_layer") is None else 0.0
        self.done += (1.0 - self.tail) * layers + tail
        now = self.clock()
        if now - self._last >= self.every and self.done > 0:
            self._last = now
            frac = min(self.done / self._planned, 1.0)
            rate = (now - self._start) / self.done
            left = max(self._planned - self.done, 0.0) * rate
            self.say(f"  {self._name}: {frac:.0%} ({self.done:.1f}/{self._planned:.1f} passes), "
                     f"~{fmt_seconds(left)} left")
