"""Learning-rate schedules as a pure function of the step.

Steps count optimizer updates from 1 (the first update is step 1), so ``lr_at`` never
sees step 0 and Noam's ``step^-0.5`` is always defined. Being pure, the schedule needs no
state in a checkpoint: a resumed run recomputes the same value for the same step.
"""

from __future__ import annotations

import math
from typing import Optional

from harness._checks import check_int, is_int
from harness.errors import AttnlabError, AttnlabTypeError
from harness.training.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig, d_model: Optional[int] = None) -> float:
    """The learning rate of update ``step`` (1-based) under ``cfg``'s schedule.

    constant       lr, after a linear warmup when ``warmup > 0``
    noam           lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (Vaswani et al. 2017 §5.3)
    warmup_cosine  linear warmup to lr, then cosine decay to ``min_lr_ratio * lr`` at ``steps``
                   (Loshchilov & Hutter 2017, SGDR, without restarts)
    warmup_linear  linear warmup to lr, then linear decay to 0 at ``steps``
    """
    check_int("step", step, 1, expected="an integer >= 1 (steps count updates from 1)")
    if not isinstance(cfg, TrainConfig):
        raise AttnlabTypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    kind, peak, warm, total = cfg.schedule, cfg.lr, cfg.warmup, cfg.steps
    if kind == "noam":
        if not is_int(d_model) or d_model < 1:
            raise AttnlabError(f"d_model={d_model!r} is invalid: the noam schedule needs the model width "
                               "(an integer >= 1)")
        return peak * d_model ** -0.5 * min(step ** -0.5, step * warm ** -1.5)
    if warm > 0 and step <= warm:
        return peak * step / warm
    if kind == "constant":
        return peak
    # Fraction of the decay done before this update: 0 for the first update after warmup, so
    # no update is wasted at lr=0 at the end; clamped so steps past `steps` stay at the floor.
    progress = min(1.0, max(0.0, (step - 1 - warm) / max(1, total - warm)))
    if kind == "warmup_linear":
        return peak * (1.0 - progress)
    floor = cfg.min_lr_ratio * peak
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
