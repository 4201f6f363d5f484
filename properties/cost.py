"""What one property costs: forward passes of the model and of its float64 copies, and seconds.

Each row of :func:`properties.check_model` carries :data:`COST_COLUMNS`, so a user sees where a
check's time goes and a change that adds passes shows in properties.csv. A pass is one top-level
call of a protocol model (a ``HookedRootModule`` not called from inside another one): a call of
the checked model counts in ``model_passes``; a call of any other protocol model during the row is
one of its golden copies (the float64 twin, the float32 fallback, the determinism probe's copies:
properties/precision.py) and counts in ``twin_passes``. Counted through torch's global module
hooks, so a check cannot bypass the count by calling the model its own way. A call that runs the
model's network without its protocol ``forward`` (a cached decoding step through
``forward_with_cache``: the kv_cache property) is one a check declares with :func:`one_pass`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from transformer_lens import HookedRootModule

COST_COLUMNS = ["model_passes", "twin_passes", "seconds"]


@dataclass
class Cost:
    """Passes and wall seconds of one property row (filled when :func:`counting` exits)."""

    model_passes: int = 0
    twin_passes: int = 0
    seconds: float = 0.0


_ACTIVE: ContextVar[tuple[Cost, ...]] = ContextVar("attnlab_cost_counting", default=())


_SETUP: ContextVar[bool] = ContextVar("attnlab_cost_setup", default=False)


@contextmanager
def setup() -> Iterator[None]:
    """Passes inside the block are the model's one-time set-up, not a row's: the golden twin's making
    (properties/precision.py: the determinism probe, the twin's first look) is paid by whichever row comes
    first, so counting it would make a row's cost depend on which rows ran before it."""
    token = _SETUP.set(True)
    try:
        yield
    finally:
        _SETUP.reset(token)


@contextmanager
def one_pass() -> Iterator[None]:
    """The block is one pass of the checked model: counted once, also where the forward hooks do not see it."""
    costs = _ACTIVE.get()
    before = [cost.model_passes for cost in costs]
    try:
        yield
    finally:
        for cost, count in zip(costs, before, strict=True):
            cost.model_passes = max(cost.model_passes, count + 1)


@contextmanager
def counting(model: Any) -> Iterator[Cost]:
    """Count the top-level protocol-model passes inside the block: ``model``'s apart from its copies'."""
    cost = Cost()
    depth = [0]  # protocol models entered and not yet left: an adapter may wrap another HookedRootModule

    def enter(module: nn.Module, args: Any) -> None:
        if not isinstance(module, HookedRootModule) or _SETUP.get():
            return
        if depth[0] == 0:
            if module is model:
                cost.model_passes += 1
            else:
                cost.twin_passes += 1
        depth[0] += 1

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, HookedRootModule) and not _SETUP.get():
            depth[0] = max(0, depth[0] - 1)

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave, always_call=True)]
    token = _ACTIVE.set((*_ACTIVE.get(), cost))
    start = time.perf_counter()
    try:
        yield cost
    finally:
        cost.seconds = time.perf_counter() - start
        _ACTIVE.reset(token)
        for handle in handles:
            handle.remove()
