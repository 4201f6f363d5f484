"""attnlab's model and everything needed to build it: config, positions, Transformer, conversion."""

from harness.config import ModelConfig
from harness.model import KVCache, Transformer

__all__ = ["ModelConfig", "Transformer", "KVCache"]

from harness import tasks  # noqa: E402
from harness.checkpoint import load_run  # noqa: E402
from harness.demo import demo_configs  # noqa: E402
from harness.train import TrainingDiverged, train  # noqa: E402
from harness.train_config import TrainConfig  # noqa: E402

__all__ += ["TrainConfig", "train", "load_run", "demo_configs", "tasks", "TrainingDiverged"]
