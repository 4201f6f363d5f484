"""``adapt(model)``: the one entry that turns what a user hands over into a protocol model.

A Hugging Face ``PreTrainedModel`` gets an :class:`~harness.adapters.hf.HFAdapter` (an encoder-decoder
its subclass :class:`~harness.adapters.hf_seq2seq.HFSeq2SeqAdapter`; the same one on every call, so hooks
are not installed twice), a TransformerLens ``TransformerBridge`` a
:class:`~harness.adapters.bridge.BridgeAdapter`, and a model that already follows the protocol
(or anything else, which the entry point's protocol check then refuses) is returned as it is.
"""

from __future__ import annotations

from typing import Any

from harness.adapters.bridge import BridgeAdapter, is_bridge
from harness.adapters.hf import HFAdapter, _is_pretrained
from harness.adapters.hf_seq2seq import HFSeq2SeqAdapter, is_hf_encoder_decoder


def needs_adapter(model: Any) -> bool:
    """Whether :func:`adapt` puts ``model`` behind an adapter (a ``PreTrainedModel`` or a bridge)."""
    return _is_pretrained(model) or is_bridge(model)


def adapt(model: Any) -> Any:
    """``model`` behind the model protocol: an adapter for a ``PreTrainedModel`` or a bridge, anything else unchanged.

    The entry points (``properties.check_model``, the probes) call this, then run their own
    protocol check, so a model that is neither keeps the checker's error listing what it lacks.
    """
    if _is_pretrained(model):
        return (HFSeq2SeqAdapter if is_hf_encoder_decoder(model) else HFAdapter).of(model)
    if is_bridge(model):
        return BridgeAdapter(model)
    return model


def describe(model: Any) -> str:
    """Which adapter a (wrapped) model is behind, as results record it in ``attrs["adapter"]``.

    ``"HFAdapter(llama, attention_interface)"`` (architecture and route; ``"HFSeq2SeqAdapter(bart, ...)"``),
    ``"BridgeAdapter"``, ``"FunctionModel"`` (a plain module or function given with a cfg) or ``"protocol model"``.
    """
    if isinstance(model, HFAdapter):
        return f"{type(model).__name__}({model.cfg.arch}, {model.route})"
    if type(model).__module__.startswith("harness.adapters."):  # BridgeAdapter, FunctionModel: by class name
        return type(model).__name__
    return "protocol model"
