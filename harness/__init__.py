"""attnlab's model and everything needed to build it: config, positions, Transformer, conversion."""

from harness.config import ModelConfig
from harness.model import KVCache, Transformer

__all__ = ["ModelConfig", "Transformer", "KVCache"]
