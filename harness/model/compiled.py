"""``torch.compile`` that does not silently skip hooks.

A compiled graph is traced once; a hook added to a HookPoint after the first compiled call is not
part of it and never fires (torch.compile guards on module state only where it was read). So
:class:`HookAwareCompiled` runs the compiled graph only while no hook point has a hook, and the
eager model otherwise: a hook attached at any time fires, and idle hooks keep the compiled speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from harness.errors import AttnlabTypeError
from harness.model.hooks import active

__all__ = ["HookAwareCompiled"]


class HookAwareCompiled(nn.Module):
    """``torch.compile(model)`` while no hook point of ``model`` has a hook; ``model`` itself otherwise.

    Checking every hook point costs about a microsecond per hundred points, once per call.
    """

    _compiled: Callable[..., Any]  # set with object.__setattr__, outside the module tree (see __init__)

    def __init__(self, model: nn.Module, **compile_kwargs: Any):
        super().__init__()
        hook_dict = getattr(model, "hook_dict", None)
        if not isinstance(hook_dict, dict):
            raise AttnlabTypeError("HookAwareCompiled expects a HookedRootModule (with hook_dict), "
                                   f"got {type(model).__name__}")
        self.model = model
        self._points = list(hook_dict.values())
        # Kept out of the module tree: the compiled wrapper shares model's parameters, and registering
        # it would list every parameter twice in state_dict().
        object.__setattr__(self, "_compiled", torch.compile(model, **compile_kwargs))

    def hooked(self) -> bool:
        return any(active(hp) for hp in self._points)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.hooked():
            return self.model(*args, **kwargs)
        return self._compiled(*args, **kwargs)
