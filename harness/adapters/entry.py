"""``wrap(model)``: the one entry that turns what a user hands over into a protocol model.

A Hugging Face ``PreTrainedModel`` gets an :class:`~harness.adapters.hf.HFAdapter` (the same one on
every call, so hooks are not installed twice), a TransformerLens ``TransformerBridge`` a
:class:`~harness.adapters.bridge.BridgeAdapter`, and a model that already follows the protocol
(a ``HookedRootModule`` with a ``cfg``) is returned as it is.
"""

from __future__ import annotations

from typing import Any

from transformer_lens import HookedRootModule

from harness.adapters.bridge import BridgeAdapter, is_bridge
from harness.adapters.hf import HFAdapter, _is_pretrained


def wrap(model: Any) -> Any:
    """``model`` behind the model protocol (see the module docstring); TypeError for anything else."""
    if _is_pretrained(model):
        return HFAdapter.of(model)
    if is_bridge(model):
        return BridgeAdapter(model)
    if isinstance(model, HookedRootModule) and hasattr(model, "cfg"):
        return model
    raise TypeError(f"cannot wrap a {type(model).__name__}: expected a protocol model (HookedRootModule with cfg), "
                    f"a transformers PreTrainedModel or a TransformerLens TransformerBridge")


def needs_wrapping(model: Any) -> bool:
    """Whether :func:`wrap` would put ``model`` behind an adapter (a ``PreTrainedModel`` or a bridge)."""
    return _is_pretrained(model) or is_bridge(model)


def adapt(model: Any) -> Any:
    """``wrap(model)`` for a ``PreTrainedModel`` or a bridge; anything else unchanged.

    The entry points (``properties.check_model``, the probes) call this, then run their own
    protocol check, so a model that is neither keeps the checker's error listing what it lacks.
    """
    return wrap(model) if needs_wrapping(model) else model


def describe(model: Any) -> str:
    """Which adapter a (wrapped) model is behind, as results record it in ``attrs["adapter"]``.

    ``"HFAdapter(llama, attention_interface)"`` (architecture and route), ``"BridgeAdapter"``,
    ``"FunctionModel"`` (a plain module or function given with a cfg) or ``"protocol model"``.
    """
    if isinstance(model, HFAdapter):
        return f"HFAdapter({model.cfg.arch}, {model.route})"
    if type(model).__module__.startswith("harness.adapters."):  # BridgeAdapter, FunctionModel: by class name
        return type(model).__name__
    return "protocol model"
