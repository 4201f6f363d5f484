"""Progress of `attnlab probe` on stderr, terminal or not: a line per method, and a rate-limited percentage.

The percentage counts forward passes as they happen (a forward pre-hook on the model: rows x
layers run, in units of the whole data through the whole model, as probes.compare.PassCounter
counts them) against the method's planned passes; the time left is the plan's rate measured on
the passes done so far. At most one percentage line per ``every`` seconds, so a log stays short.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional, TextIO

from reports.probe_run.plan import Step, fmt_seconds

EVERY_S = 5.0


class Progress:
    """Prints a probe run's stages and percentages; ``enabled=False`` prints nothing."""

    def __init__(self, n_layers: int, sequences: int, *, enabled: bool = True, stream: Optional[TextIO] = None,
                 every: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.n_layers, self.sequences = n_layers, sequences
        self.enabled, self.stream, self.every, self.clock = enabled, stream, every, clock
        self.done = 0.0
        self._planned, self._name, self._start, self._last = 1.0, "", 0.0, 0.0

    def say(self, line: str) -> None:
        if self.enabled:
            print(f"probe: {line}", file=self.stream or sys.stderr, flush=True)

    @contextmanager
    def step(self, index: int, total: int, step: Step, model: Any) -> Iterator[None]:
        """Around one method: its start line, its percentages while its passes run, and its finish line."""
        # forward passes only: a forward + backward step runs one forward over the data (its backward is
        # in the plan's passes, not in what the forward pre-hook counts)
        self._planned = max(min(step.passes, 1.0) if "bwd" in step.variant.name else step.passes, 1e-9)
        self._name, self.done = step.method, 0.0
        self._start = self._last = self.clock()
        self.say(f"[{index}/{total}] {step.method} ({step.variant.name}): ~{step.passes:.1f} passes, "
                 f"~{fmt_seconds(step.seconds)}")
        handle = model.register_forward_pre_hook(self._count, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()
        self.say(f"[{index}/{total}] {step.method}: done in {fmt_seconds(self.clock() - self._start)} "
                 f"(planned ~{fmt_seconds(step.seconds)})")

    def _count(self, module: Any, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs.get("tokens", kwargs.get("input", None))
        rows = int(x.shape[0]) if x is not None and hasattr(x, "shape") else 0
        start = kwargs.get("start_at_layer") or 0
        stop = kwargs.get("stop_at_layer")
        stop = self.n_layers if stop is None else stop
        self.done += rows * max(stop - start, 0) / (self.sequences * self.n_layers)
        now = self.clock()
        if now - self._last >= self.every and self.done > 0:
            self._last = now
            frac = min(self.done / self._planned, 1.0)
            rate = (now - self._start) / self.done
            left = max(self._planned - self.done, 0.0) * rate
            self.say(f"  {self._name}: {frac:.0%} ({self.done:.1f}/{self._planned:.1f} passes), "
                     f"~{fmt_seconds(left)} left")
