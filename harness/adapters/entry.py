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
