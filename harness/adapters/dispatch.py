"""Models that accelerate dispatched over devices (``device_map``, CPU or disk offload) behind the protocol.

A Hugging Face model loaded with ``from_pretrained(..., device_map=..., offload_folder=...)`` or given to
``accelerate.dispatch_model`` keeps its layers where the map puts them; an offloaded layer's weights are
``meta`` tensors that accelerate's hooks load in for each forward pass. The adapter works on it unchanged:
its hooks sit on the model's modules, accelerate's ride inside each module's call, so hook points fire
and the logits are the model's own. Two things differ, and this module owns both:

- where inputs go: the first parameter may be a ``meta`` placeholder, so the input device is the one
  accelerate runs the model on (:func:`input_device`: the first accelerator in ``hf_device_map``, else
  the CPU), and accelerate moves inputs and outputs from there;
- copies: such a model is dispatched because it does not fit on one device, so attnlab never copies it
  (``placed()`` with a change, the float64 golden twin): :func:`refuse_copy` says why. Its calibrated
  property rows are judged by the declared float32 tolerance, and their reason says so
  (:data:`NO_TWIN`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from harness.errors import AttnlabError

OFFLOADED = ("cpu", "disk")  # device_map values that are not where accelerate runs a dispatched model
NO_TWIN = ("no float64 twin: the model is dispatched by accelerate over devices (hf_device_map), which attnlab "
           "does not copy; judged by the declared float32 tolerance")


def device_map(model: Any) -> Optional[dict[str, Any]]:
    """accelerate's ``hf_device_map`` of ``model`` (a PreTrainedModel, or one in an adapter); None if not dispatched.

    transformers sets ``hf_device_map`` on a model loaded with a ``device_map`` and accelerate's
    ``dispatch_model`` sets it too; a model loaded whole on one device has none.
    """
    bridged = getattr(getattr(model, "bridge", None), "original_model", None)
    for inner in (model, getattr(model, "hf_model", None), bridged):
        mapping = getattr(inner, "__dict__", {}).get("hf_device_map")
        if isinstance(mapping, dict) and mapping:
            return mapping
    return None


def is_dispatched(model: Any) -> bool:
    """Whether accelerate placed ``model``'s parts by a device map (several devices, or CPU/disk offload)."""
    return device_map(model) is not None


def input_device(model: Any) -> Optional[torch.device]:
    """The device a dispatched model takes its inputs on (None: not dispatched, ask its parameters).

    accelerate runs a dispatched model on the first accelerator of its map (``main_device``) and
    offloads the ``cpu``/``disk`` parts to it layer by layer; with no accelerator in the map it runs on the CPU.
    """
    mapping = device_map(model)
    if mapping is None:
        return None
    for place in mapping.values():
        if str(place) not in OFFLOADED:
            return torch.device(f"cuda:{place}" if isinstance(place, int) else place)
    return torch.device("cpu")


def refuse_copy(model: Any, what: str) -> AttnlabError:
    """The error for copying a dispatched model (``what``: e.g. "dtype='float64'"), naming its map."""
    places = sorted({str(p) for p in (device_map(model) or {}).values()})
    return AttnlabError(f"{what} needs a copy of the model, and this model is dispatched by accelerate over {places} "
                        f"(hf_device_map): attnlab does not copy a model that does not fit on one device; expected "
                        f"it loaded at the dtype, device and attn_implementation wanted (from_pretrained(..., "
                        f"dtype=..., device_map=..., attn_implementation=...)) and those options left unset")
