"""The model protocol (docs/architecture.md) and the adapters that put other people's models behind it.

:mod:`properties` and :mod:`probes` reach a model only through this package: :func:`check_protocol`
is the one checker both call, and :class:`BridgeAdapter` wraps a TransformerLens ``TransformerBridge``;
:func:`placed` puts a model at the user's dtype, device and attention kernel (a copy, never the caller's model cast).
"""

from harness.adapters.bridge import BridgeAdapter
from harness.adapters.design_facts import AdapterConfig, DesignFacts
from harness.adapters.entry import adapt
from harness.adapters.function import FunctionModel
from harness.adapters.hf import HFAdapter
from harness.adapters.hf_seq2seq import HFSeq2SeqAdapter
from harness.adapters.placement import DTYPE_NAMES, check_placement, placed, placement_of
from harness.adapters.protocol import (
    AnyModel,
    ModelCfg,
    ProtocolModel,
    UnsupportedInput,
    check_protocol,
    observed_hooks,
    required_hooks,
)

__all__ = ["DTYPE_NAMES", "AdapterConfig", "AnyModel", "BridgeAdapter", "DesignFacts", "FunctionModel", "HFAdapter",
           "HFSeq2SeqAdapter", "ModelCfg", "ProtocolModel", "UnsupportedInput",
           "check_placement", "check_protocol", "observed_hooks", "placed", "placement_of", "required_hooks", "adapt"]
