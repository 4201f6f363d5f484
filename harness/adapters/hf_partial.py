"""Partial runs of a Hugging Face model behind HFAdapter: TransformerLens's ``stop_at_layer`` / ``start_at_layer``.

``forward(tokens, stop_at_layer=l)`` returns the residual stream entering block l (the input of the model's
layer ``layer_ids[l]``; for l = n_layers, the output of the last block's layer); ``forward(resid,
start_at_layer=l)`` takes that residual in place of the tokens and runs the rest. Together they let the probes
compute the residual before layer l once and run only layers l.. for every head mask of layer l (prefix
reuse, probes/gates.py), as they do on attnlab's own Transformer.

The model's own forward still runs from the top, so its masks, position ids and rotary tables are built as it
builds them: the layers before the start are swapped for a pass-through (their forward returns its input in the
structure the layer returns: a tensor, or a tuple led by it), and the first layer that runs gets the residual as
its ``hidden_states``; a stop raises out of the model at the layer it names and hands back what it caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import torch
from torch import Tensor, nn

from harness.errors import AttnlabError
from harness.model.inputs import check_partial_run


class _Stop(Exception):  # noqa: N818 - a control-flow signal, not an error
    def __init__(self, residual: Tensor):
        super().__init__("stop_at_layer reached")
        self.residual = residual


def _hidden(args: tuple, kwargs: dict) -> Tensor:
    """The hidden states a decoder layer was called with: its first positional argument or ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


def _replace(args: tuple, kwargs: dict, value: Tensor) -> tuple[tuple, dict]:
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def _first(output: Any) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


@contextmanager
def output_shapes(stack: nn.ModuleList) -> Iterator[list[Optional[int]]]:
    """What each layer returns on the passes inside the block (None: a tensor; n: a tuple of n), for the
    pass-through that stands in for a skipped layer."""
    seen: list[Optional[int]] = [None] * len(stack)

    def record(i: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            seen[i] = len(output) if isinstance(output, (tuple, list)) else None
        return hook

    handles = [layer.register_forward_hook(record(i)) for i, layer in enumerate(stack)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def partial_run(stack: nn.ModuleList, layer_ids: list[int], shapes: list[Optional[int]],
                start: Optional[int], stop: Optional[int], residual: Optional[Tensor]) -> Iterator[list[Tensor]]:
    """Within the block, the model's forward starts at block ``start`` from ``residual`` and stops at ``stop``.

    Yields a list that, once the model has raised :class:`_Stop` (caught here, so the block ends quietly), holds
    the residual caught at the stop.
    """
    n = len(layer_ids)
    handles: list[Any] = []
    skipped: list[tuple[nn.Module, Any]] = []  # (layer, its own instance forward: accelerate's wrapper, or None)
    got: list[Tensor] = []
    try:
        if start is not None:
            # the first model layer that runs: block start's, or (start = n) the one after the last block's
            first = layer_ids[start] if start < n else layer_ids[-1] + 1
            last_hands_over = first == len(stack)  # no layer left to run: the last skipped one returns the residual
            for i in range(first):
                layer = stack[i]

                def passthrough(*args: Any, _width: Any = shapes[i], _out: bool = last_hands_over and i == first - 1,
                                **kwargs: Any) -> Any:
                    x = _hidden(args, kwargs)
                    if _out:
                        x = residual.to(x.dtype)  # type: ignore[union-attr]
                    return x if _width is None else (x, *([None] * (_width - 1)))
                skipped.append((layer, layer.__dict__.get("forward")))
                layer.forward = passthrough  # an instance attribute, put back as it was below
            if not last_hands_over:
                def inject(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                    return _replace(args, kwargs, residual.to(_hidden(args, kwargs).dtype))  # type: ignore[union-attr]
                handles.append(stack[first].register_forward_pre_hook(inject, with_kwargs=True))
        if stop is not None:
            if stop < n:
                def catch_in(module: nn.Module, args: tuple, kwargs: dict) -> None:
                    raise _Stop(_hidden(args, kwargs))
                handles.append(stack[layer_ids[stop]].register_forward_pre_hook(catch_in, with_kwargs=True))
            else:
                def catch_out(module: nn.Module, args: Any, output: Any) -> None:
                    raise _Stop(_first(output))
                handles.append(stack[layer_ids[-1]].register_forward_hook(catch_out))
        yield got
    except _Stop as stopped:
        got.append(stopped.residual)
    finally:
        for handle in handles:
            handle.remove()
        for layer, own in skipped:
            if own is None:
                del layer.forward  # the class's forward is back
            else:
                layer.forward = own  # e.g. accelerate's dispatching wrapper


def stand_in_tokens(residual: Tensor) -> Tensor:
    """Token ids of the residual's [batch, pos] for the model's own embedding step (its output is replaced)."""
    return torch.zeros(residual.shape[:2], dtype=torch.long, device=residual.device)


def partial_forward(run: Any, tokens: Tensor, *, n_layers: int, d_model: int, stack: nn.ModuleList,
                    layer_ids: list[int], shapes: list[Optional[int]],
                    start: Optional[int], stop: Optional[int]) -> Tensor:
    """``run(tokens)`` (the adapter's plain forward) between ``start`` and ``stop``; see the module docstring."""
    check_partial_run(tokens, start, stop, n_layers, d_model)
    if start is not None and stop is not None and stop < start:
        raise AttnlabError(f"stop_at_layer={stop} is before start_at_layer={start}: expected stop >= start")
    residual = None
    if start is not None:
        if start == stop:
            return tokens
        residual, tokens = tokens, stand_in_tokens(tokens)
    with partial_run(stack, layer_ids, shapes, start, stop, residual) as got:
        logits = run(tokens)
    if stop is None:
        return logits
    if not got:
        raise AttnlabError(f"stop_at_layer={stop}: the model never reached that layer")
    return got[0]
