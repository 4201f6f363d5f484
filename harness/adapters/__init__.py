"""The model protocol (shared/DESIGN.md) and the adapters that put other people's models behind it.

:mod:`properties` and :mod:`probes` reach a model only through this package: :func:`check_protocol`
is the one checker both call, and :class:`BridgeAdapter` wraps a TransformerLens ``TransformerBridge``.
"""

from harness.adapters.bridge import BridgeAdapter, ProtocolConfig
from harness.adapters.protocol import check_protocol, required_hooks

__all__ = ["BridgeAdapter", "ProtocolConfig", "check_protocol", "required_hooks"]
