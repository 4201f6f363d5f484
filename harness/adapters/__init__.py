"""The model protocol (docs/architecture.md) and the adapters that put other people's models behind it.

:mod:`properties` and :mod:`probes` reach a model only through this package: :func:`check_protocol`
is the one checker both call, and :class:`BridgeAdapter` wraps a TransformerLens ``TransformerBridge``.
"""

from harness.adapters.bridge import BridgeAdapter
from harness.adapters.design_facts import AdapterConfig, DesignFacts
from harness.adapters.entry import adapt
from harness.adapters.function import FunctionModel
from harness.adapters.hf import HFAdapter
from harness.adapters.protocol import (
    AnyModel,
    ModelCfg,
    ProtocolModel,
    UnsupportedInput,
    check_protocol,
    observed_hooks,
    required_hooks,
)

__all__ = ["AdapterConfig", "AnyModel", "BridgeAdapter", "DesignFacts", "FunctionModel", "HFAdapter",
           "ModelCfg", "ProtocolModel", "UnsupportedInput",
           "check_protocol", "observed_hooks", "required_hooks", "adapt"]
