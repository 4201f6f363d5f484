"""Knowledge distillation: the loss that heals a pruned student from its unpruned teacher.

Hinton, Vinyals & Dean (2015), "Distilling the Knowledge in a Neural Network", §2: the
student matches the teacher's *soft targets*, both distributions softened by a temperature T,

    distill = T^2 · KL( softmax(z_teacher / T) || softmax(z_student / T) ),

averaged over the target positions. The gradient of the soft term scales as 1/T^2 (§2.1), so
the T^2 factor keeps its weight against the hard-label term unchanged when T changes. The two
are mixed as

    loss = alpha · distill + (1 - alpha) · hard,      hard = (label-smoothed) CE(y, softmax(z_student)),

so ``alpha = 1`` is pure distillation and ``alpha = 0`` plain fine-tuning on the labels.
KL(p || q) = H(p, q) - H(p): against the teacher's soft targets it is the cross-entropy minus
a constant, so at T = 1 and alpha = 1 the loss is exactly KL(teacher || student).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from harness.errors import AttnlabError
from harness.model.config import ModelConfig
from harness.model.head_mask import check_head_mask_shape
from harness.training import checkpoint as ckpt

__all__ = ["soft_kl", "mixed_loss", "check_teacher"]


def _upcast(t: Tensor) -> Tensor:
    # log-softmax in bf16/fp16 loses the small probabilities that carry the "dark knowledge"
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def soft_kl(student: Float[Tensor, "n d_vocab"], teacher: Float[Tensor, "n d_vocab"],
            temperature: float) -> Float[Tensor, " n"]:
    """Per-target ``T^2 · KL(softmax(teacher/T) || softmax(student/T))`` (Hinton et al. 2015, §2)."""
    log_q = F.log_softmax(_upcast(student) / temperature, dim=-1)
    log_p = F.log_softmax(_upcast(teacher).to(log_q.dtype) / temperature, dim=-1)
    # sum_v p (log p - log q); p = exp(log p) computed from log p so p = 0 contributes 0, not NaN
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return kl * (temperature ** 2)


def mixed_loss(student: Float[Tensor, "n d_vocab"], teacher: Float[Tensor, "n d_vocab"],
               targets: Int[Tensor, " n"], hard: Float[Tensor, " n"], temperature: float,
               alpha: float) -> Float[Tensor, " n"]:
    """Per-target ``alpha · soft_kl + (1 - alpha) · hard``; ``hard`` is the caller's hard-label loss."""
    if alpha == 1.0:
        return soft_kl(student, teacher, temperature)
    if alpha == 0.0:
        return hard
    return alpha * soft_kl(student, teacher, temperature) + (1.0 - alpha) * hard


def check_teacher(distill_from: str | os.PathLike, student: ModelConfig) -> tuple[ModelConfig, Any]:
    """The teacher run's configs, after checking it can teach ``student``: same d_vocab and n_ctx.

    Raised before any work; the message names the teacher run and the value that differs.
    """
    path = Path(distill_from)
    if not path.is_dir():
        raise AttnlabError(f"distill_from={str(distill_from)!r} is invalid: expected a run directory "
                           "(a trained run with checkpoint/), found none")
    teacher_cfg, teacher_train = ckpt.read_configs(path)
    for name in ("d_vocab", "n_ctx"):
        t, s = getattr(teacher_cfg, name), getattr(student, name)
        if t != s:
            raise AttnlabError(f"distill_from={str(distill_from)!r} is invalid: the teacher's {name}={t} "
                               f"differs from the student's {name}={s}: expected the same {name}")
    return teacher_cfg, teacher_train


def check_against_model(train_cfg: Any, model_cfg: ModelConfig) -> None:
    """The checks that need the student's architecture, run by ``train`` before any work."""
    if train_cfg.head_mask is not None:
        check_head_mask_shape(train_cfg.head_mask, model_cfg.n_layers, model_cfg.n_heads)
    if train_cfg.distill_from is not None:
        check_teacher(train_cfg.distill_from, model_cfg)


class Teacher:
    """The frozen teacher of a distillation run: its logits on the student's batch, without gradients."""

    def __init__(self, run_dir: str, device: torch.device):
        self.model = ckpt.load_run(run_dir, device=device).eval()
        self.model.requires_grad_(False)

    @torch.no_grad()
    def logits(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.model(tokens)
