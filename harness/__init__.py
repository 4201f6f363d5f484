"""attnlab's model and its training: config, positions, Transformer, conversion, tasks, the training
loop, checkpoints, and the adapters that put other models behind the model protocol."""

from harness.model import KVCache, ModelConfig, Transformer
from harness.training import TrainConfig, TrainingDiverged, demo_configs, load_run, tasks, train

__all__ = ["ModelConfig", "Transformer", "KVCache", "TrainConfig", "train", "load_run", "demo_configs",
           "tasks", "TrainingDiverged"]
