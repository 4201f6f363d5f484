"""Model-agnostic invariant checks for attention models.

Every check talks to a model only through the model protocol (docs/architecture.md): ``cfg``
fields, ``forward(tokens, attention_mask=None, position_offset=0)`` and TransformerLens hook
names. ``check_model(model)`` runs them all and returns a table, one row per property;
each property is also a function returning a :class:`PropertyResult` (``properties.causal_pattern``,
...: every registered property, docs/properties.md lists them). Hugging Face GPT-2 or
Llama models go through TransformerLens's ``TransformerBridge`` and :class:`BridgeAdapter`.

    >>> import properties
    >>> properties.check_model(model)                      # doctest: +SKIP
    >>> properties.check_model(properties.BridgeAdapter.from_hf(hf_model))   # doctest: +SKIP
"""

from typing import Any

from harness.adapters.bridge import BridgeAdapter
from harness.adapters.design_facts import AdapterConfig
from harness.adapters.function import FunctionModel
from harness.adapters.protocol import check_protocol, observed_hooks, required_hooks
from properties import checks as checks  # imported for its effect: every property registers itself
from properties import registry
from properties.saturation import loglog_slope, saturation_sweep
from properties.search import STATUSES, PropertyResult
from properties.suite import PROPERTIES, check_model

# The checks are exported from the registry (importing ``checks`` registered every one of them); the
# attributes are looked up there, so a property registered later is ``properties.<name>`` at once.
__all__ = ["check_model", "check_protocol", "observed_hooks", "required_hooks", "PROPERTIES", "PropertyResult",
           "STATUSES", "FunctionModel", "BridgeAdapter", "AdapterConfig", "saturation_sweep", "loglog_slope",
           *registry.names()]


def __getattr__(name: str) -> Any:
    return registry.check(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *registry.names()})
