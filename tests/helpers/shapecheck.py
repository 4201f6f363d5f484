"""The run-time checker behind jaxtyping's import hook under pytest (pyproject ``--jaxtyping-packages``).

jaxtyping instruments every function of ``harness``, ``properties`` and ``probes`` with
``@jaxtyped(typechecker=...)``; this checker hands beartype only the *shape* annotations
(``Float[Tensor, "batch pos d_model"]``, also inside ``Optional``/``tuple``/...). The other
annotations (``int``, ``str``, a config, the model protocol) stay static-only: the project
validates those arguments itself and raises one ValueError/TypeError naming the value
(docs/architecture.md), which a beartype violation would otherwise pre-empt.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, get_args

import torch
from beartype import beartype
from jaxtyping import AbstractArray

F = TypeVar("F", bound=Callable[..., Any])


def has_shape_hint(hint: object) -> bool:
    """Whether ``hint`` is a jaxtyping array type or a typing construct that contains one."""
    if isinstance(hint, type) and issubclass(hint, AbstractArray):
        return True
    return any(has_shape_hint(arg) for arg in get_args(hint))


def shape_checker(fn: F) -> F:
    """beartype over the shape-annotated parameters and return of ``fn``, nothing else.

    ``fn`` is the signature-only function jaxtyping builds from the real one (annotations
    already resolved), so dropping annotations from it leaves the real function untouched.
    """
    annotations = getattr(fn, "__annotations__", None)
    if not annotations:
        return fn
    kept = {name: hint for name, hint in annotations.items() if has_shape_hint(hint)}
    if not kept:
        return fn  # nothing to check: skip beartype's wrapper entirely
    fn.__annotations__ = kept
    checked = beartype(fn)

    @functools.wraps(fn)
    def check(*args: Any, **kwargs: Any) -> Any:
        # torch.compile traces the model with fake tensors; beartype's checks inside a trace
        # desynchronise Dynamo, so compiled calls are checked only by their eager twin.
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        return checked(*args, **kwargs)

    return check  # type: ignore[return-value]
