"""The model: config, positional encodings (pure functions), layers, the Transformer, its KV cache,
generation, the hook-aware compiled wrapper and conversion to and from Hugging Face."""

from harness.model.config import ModelConfig
from harness.model.kv_cache import KVCache
from harness.model.transformer import Transformer

__all__ = ["ModelConfig", "Transformer", "KVCache"]
