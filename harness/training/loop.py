"""The training loop: ``train(model_or_config, TrainConfig, run_dir) -> metrics``.

One step: draw the global batch from the task's seeded generator, keep this rank's slice,
compute the (label-smoothed) loss on the masked targets, backpropagate, clip, update with
the lr of this step (:func:`harness.training.schedules.lr_at`). Rows go to ``run_dir/metrics.csv``
as training goes; checkpoints (:mod:`harness.training.checkpoint`) hold everything a step depends
on, so a stopped and resumed run repeats a straight run's numbers exactly on CPU (with the
same torch thread count: a matmul splits its sums by thread, which moves the last bits).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from harness._checks import check_bool, check_int
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.compiled import HookAwareCompiled
from harness.model.config import ModelConfig
from harness.model.head_mask import apply_head_mask
from harness.model.transformer import Transformer
from harness.run_dir import RunDir
from harness.training import checkpoint as ckpt
from harness.training import distill, distributed
from harness.training.config import RESUMABLE_CHANGES, TrainConfig
from harness.training.metrics import MetricsLog, flops_per_token, new_row, peak_flops
from harness.training.optim import make_optimizer, set_lr, smoothed_cross_entropy, update_overflow
from harness.training.schedules import lr_at
from harness.training.tasks import Task, make_task, shifted

VAL_SEED_OFFSET = 0x5EED  # validation batches have their own generator: they never shift the training stream


class TrainingDiverged(AttnlabError, RuntimeError):
    """The training loss (or gradient norm) became NaN or infinite; the last good checkpoint is kept."""


class _InterruptFlag:
    """Turns the first SIGINT into a request to stop at the next step boundary.

    Stopping between steps (never inside ``optimizer.step()``) lets the loop save a consistent
    checkpoint before re-raising KeyboardInterrupt; a second SIGINT interrupts at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None  # the SIGINT handler to restore (signal.signal's union type)
        self._installed = False

    def __enter__(self) -> _InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)


def _check_args(model_or_cfg, train_cfg, run_dir, resume, stop_after, overwrite, progress):
    if isinstance(model_or_cfg, ModelConfig):
        model_cfg, model = model_or_cfg, None
    elif isinstance(model_or_cfg, Transformer):
        model_cfg, model = model_or_cfg.config, model_or_cfg
    else:
        raise AttnlabTypeError("train expects a harness.ModelConfig or harness.Transformer, "
                               f"got {type(model_or_cfg).__name__}")
    if not isinstance(train_cfg, TrainConfig):
        raise AttnlabTypeError(f"train_cfg must be a harness.TrainConfig, got {type(train_cfg).__name__}")
    if not isinstance(run_dir, (str, os.PathLike)):
        raise AttnlabTypeError(f"run_dir must be a path, got {type(run_dir).__name__}")
    for name, value in (("resume", resume), ("overwrite", overwrite)):
        check_bool(name, value)
    if resume and overwrite:
        raise AttnlabError("resume=True and overwrite=True contradict each other: expected at most one")
    check_bool("progress", progress, none_ok=True, expected="None (a bar only on a terminal), True or False")
    check_int("stop_after", stop_after, 1, train_cfg.steps, none_ok=True,
              expected=f"an integer in [1, steps={train_cfg.steps}]")
    return model_cfg, model


def _check_run_dir(run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, resume: bool,
                   overwrite: bool) -> Optional[dict]:
    """The checkpoint state to resume from (None for a fresh run); refuses a mismatched run_dir."""
    if run_dir.exists() and not run_dir.is_dir():
        raise AttnlabError(f"run_dir {run_dir} is a file: expected a folder")
    if overwrite or not (resume or ckpt.has_run(run_dir)):
        return None
    if not resume:
        try:
            old_model, old_train = ckpt.read_configs(run_dir)
            diff = [f"model.{k}" for k, v in model_cfg.to_dict().items() if old_model.to_dict()[k] != v]
            diff += [f"train.{k}" for k in train_cfg.differences(old_train)]
        except (FileNotFoundError, ValueError):
            diff = ["(the stored config is missing or unreadable)"]
        what = f"a run with a different config ({', '.join(diff)})" if diff else "a run of this config"
        raise AttnlabError(f"run_dir {run_dir} already holds {what}: pass resume=True to continue it "
                           "or overwrite=True to start over")
    old_model, old_train = ckpt.read_configs(run_dir)
    if old_model != model_cfg:
        diff = [k for k, v in model_cfg.to_dict().items() if old_model.to_dict()[k] != v]
        raise AttnlabError(f"cannot resume {run_dir}: the model config differs in {diff}")
    fixed = [k for k in train_cfg.differences(old_train) if k not in RESUMABLE_CHANGES]
    if fixed:
        raise AttnlabError(f"cannot resume {run_dir}: the train config differs in {fixed}; a resumed run may "
                           f"change only {list(RESUMABLE_CHANGES)}")
    state = ckpt.read_state(run_dir)
    for name in ("model.safetensors", "optimizer.safetensors"):
        ckpt.check_safetensors(ckpt.checkpoint_dir(run_dir) / name)
    return state


def train(model_or_cfg: ModelConfig | Transformer, train_cfg: TrainConfig, run_dir: str | os.PathLike,
          resume: bool = False, stop_after: Optional[int] = None, overwrite: bool = False,
          progress: Optional[bool] = None, *, head_mask: Any = None, distill_from: Optional[str | os.PathLike] = None,
          temperature: Optional[float] = None, alpha: Optional[float] = None) -> pd.DataFrame:
    """Train a model on ``train_cfg.task``; returns the metrics (also in ``run_dir/metrics.csv``).

    ``model_or_cfg``: a ModelConfig (a fresh model is built from it) or a Transformer
    (trained in place; when resuming, its weights are replaced by the checkpoint's).
    ``resume=True`` continues the checkpoint in ``run_dir`` up to ``train_cfg.steps``
    (which may have grown; see ``RESUMABLE_CHANGES``); ``stop_after=k`` stops after step k
    as an interruption would (checkpoint written, schedule unchanged). An existing run in
    ``run_dir`` is refused unless ``resume`` or ``overwrite`` (which deletes only what
    ``train`` wrote there). ``progress``: a tqdm bar; None shows it only when
    stderr is a terminal. Raises :class:`TrainingDiverged` on a non-finite loss; on
    Ctrl-C, saves a checkpoint at the end of the current step and re-raises KeyboardInterrupt.
    Under ``torchrun`` (WORLD_SIZE > 1) training is data-parallel and rank 0 alone writes;
    other ranks return only the rows of their own segment.

    Prune, then heal: ``head_mask``, ``distill_from``, ``temperature`` and ``alpha``, when given,
    set the TrainConfig fields of the same names (see :class:`TrainConfig`): the pruned heads are
    held at zero on ``model`` (in place, and in the saved run), and the loss distils from the
    teacher run (:mod:`harness.training.distill`). Without a teacher, a head mask alone is plain
    fine-tuning of the pruned model, the baseline distillation is measured against.
    """
    changes = {k: v for k, v in (("head_mask", head_mask), ("distill_from", distill_from),
                                 ("temperature", temperature), ("alpha", alpha)) if v is not None}
    if changes and isinstance(train_cfg, TrainConfig):
        train_cfg = train_cfg.replace(**changes)
    model_cfg, model = _check_args(model_or_cfg, train_cfg, run_dir, resume, stop_after, overwrite, progress)
    distill.check_against_model(train_cfg, model_cfg)
    run_dir = Path(run_dir)
    task = make_task(train_cfg.task, model_cfg.d_vocab, model_cfg.n_ctx, train_cfg.seq_len, train_cfg.task_options)
    info = distributed.setup(train_cfg.device)
    try:
        if train_cfg.batch_size % info.world_size:
            raise AttnlabError(f"batch_size={train_cfg.batch_size} is invalid: expected a multiple of the "
                               f"{info.world_size} data-parallel processes")
        state = _check_run_dir(run_dir, model_cfg, train_cfg, resume, overwrite)
        if state is not None:
            done = state["step"]
            if done > train_cfg.steps:
                raise AttnlabError(f"cannot resume {run_dir}: its checkpoint is at step {done}, past "
                                   f"steps={train_cfg.steps}: expected steps >= {done}")
            if stop_after is not None and stop_after <= done:
                raise AttnlabError(f"stop_after={stop_after} is invalid: the checkpoint in {run_dir} is already "
                                   f"at step {done}: expected a later step")
        distributed.barrier(info)  # every rank has read run_dir before rank 0 changes it
        if info.is_main:
            ckpt.prepare_run_dir(run_dir)  # a read-only or full disk fails here, before any work (or deletion)
            if overwrite:
                ckpt.remove_run(run_dir)
        distributed.barrier(info)
        if model is None:
            model = Transformer(model_cfg)
        loop = _Loop(model, model_cfg, train_cfg, task, run_dir, info, state, progress)
        return loop.run(stop_after or train_cfg.steps)
    finally:
        distributed.teardown(info)


class _Loop:
    """One training segment, from a fresh start or a checkpoint to ``end``."""

    def __init__(self, model: Transformer, model_cfg: ModelConfig, cfg: TrainConfig, task: Task, run_dir: Path,
                 info: distributed.DistInfo, state: Optional[dict], progress: Optional[bool]):
        self.cfg, self.model_cfg, self.task, self.run_dir, self.info = cfg, model_cfg, task, run_dir, info
        self.device = info.device
        self.model = model.to(self.device).train()
        apply_head_mask(self.model, cfg.head_mask)
        self.teacher = distill.Teacher(cfg.distill_from, self.device) if cfg.distill_from is not None else None
        self.optimizer = make_optimizer(self.model, cfg)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.start, self.elapsed0 = 0, 0.0
        self.pending = {"loss_sum": 0.0, "steps": 0, "tokens": 0, "time": 0.0}
        if state is not None:
            ckpt.load_weights(self.model, run_dir)
            ckpt.load_optimizer(self.optimizer, run_dir)
            ckpt.set_rng_state(state["rng"], self.gen)
            self.start, self.elapsed0, self.pending = state["step"], state["elapsed_s"], dict(state["pending"])
        self.metrics = MetricsLog(RunDir(run_dir).metrics_csv, enabled=info.is_main)
        self.metrics.truncate_after(self.start)  # rows a killed run wrote after its last checkpoint
        self.last_saved = self.start if state is not None else None
        val_gen = torch.Generator().manual_seed(cfg.seed + VAL_SEED_OFFSET)
        self.val = [task.batch(cfg.batch_size, val_gen, "val") for _ in range(cfg.eval_batches)]
        self.amp = cfg.amp and self.device.type == "cuda"
        self.fwd: nn.Module = HookAwareCompiled(self.model) if cfg.compile else self.model
        if info.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.step_model: nn.Module = DistributedDataParallel(self.fwd, device_ids=ids)
        else:
            self.step_model = self.fwd
        per_rank = cfg.batch_size // info.world_size
        self.shard = slice(info.rank * per_rank, (info.rank + 1) * per_rank)
        self.fpt = flops_per_token(self.model, task.seq_len)
        low_precision = self.amp or model_cfg.dtype in ("bfloat16", "float16")
        self.peak = peak_flops(self.device, low_precision) * info.world_size
        show = sys.stderr.isatty() if progress is None else progress
        self.bar = tqdm(total=cfg.steps, initial=self.start, disable=not (show and info.is_main),
                        desc="train", unit="step", dynamic_ncols=True)

    def _autocast(self):
        if self.amp:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _save(self, step: int) -> None:
        if self.info.is_main:
            self.metrics.sync()
            state = {"step": step, "elapsed_s": self._elapsed(), "rng": ckpt.rng_state(self.gen),
                     "pending": self.pending, "world_size": self.info.world_size}
            ckpt.save_checkpoint(self.run_dir, self.model, self.optimizer, self.model_cfg, self.cfg, state)
        self.last_saved = step
        distributed.barrier(self.info)

    def _elapsed(self) -> float:
        return self.elapsed0 + time.perf_counter() - self.t0

    @torch.no_grad()
    def _evaluate(self) -> tuple[float, float]:
        """Loss (plain cross-entropy) and accuracy over the fixed validation batches."""
        self.model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, targets
        for tokens, mask in self.val:
            tokens, mask = tokens[self.shard].to(self.device), mask[self.shard].to(self.device)
            with self._autocast():
                logits = self.fwd(tokens)
            pred, target = shifted(logits, tokens, mask)
            totals[0] += smoothed_cross_entropy(pred, target, 0.0).sum().double()
            totals[1] += (pred.argmax(-1) == target).sum()
            totals[2] += target.numel()
        distributed.all_reduce_sum(totals, self.info)
        self.model.train()
        n = float(totals[2])
        return (float(totals[0]) / n, float(totals[1]) / n) if n else (math.nan, math.nan)

    def _diverged(self, step: int, what: str, value: float | str) -> TrainingDiverged:
        kept = (f"the last good checkpoint (step {self.last_saved}) in {self.run_dir / ckpt.CHECKPOINT} is kept"
                if self.last_saved is not None else "no checkpoint was written")
        return TrainingDiverged(f"training diverged at step {step}: the {what} is {value}; {kept}. "
                                "Try a lower lr, a longer warmup or grad_clip.")

    def _step(self, step: int, interrupt: _InterruptFlag) -> tuple[float, float, bool]:
        """One update; returns (mean training loss, gradient norm before clipping, stop requested)."""
        cfg = self.cfg
        set_lr(self.optimizer, lr_at(step, cfg, self.model_cfg.d_model))
        tokens, mask = self.task.batch(cfg.batch_size, self.gen)
        n_targets = max(1, int(mask[:, 1:].sum()))  # over the global batch, known on every rank
        tokens, mask = tokens[self.shard].to(self.device), mask[self.shard].to(self.device)
        with self._autocast():
            logits = self.step_model(tokens)
        pred, target = shifted(logits, tokens, mask)
        per_target = smoothed_cross_entropy(pred, target, cfg.label_smoothing)
        if self.teacher is not None:
            with self._autocast():
                teacher_pred, _ = shifted(self.teacher.logits(tokens), tokens, mask)
            per_target = distill.mixed_loss(pred, teacher_pred, target, per_target, cfg.temperature, cfg.alpha)
        local = per_target.sum()
        stats = torch.stack([local.detach().double(),
                             torch.tensor(float(interrupt.requested), dtype=torch.float64, device=self.device)])
        distributed.all_reduce_sum(stats, self.info)
        loss_value, stop = float(stats[0]) / n_targets, bool(stats[1] > 0)
        if not math.isfinite(loss_value):
            raise self._diverged(step, "training loss", loss_value)
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over ranks, so scaling by world_size / (global target count)
        # makes the update the gradient of the mean loss over the whole global batch.
        (local * (self.info.world_size / n_targets)).backward()
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not math.isfinite(grad_norm):
            raise self._diverged(step, "gradient norm", grad_norm)
        overflow = update_overflow(self.optimizer)  # e.g. lr=1e5 in float16: torch would refuse the step
        if overflow is not None:
            raise self._diverged(step, "update", overflow)
        self.optimizer.step()
        return loss_value, grad_norm, stop

    def _row(self, step: int, grad_norm: float) -> dict:
        cfg, p = self.cfg, self.pending
        row = new_row(step)
        tps = p["tokens"] / p["time"] if p["time"] > 0 else math.nan
        row.update(lr=lr_at(step, cfg, self.model_cfg.d_model), train_loss=p["loss_sum"] / p["steps"],
                   grad_norm=grad_norm, tokens_per_s=tps, mfu=self.fpt * tps / self.peak)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            row["val_loss"], row["val_accuracy"] = self._evaluate()
        row["elapsed_s"] = self._elapsed()
        self.pending = {"loss_sum": 0.0, "steps": 0, "tokens": 0, "time": 0.0}
        return row

    def run(self, end: int) -> pd.DataFrame:
        cfg = self.cfg
        self.t0 = time.perf_counter()
        prev_precision = torch.get_float32_matmul_precision()
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 matmuls: ~8x fp32 throughput on Ampere+
        try:
            with _InterruptFlag() as interrupt:
                if self.last_saved is None:
                    self._save(0)  # the config is on disk from the first moment; a kill before step 1 can resume
                for step in range(self.start + 1, end + 1):
                    t_step = time.perf_counter()
                    loss, grad_norm, stop = self._step(step, interrupt)
                    p = self.pending
                    p["loss_sum"] += loss
                    p["steps"] += 1
                    p["tokens"] += cfg.batch_size * self.task.seq_len
                    p["time"] += time.perf_counter() - t_step
                    if step % cfg.log_every == 0 or step % cfg.eval_every == 0 or step == cfg.steps:
                        row = self._row(step, grad_norm)
                        self.metrics.write(row)
                        self.bar.set_postfix(loss=f"{row['train_loss']:.4f}", tok_s=f"{row['tokens_per_s']:.3g}")
                    self.bar.update(1)
                    if stop or step == end or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                        self._save(step)
                    if stop:
                        raise KeyboardInterrupt(f"training interrupted after step {step}; checkpoint saved in "
                                                f"{self.run_dir / ckpt.CHECKPOINT} (resume=True continues)")
        finally:
            torch.set_float32_matmul_precision(prev_precision)
            self.bar.close()
            self.metrics.close()
        return self.metrics.frame()
