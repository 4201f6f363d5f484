"""``TrainConfig``: everything about a training run except the model's architecture.

Like :class:`harness.ModelConfig`, ``__post_init__`` validates and nothing else: it never
seeds an RNG or picks a device (``device="auto"`` is resolved when training starts).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from harness._checks import check_bool, check_choice, check_int, check_number, check_seed, invalid
from harness.errors import AttnlabError
from harness.model.config import BOOL_WORDING, _JSONMixin
from harness.model.head_mask import normalize_head_mask
from harness.training.tasks import check_options

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "noam", "warmup_cosine", "warmup_linear")
DEVICES = ("auto", "cpu", "cuda")
# Hinton et al. 2015 soften both distributions with T; alpha weighs the soft term (harness.training.distill)
DEFAULT_TEMPERATURE, DEFAULT_ALPHA = 2.0, 0.5

# Fields a resumed run may change: they set how long the run goes and what it reports,
# not what a step computes. (A longer ``steps`` also stretches a decaying schedule.)
RESUMABLE_CHANGES = ("steps", "log_every", "eval_every", "checkpoint_every", "device", "compile")


@dataclass(frozen=True)
class TrainConfig(_JSONMixin):
    """A training run: task, optimizer, schedule, evaluation, checkpoints.

    ``seq_len=None`` takes the task's natural length (see :mod:`harness.training.tasks`).
    ``batch_size`` is the global batch; under DDP each process takes an equal share.
    ``lr`` is the peak learning rate; for ``noam`` it multiplies Vaswani et al.'s formula
    (``lr=1`` is the paper's schedule). ``warmup`` is in optimizer steps.
    ``betas`` are Adam's (β1, β2); ``momentum`` is SGD-with-momentum's coefficient.
    ``weight_decay`` is decoupled for ``adamw`` (Loshchilov & Hutter 2019) and an L2 term
    for the others; biases, norm gains and embeddings never decay.
    ``grad_clip=None`` disables clipping of the global gradient norm.
    ``checkpoint_every=None`` checkpoints only at the end (and on stop or interrupt).
    ``amp`` turns on bf16 autocast on CUDA; CPU runs train in the model's own dtype.
    ``head_mask`` (``[n_layers, n_heads]`` of 0/1, 0 = pruned) holds pruned heads at exactly zero
    (:mod:`harness.model.head_mask`); ``distill_from`` is a teacher run whose softened outputs the
    student matches: ``loss = alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * hard``
    with ``T = temperature`` (:mod:`harness.training.distill`; ``alpha=1`` is pure distillation).
    """

    task: str = "induction"
    seq_len: Optional[int] = None
    task_options: dict = field(default_factory=dict)
    batch_size: int = 64
    steps: int = 1000
    lr: float = 1e-3
    optimizer: str = "adamw"
    schedule: str = "warmup_cosine"
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.999)
    momentum: float = 0.9
    label_smoothing: float = 0.0
    grad_clip: Optional[float] = 1.0
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: Optional[int] = 500
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    amp: bool = True
    # prune, then heal (harness.training.distill): heads held at zero, and the teacher run to distill from
    head_mask: Optional[tuple] = None
    distill_from: Optional[str] = None
    temperature: float = DEFAULT_TEMPERATURE
    alpha: float = DEFAULT_ALPHA

    def __post_init__(self) -> None:
        if not isinstance(self.task_options, dict):
            raise invalid("task_options", self.task_options, "a dict of task option names to values")
        check_options(self.task, self.task_options)
        try:
            json.dumps(self.task_options)
        except TypeError:
            raise invalid("task_options", self.task_options, "JSON-serializable values") from None
        object.__setattr__(self, "task_options", dict(self.task_options))  # a private copy
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len, 2)
        for name in ("batch_size", "steps", "eval_every", "eval_batches", "log_every"):
            check_int(name, getattr(self, name), 1)
        check_int("warmup", self.warmup, 0)
        check_seed("seed", self.seed)
        if self.checkpoint_every is not None:
            check_int("checkpoint_every", self.checkpoint_every, 1)
        check_number("lr", self.lr, 0.0)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("schedule", self.schedule, SCHEDULES)
        if self.schedule == "noam" and self.warmup < 1:
            raise invalid("warmup", self.warmup, "at least 1 for the noam schedule (it divides by warmup^1.5)")
        check_number("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0, low_inclusive=True)
        check_number("weight_decay", self.weight_decay, 0.0, low_inclusive=True)
        if isinstance(self.betas, list):  # JSON has no tuples
            object.__setattr__(self, "betas", tuple(self.betas))
        if not isinstance(self.betas, tuple) or len(self.betas) != 2:
            raise invalid("betas", self.betas, "a pair (beta1, beta2) of numbers in [0, 1)")
        for i, b in enumerate(self.betas):
            check_number(f"betas[{i}]", b, 0.0, 1.0, low_inclusive=True, high_inclusive=False,
                         expected="a number in [0, 1)")
        check_number("momentum", self.momentum, 0.0, 1.0, low_inclusive=True)
        if self.momentum >= 1.0:
            raise invalid("momentum", self.momentum, "a number in [0, 1)")
        check_number("label_smoothing", self.label_smoothing, 0.0, 1.0, low_inclusive=True)
        if self.label_smoothing >= 1.0:
            raise invalid("label_smoothing", self.label_smoothing, "a number in [0, 1)")
        if self.grad_clip is not None:
            check_number("grad_clip", self.grad_clip, 0.0)
        check_choice("device", self.device, DEVICES)
        check_bool("compile", self.compile, expected=BOOL_WORDING)
        check_bool("amp", self.amp, expected=BOOL_WORDING)
        object.__setattr__(self, "head_mask",
                           _check_heal_fields(self.head_mask, self.distill_from, self.temperature, self.alpha))
        if self.distill_from is not None:
            object.__setattr__(self, "distill_from", str(self.distill_from))

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (configs are never mutated)."""
        return dataclasses.replace(self, **changes)

    def differences(self, other: TrainConfig) -> list[str]:
        """Names of the fields whose values differ from ``other``'s."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)]


def _check_heal_fields(head_mask: Any, distill_from: Any, temperature: Any, alpha: Any) -> Any:
    """Validate TrainConfig's prune-and-heal fields; returns ``head_mask`` normalized (or None).

    Without a teacher, ``temperature`` and ``alpha`` must keep their defaults: a value given for
    them would otherwise be silently ignored.
    """
    if distill_from is not None and (not isinstance(distill_from, (str, os.PathLike)) or not str(distill_from)):
        raise AttnlabError(f"distill_from={distill_from!r} is invalid: expected None or the path of a teacher run")
    check_number("temperature", temperature, 0, expected="a finite number > 0")
    check_number("alpha", alpha, 0, 1, low_inclusive=True, expected="a number in [0, 1] (1 = pure distillation)")
    if distill_from is None:
        for name, value, default in (("temperature", temperature, DEFAULT_TEMPERATURE),
                                     ("alpha", alpha, DEFAULT_ALPHA)):
            if value != default:
                raise AttnlabError(f"{name}={value!r} is invalid without a teacher: expected distill_from "
                                   f"(a teacher run) or the default {name}={default}")
    return None if head_mask is None else normalize_head_mask(head_mask)
