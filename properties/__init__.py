"""Model-agnostic invariant checks for attention models.

Every check talks to a model only through the model protocol (docs/architecture.md): ``cfg``
fields, ``forward(tokens, attention_mask=None, position_offset=0)`` and TransformerLens hook
names. ``check_model(model)`` runs them all and returns a table, one row per property;
each property is also a function returning a :class:`PropertyResult`. Hugging Face GPT-2 or
Llama models go through TransformerLens's ``TransformerBridge`` and :class:`BridgeAdapter`.

    >>> import properties
    >>> properties.check_model(model)                      # doctest: +SKIP
    >>> properties.check_model(properties.BridgeAdapter.from_hf(hf_model))   # doctest: +SKIP
"""

from harness.adapters.bridge import BridgeAdapter, ProtocolConfig
from harness.adapters.function import FunctionModel
from harness.adapters.protocol import check_protocol, observed_hooks, required_hooks
from properties.checks import (
    attention_scale,
    batch_independence,
    causal_outputs,
    causal_pattern,
    kv_cache,
    padding_outputs,
    padding_pattern,
    pattern_distribution,
    permutation_equivariance,
    relative_position,
    rotary_formula,
    rotary_norm,
    sinusoidal_formula,
    sinusoidal_shift,
)
from properties.saturation import loglog_slope, saturation_sweep
from properties.search import STATUSES, PropertyResult
from properties.suite import PROPERTIES, check_model

__all__ = [
    "check_model", "check_protocol", "observed_hooks", "required_hooks", "PROPERTIES", "PropertyResult", "STATUSES",
    "FunctionModel",
    "BridgeAdapter", "ProtocolConfig", "saturation_sweep", "loglog_slope",
    "attention_scale", "batch_independence", "causal_outputs", "causal_pattern", "kv_cache",
    "padding_outputs", "padding_pattern", "pattern_distribution", "permutation_equivariance",
    "relative_position", "rotary_formula", "rotary_norm", "sinusoidal_formula", "sinusoidal_shift",
]
