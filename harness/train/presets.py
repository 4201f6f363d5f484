"""The default demonstration run, the one ``attnlab demo`` trains."""

from __future__ import annotations

from harness.model.config import ModelConfig
from harness.train.config import TrainConfig


def demo_configs() -> tuple[ModelConfig, TrainConfig]:
    """A 2-layer attention-only model learning ``induction`` (Olsson et al. 2022).

    Two layers are the fewest an induction head needs: a previous-token head in layer 0
    whose output layer 1's keys read (K-composition, Elhage et al. 2021). Measured on
    2 CPU cores shared with other jobs, one torch thread, it passes 0.95 accuracy on the
    repeated half after about 250-300 steps (15-22 s) and ends near 1.0 after 500.
    """
    model = ModelConfig(n_layers=2, d_model=64, n_heads=4, attn_only=True, d_vocab=64, n_ctx=64)
    train = TrainConfig(task="induction", seq_len=64, batch_size=32, steps=500, lr=3e-3, warmup=50,
                        schedule="warmup_cosine", optimizer="adamw", eval_every=50, log_every=10,
                        checkpoint_every=100)
    return model, train
