"""Whether a hook point has anything attached: the one test the model and the adapters share.

An idle hook point is skipped without a module call (``nn.Module.__call__`` is not free), so an
unhooked forward costs what a plain PyTorch model costs.
"""

from __future__ import annotations

from torch import Tensor
from transformer_lens.hook_points import HookPoint


def active(hp: HookPoint) -> bool:
    """Whether a hook point has any forward or backward hook attached."""
    return bool(hp._forward_hooks) or bool(hp._backward_hooks)


def hook(hp: HookPoint, x: Tensor) -> Tensor:
    """Run ``x`` through ``hp`` only when something is attached."""
    return hp(x) if active(hp) else x
