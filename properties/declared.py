"""The design a model's config declares, as the design oracle computes it (``harness.oracle``).

The checks compare a model with these values, not with the module's own attributes: a wrong factor kept on
the module (a port's ``scaling``) is otherwise "declared" by the very bug it should expose. A model with no
config behind it (attnlab's own Transformer, a TransformerLens model, a user's function) has no declaration
for the oracle to read: every fact is then unknown, and a check falls back to the ``cfg`` the model declares
(``properties.design``) or is n/a, saying so.
"""

from __future__ import annotations

from typing import Any

from harness import oracle
from harness.oracle import Fact

NO_CONFIG = "the model has no Hugging Face config for the design oracle to read"


def config_of(cfg: Any) -> Any:
    return getattr(cfg, "source_config", None)


def layer_id(cfg: Any, layer: int) -> int:
    """The model's own index of checked layer ``layer`` (a hybrid stack checks only its attention layers)."""
    ids = getattr(cfg, "layer_ids", None)
    return int(ids[layer]) if ids else layer


def scale(cfg: Any, layer: int) -> Fact:
    config = config_of(cfg)
    return Fact(unknown=NO_CONFIG) if config is None else oracle.scale(config, layer_id(cfg, layer))


def window(cfg: Any, layer: int) -> Fact:
    config = config_of(cfg)
    return Fact(unknown=NO_CONFIG) if config is None else oracle.window(config, layer_id(cfg, layer))


def rotation(cfg: Any, layer: int, seq_len: int) -> Fact:
    config = config_of(cfg)
    return Fact(unknown=NO_CONFIG) if config is None else oracle.rotary(config, layer_id(cfg, layer), seq_len)
