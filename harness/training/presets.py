"""Named presets: a model and a training run that belong together (litgpt's ``Config.from_name``).

``preset("text")`` says what it trains; ``attnlab train --preset text`` and ``attnlab demo --preset
text`` start from it, and any explicit option overrides the preset's value. ``demo_configs()`` is
the ``induction`` preset, kept under its old name. The figures each preset reaches on this
project's machine are in ``docs/presets.md``.

- ``induction``: the demo. 2 attention-only layers x 4 heads learning ``induction`` (Olsson et al.
  2022); two layers are the fewest an induction head needs (a previous-token head in layer 0 whose
  output layer 1's keys read, K-composition, Elhage et al. 2021).
- ``induction-wide``: the same task on 4 layers x 8 heads, so that head redundancy has room to show
  (Michel et al. 2019 find most heads of a wide model removable one at a time).
- ``text``: byte-level language modelling over the default corpus (the standard library's ``.py``
  sources, :mod:`harness.training.text_corpus`), 4 layers x 8 heads, d_model 256, n_ctx 256, rotary
  positions; sized to train in at most 10 minutes on 2 CPU cores.
- ``text-tiny``: ``text`` scaled down for CI (1 layer x 4 heads, d_model 64, 64 bytes, 60 steps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.errors import AttnlabError
from harness.model.config import ModelConfig
from harness.training.config import TrainConfig

# The recipe every preset trains with: AdamW (Loshchilov & Hutter 2019) under a linear warmup and a cosine
# decay, metrics every 10 steps; pinned here so that the figures of docs/presets.md do not move with
# TrainConfig's defaults.
_RECIPE: dict[str, Any] = dict(optimizer="adamw", schedule="warmup_cosine", log_every=10)


def _induction(n_layers: int, d_model: int, n_heads: int, *, steps: int, lr: float) -> tuple[ModelConfig, TrainConfig]:
    """The ``induction`` task (64 tokens over a 64-token vocabulary) on an attention-only model of this
    size; the two induction presets differ in nothing else. Warmup is a tenth of the steps."""
    model = ModelConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, attn_only=True, d_vocab=64, n_ctx=64)
    train = TrainConfig(task="induction", seq_len=64, batch_size=32, steps=steps, lr=lr, warmup=steps // 10,
                        eval_every=50, checkpoint_every=100, **_RECIPE)
    return model, train


def _text() -> tuple[ModelConfig, TrainConfig]:
    model = ModelConfig(n_layers=4, d_model=256, n_heads=8, d_vocab=256, n_ctx=256,
                        positional_embedding_type="rotary")
    train = TrainConfig(task="text", seq_len=256, batch_size=16, steps=240, lr=2e-3, warmup=24, weight_decay=0.1,
                        eval_every=40, eval_batches=4, checkpoint_every=80, **_RECIPE)
    return model, train


def _text_tiny() -> tuple[ModelConfig, TrainConfig]:
    model = ModelConfig(n_layers=1, d_model=64, n_heads=4, d_vocab=256, n_ctx=64,
                        positional_embedding_type="rotary")
    train = TrainConfig(task="text", seq_len=64, batch_size=8, steps=60, lr=3e-3, warmup=10, eval_every=30,
                        eval_batches=2, checkpoint_every=None, task_options={"max_bytes": 200_000}, **_RECIPE)
    return model, train


# name -> builder; builders (not instances) so every call hands out fresh configs
PRESETS: dict[str, Callable[[], tuple[ModelConfig, TrainConfig]]] = {
    "induction": lambda: _induction(2, 64, 4, steps=500, lr=3e-3),
    "induction-wide": lambda: _induction(4, 128, 8, steps=600, lr=2e-3),
    "text": _text,
    "text-tiny": _text_tiny,
}


def preset(name: str) -> tuple[ModelConfig, TrainConfig]:
    """The ``(ModelConfig, TrainConfig)`` of preset ``name``; an unknown name lists the known ones."""
    if not isinstance(name, str) or name not in PRESETS:
        raise AttnlabError(f"preset={name!r} is invalid: unknown preset, expected one of {list(PRESETS)}")
    return PRESETS[name]()


def demo_configs() -> tuple[ModelConfig, TrainConfig]:
    """The ``induction`` preset (the default ``attnlab demo``), under its original name.

    Measured on 2 CPU cores shared with other jobs, one torch thread, it passes 0.95 accuracy on
    the repeated half after about 250-300 steps (15-22 s) and ends near 1.0 after 500.
    """
    return preset("induction")
