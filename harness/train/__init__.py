"""Training: config, tasks, the text corpus, optimizer, schedules, the loop, metrics, checkpoints,
distributed data parallelism and named presets.

``harness.train`` (the attribute of the ``harness`` package) is the function :func:`train`;
its parts are imported by module path, ``from harness.train.tasks import make_task``.
"""

from harness.train.checkpoint import load_run
from harness.train.config import TrainConfig
from harness.train.loop import TrainingDiverged, train
from harness.train.presets import demo_configs

__all__ = ["TrainConfig", "train", "TrainingDiverged", "load_run", "demo_configs"]
