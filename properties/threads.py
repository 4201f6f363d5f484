"""Threads per op while the suite runs: one for the many small ops of a check's short passes, all of the caller's
for the few large matrix products.

A check's passes are a few sequences of <= 24 tokens, whose ops are too small to gain from a second thread and,
on a loaded machine, lose to it: each op's parallel region waits for a descheduled thread (properties/suite.py,
THREADS). Two kinds of op are large even there: the unembedding of a large vocabulary (Gemma-3's 262k x 640: 10.7
GFLOP for 32 tokens) and every layer of a row past a long window (515 tokens of Gemma-3's 640 x 2048 MLP: 1.35
GFLOP). Measured on this project's 2-core AVX2 machine, quiet, one thread against two: 0.34 s against 0.24 s
(float32) and 0.48 s against 0.24 s (float64) for that unembedding, and 18.5 ms against 14.4 ms for that MLP
matrix; Gemma-3-270M's check_model at float32 (eager attention) took 63 s on one thread, 49 s as below, 47 s
with every op on two. A parallel region of milliseconds is not held up by a thread the scheduler takes away for a
moment the way thousands of regions of microseconds are.

So, within :func:`wide_linears`, an ``nn.Linear`` whose product is at least :data:`WIDE_FLOPS` runs on the wide
thread count and every other op on the narrow one. The switch is a forward pre-hook and a forward hook registered
for every module (``torch.nn.modules.module.register_module_forward_pre_hook``), so the model, its float64 twin
and any copy of it are covered without knowing their modules; ``torch.set_num_threads`` costs ~0.5 us a pair. A
pass being traced by ``torch.compile`` is left alone (the hooks do nothing there).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

# 2 x rows x in x out: at least ~5 ms of one core of a 2-core AVX2 machine in float32 (a 128-row 640 x 2048 product
# is 0.34 GFLOP, 4.8 ms on one thread, 2.7 ms on two); a short pass's layers (32 rows: 84 MFLOP) stay narrow
WIDE_FLOPS = 2**28


def flops(module: nn.Linear, x: Any) -> int:
    """The multiply-adds (x2) of ``module`` applied to ``x``: 0 when ``x`` is not a tensor."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return 0
    rows = x.numel() // max(1, int(x.shape[-1]))
    return 2 * rows * module.in_features * module.out_features


@contextmanager
def wide_linears(narrow: int, wide: int) -> Iterator[None]:
    """Within the block, a linear op of at least :data:`WIDE_FLOPS` runs on ``wide`` threads, the rest on ``narrow``
    (the block is entered and left on ``narrow``). Nothing is registered when ``wide <= narrow``."""
    if wide <= narrow:
        yield
        return

    def before(module: nn.Module, args: tuple[Any, ...]) -> None:
        if not isinstance(module, nn.Linear) or torch.compiler.is_compiling():
            return
        if args and flops(module, args[0]) >= WIDE_FLOPS:
            torch.set_num_threads(wide)

    def after(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(module, nn.Linear) and not torch.compiler.is_compiling() and torch.get_num_threads() != narrow:
            torch.set_num_threads(narrow)

    torch.set_num_threads(narrow)
    handles = [register_module_forward_pre_hook(before), register_module_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        torch.set_num_threads(narrow)  # a pass that raised inside a wide op left it wide
