"""``placed(model, dtype=, device=, attn_implementation=)``: a model at the precision and place the user runs it.

The user checks what they run: the property suite, the probes and the CLI take a dtype, a
device and (for Hugging Face models) an attention kernel, and run the model there. Whenever anything
changes, the result is a COPY: ``Module.to(dtype)`` casts in place, and float32 -> bfloat16 -> float32
leaves bfloat16-rounded weights behind, so the caller's model is never cast.

Dtype names are :data:`DTYPE_NAMES`; ``"auto"`` (or ``None``) keeps the model's own dtype. A name
that is unknown, or a dtype the device cannot run (a float16 matmul on a CPU build without it), is
one :class:`~harness.errors.AttnlabError` naming it, raised by :func:`check_placement` before any
model is touched, so the CLI can refuse it before loading a checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Optional

import torch
from torch import nn

from harness.adapters.bridge import BridgeAdapter, is_bridge
from harness.adapters.dispatch import is_dispatched, refuse_copy
from harness.adapters.entry import adapt
from harness.adapters.hf import HFAdapter, _is_pretrained
from harness.adapters.hf_attention import base_kernel
from harness.adapters.protocol import model_device
from harness.errors import AttnlabError
from harness.model.transformer import TORCH_DTYPES, Transformer

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16", "float64")
# The kernel name our own Transformer runs (scaled_dot_product_attention; hooks on scores or pattern
# switch a layer to the explicit path on their own), so a request for it is no change.
OWN_KERNEL = "sdpa"
UNDECLARED = "not declared"  # the kernel of a model that does not name one (a user's own module)
# Hook dictionaries of nn.Module an adapter's handles may sit in (torch keeps kwargs/always-call flags apart).
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


def torch_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    """The torch dtype for a name in :data:`DTYPE_NAMES`; None for ``"auto"``/None (the model's own)."""
    if name is None or name == "auto":
        return None
    if not isinstance(name, str) or name not in TORCH_DTYPES:
        raise AttnlabError(f"dtype={name!r} is not a dtype attnlab runs; expected one of {list(DTYPE_NAMES)}")
    return TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (what results and model cards record)."""
    return str(dtype).removeprefix("torch.")


def check_device(device: Any) -> torch.device:
    """``device`` as a torch device this machine has; one AttnlabError naming it otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise AttnlabError(f"device={device!r} is not a torch device ({exc}); expected e.g. 'cpu' or 'cuda:0'") \
            from None
    try:
        torch.zeros(1, device=dev)
    except (RuntimeError, AssertionError) as exc:  # torch asserts on 'cuda' in a CPU-only build
        cuda = f" or cuda:0..{torch.cuda.device_count() - 1}" if torch.cuda.is_available() else ""
        raise AttnlabError(f"device={device!r} is not available on this machine ({exc}); expected 'cpu'{cuda}") \
            from None
    return dev


@functools.cache
def _runs(dtype: torch.dtype, device: str) -> Optional[str]:
    """Why ``dtype`` cannot run a matmul and a softmax on ``device`` (None if it can): the ops every model needs."""
    try:
        a = torch.ones(4, 4, dtype=dtype, device=device)
        torch.softmax(a @ a, dim=-1).sum().item()
    except (RuntimeError, NotImplementedError) as exc:
        return str(exc).splitlines()[0]
    return None


def check_placement(dtype: Optional[str] = None, device: Any = None) -> tuple[Optional[torch.dtype],
                                                                               Optional[torch.device]]:
    """Validate a dtype name and a device before any model is loaded: ``(torch dtype or None, device or None)``.

    A dtype the device cannot run is refused here, naming both (e.g. float16 matmul on a CPU that lacks it).
    """
    dt = torch_dtype(dtype)
    dev = None if device is None else check_device(device)
    if dt is not None:
        reason = _runs(dt, str(dev or "cpu"))
        if reason is not None:
            raise AttnlabError(f"dtype={dtype!r} cannot run on device {str(dev or 'cpu')!r} ({reason}); expected a "
                               f"dtype this device runs, e.g. 'float32'")
    return dt, dev


def _dtype_of(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def kernel_of(model: Any) -> str:
    """The attention implementation ``model`` runs: the HF config's (behind attnlab's observer), ``"sdpa"``
    for our Transformer, :data:`UNDECLARED` for a model that does not say (a user's own module)."""
    hf = _hf_inside(model)
    if hf is None and isinstance(model, BridgeAdapter):
        hf = getattr(model.bridge, "original_model", None)
    if hf is not None and hasattr(hf, "config"):
        return base_kernel(getattr(hf.config, "_attn_implementation", None) or "eager")
    return OWN_KERNEL if isinstance(model, Transformer) else UNDECLARED


def placement_of(model: Any) -> dict[str, str]:
    """What ran: ``{"dtype", "device", "attn_implementation"}``, as results record it in ``attrs``."""
    return {"dtype": dtype_name(_dtype_of(model)), "device": str(model_device(model)),
            "attn_implementation": kernel_of(model)}


def _hf_inside(model: Any) -> Any:
    if isinstance(model, HFAdapter):
        return model.hf_model
    if _is_pretrained(model):
        return model
    return None


def _deepcopy(module: nn.Module, memo: dict[int, Any], dtype: Optional[torch.dtype] = None,
              device: Optional[torch.device] = None) -> Any:
    """``copy.deepcopy`` of a module holding activations cached by its last forward (a bridge's attention
    keeps ``_pattern``): torch cannot deep-copy a non-leaf tensor, so the copy gets it detached.

    With ``dtype``/``device`` each parameter and buffer is copied straight to where ``Module.to(device, dtype)``
    would move it (the dtype for floating-point tensors only, as ``Module.to`` casts): the weights are not first
    copied at their own dtype and then cast, which held both copies at once (Gemma-3-270m's float64 twin: 1 GB
    of float32 copy beside the 2 GB it was cast to). Tied weights stay tied (one memo entry per tensor).
    """
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach()
    if dtype is not None or device is not None:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) in memo:
                continue
            moved = tensor.detach().to(device=device or tensor.device,
                                       dtype=dtype if dtype is not None and tensor.is_floating_point() else None,
                                       copy=True)
            memo[id(tensor)] = nn.Parameter(moved, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else moved
    return copy.deepcopy(module, memo)


def _copy_hf(hf_model: Any, dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> Any:
    """A deep copy of a Hugging Face model without the hooks attnlab's adapter put on the original.

    The adapter's hooks close over the original adapter's hook points; they are dropped by handle id
    (a user's own hooks keep theirs), and the copy gets an adapter of its own.
    """
    adapter = hf_model.__dict__.get("_attnlab_adapter")
    memo: dict[int, Any] = {} if adapter is None else {id(adapter): adapter}  # never copy the old adapter
    twin = _deepcopy(hf_model, memo, dtype, device)
    twin.__dict__.pop("_attnlab_adapter", None)
    ids = {handle.id for handle in getattr(adapter, "_handles", [])}
    if ids:
        for module in twin.modules():
            for name in _HOOK_DICTS:
                hooks = getattr(module, name, None)
                if isinstance(hooks, dict):
                    for key in ids & set(hooks):
                        del hooks[key]
    return twin


def _set_kernel(hf_model: Any, name: str) -> None:
    try:
        hf_model.set_attn_implementation(name)
    except (ValueError, ImportError, RuntimeError) as exc:
        raise AttnlabError(f"attn_implementation={name!r} cannot run on {type(hf_model).__name__} "
                           f"({str(exc).splitlines()[0]}); expected e.g. 'sdpa' or 'eager'") from None


def _experts_for(hf_model: Any, dt: Optional[torch.dtype]) -> None:
    """A float64 copy of a mixture-of-experts model runs its experts through transformers' eager loop.

    transformers' default experts kernel, ``grouped_mm`` (transformers/integrations/moe.py), calls
    ``torch.nn.functional.grouped_mm``, which takes float32/bfloat16/float16 only: a float64 copy raised
    "Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double" (census: beam, deepseek_v4), so
    such a model lost its float64 twin. The eager loop computes the same sum over the routed experts' FFNs.
    """
    config = getattr(hf_model, "config", None)
    if dt != torch.float64 or getattr(config, "_experts_implementation", None) in (None, "eager"):
        return
    if hasattr(hf_model, "set_experts_implementation"):
        hf_model.set_experts_implementation("eager")


def placed(model: Any, *, dtype: Optional[str] = None, device: Any = None,
           attn_implementation: Optional[str] = None) -> Any:
    """``model`` behind the protocol at ``dtype``/``device``/``attn_implementation``; a copy when anything changes.

    - our Transformer (or any protocol model): deep-copied, then moved; its kernel cannot change;
    - a ``PreTrainedModel`` or an ``HFAdapter``: the Hugging Face model deep-copied (without the
      adapter's hooks), moved, pointed at the kernel, and adapted anew;
    - a ``BridgeAdapter`` (or a bridge): the adapter deep-copied and moved; its kernel cannot change.

    With nothing to change this is :func:`harness.adapters.adapt` (the model itself, adapted).
    A dtype change is ``Module.to(dtype)`` on the copy, buffers included: a Hugging Face model's rotary
    ``inv_freq`` is rounded to the dtype as ``model.to(torch.bfloat16)`` rounds it (transformers #25681;
    the ``rotary_precision`` property reports it). ``from_pretrained(..., dtype=...)`` keeps that buffer
    in float32: to check a model as it is loaded so, load it so and leave ``dtype`` unset (``attnlab
    check --hf --dtype`` loads it that way).
    """
    dt, dev = check_placement(dtype, device)
    model = adapt(model)
    if not isinstance(model, nn.Module):
        return model  # not a module: the entry point's protocol check refuses it with the full list
    dt = None if dt is None or dt == _dtype_of(model) else dt
    dev = None if dev is None or dev == model_device(model) else dev
    kernel = None if attn_implementation is None or attn_implementation == kernel_of(model) else attn_implementation
    if dt is None and dev is None and kernel is None:
        return model
    if is_dispatched(model):  # spread over devices because it fits on none: never copied (harness/adapters/dispatch.py)
        asked = {"dtype": dtype, "device": device, "attn_implementation": attn_implementation}
        raise refuse_copy(model, ", ".join(f"{k}={v!r}" for k, v in asked.items() if v is not None))
    if isinstance(model, HFAdapter):
        twin = _copy_hf(model.hf_model, dt, dev)
        twin.to(device=dev, dtype=dt)  # what the copy did not reach (a tensor attribute outside the state)
        _experts_for(twin, dt)
        if kernel is not None:
            _set_kernel(twin, kernel)
        return type(model)(twin)  # HFAdapter or its encoder-decoder subclass
    if kernel is not None:
        label = "BridgeAdapter" if isinstance(model, BridgeAdapter) or is_bridge(model) else type(model).__name__
        raise AttnlabError(f"attn_implementation={attn_implementation!r} cannot be chosen for {label}: it runs "
                           f"{kernel_of(model)!r}; expected attn_implementation=None (a Hugging Face model's kernel "
                           f"is the one choice)")
    twin = _deepcopy(model, {}, dt, dev)
    twin.to(device=dev, dtype=dt)
    if isinstance(twin, BridgeAdapter):
        _experts_for(getattr(twin.bridge, "original_model", None), dt)  # the bridge runs the HF model's experts
    if isinstance(twin, BridgeAdapter) and dev is not None:
        twin._cfg = dataclasses.replace(twin._cfg, device=str(dev))  # TransformerLens reads cfg.device
    config = getattr(twin, "config", None)
    if dt is not None and dataclasses.is_dataclass(config) and not isinstance(config, type) \
            and hasattr(config, "dtype"):
        twin.config = dataclasses.replace(config, dtype=dtype_name(dt))  # our ModelConfig names its dtype
    return twin
