"""Training: config, tasks, the text corpus, optimizer, schedules, the loop, metrics, checkpoints,
distributed data parallelism and named presets.

``harness.train`` is only the function :func:`train`; the package is ``harness.training`` and its
parts are imported by module path, ``from harness.training.tasks import make_task``.
"""

from harness.training.checkpoint import load_run
from harness.training.config import TrainConfig
from harness.training.loop import TrainingDiverged, train
from harness.training.presets import demo_configs

__all__ = ["TrainConfig", "train", "TrainingDiverged", "load_run", "demo_configs"]
