"""The heal stage: prune a trained run's heads, then recover by fine-tuning or by distillation.

Pruning literature since Michel et al. (2019) removes heads and then trains the smaller model
back (Sheared-LLaMA, Minitron: prune, then distill). This stage measures what comes back:
for each pruned fraction it removes that many heads, least important first by the run's own
gradient importance (Michel et al. eq. 2; ``probes/importance_gradient.csv`` when the probe stage
wrote it, else computed here) and, as the baseline a pruning result needs, in seeded random
orders; then it trains each pruned model twice from the run's weights, with the pruned heads
held at zero (:mod:`harness.model.head_mask`):

- ``fine-tuned``: the hard-label loss alone (plain fine-tuning);
- ``distilled``: Hinton et al.'s (2015) loss with the unpruned run as the teacher,
  ``alpha * T^2 KL(teacher_T || student_T) + (1 - alpha) * hard`` (:mod:`harness.training.distill`).

Each student is a run of its own under ``out`` (default ``RUN_DIR/heal``); the loss and accuracy
of every model on the probes' fixed validation batch go to ``RUN_DIR/probes/heal.csv``, which the
report draws against the prune curve before healing.

Healing retrains, so it needs a run ``attnlab train`` made, and those are decoder-only Transformers: a run
directory holding another model's results (an encoder-decoder's through ``attnlab probe --hf/--model``) is
refused with one line, before any work.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch

import harness
import probes
from harness._checks import check_ints, check_positive_int
from harness.errors import AttnlabError
from harness.model.head_mask import apply_head_mask
from harness.run_dir import RunDir, atomic_write
from harness.training.checkpoint import prepare_run_dir, read_configs
from reports import pipeline, rundata
from reports.defaults import (
    HEAL_ALPHA,
    HEAL_DIR,
    HEAL_FRACTIONS,
    HEAL_SEEDS,
    HEAL_STEPS,
    HEAL_TEMPERATURE,
    PROBE_SEQUENCES,
)

HEAL_CSV = rundata.PROBE_FILES["heal"]
COLUMNS = rundata.COLUMNS["heal"]
STAGES = ("before", "fine-tuned", "distilled")
LR_SCALE = 0.3  # fine-tuning restarts from trained weights: a third of the run's peak lr, so it does not undo them


def _check_fractions(fractions: Any, n_heads: int) -> tuple[float, ...]:
    if isinstance(fractions, (int, float)) and not isinstance(fractions, bool):
        fractions = (fractions,)
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Sequence) or not fractions:
        raise AttnlabError(f"prune_fraction={fractions!r} is invalid: expected a number in (0, 1) or a sequence "
                           f"of them")
    for f in fractions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f < 1:
            raise AttnlabError(f"prune_fraction={f!r} is invalid: expected a number in (0, 1)")
        if round(f * n_heads) >= n_heads:
            # round() halves to even: f * n_heads = n_heads - 0.5 keeps a head only when n_heads - 1 is even
            bound = "at most" if (n_heads - 1) % 2 == 0 else "less than"
            raise AttnlabError(f"prune_fraction={f!r} is invalid: it prunes all {n_heads} heads "
                               f"(rounded to whole heads): expected {bound} {(n_heads - 0.5) / n_heads:.3f}")
    return tuple(sorted(set(float(f) for f in fractions)))


def importance_order(run_dir: Path, model: Any, tokens: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Flat head indices (layer * n_heads + head), least important first (stable: ties keep head order)."""
    path = RunDir(run_dir).probe_file(rundata.PROBE_FILES["importance_gradient"])
    if path.exists():
        frame = rundata.read_csv(path, rundata.COLUMNS["importance"])
    else:
        frame = probes.head_importance(model, tokens, loss_mask=loss_mask, method="gradient")
    if "kind" in frame:  # attnlab train makes decoder-only models: a kind column is another model's file
        raise AttnlabError(f"{path} ranks an encoder-decoder's heads (column kind): expected the importance of this "
                           f"run's decoder-only model (re-run attnlab probe on it)")
    frame = frame.sort_values(["layer", "head"])
    scores = torch.tensor(frame["importance"].to_numpy(), dtype=torch.float64)
    if scores.numel() != model.cfg.n_layers * model.cfg.n_heads:
        raise AttnlabError(f"{path} has {scores.numel()} heads: expected the model's "
                           f"{model.cfg.n_layers * model.cfg.n_heads}")
    return torch.sort(scores, stable=True).indices


def _mask(order: torch.Tensor, n_pruned: int, n_layers: int, n_heads: int) -> list[list[int]]:
    flat = torch.ones(n_layers * n_heads, dtype=torch.long)
    flat[order[:n_pruned]] = 0
    return flat.view(n_layers, n_heads).tolist()


def _evaluate(model: Any, tokens: torch.Tensor, loss_mask: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy on the probe batch, computed the way the prune curve computes them."""
    row = probes.prune_curve(model, tokens, loss_mask=loss_mask, order="random", seeds=(0,), fractions=(0.0,))
    return float(row["loss"].iloc[0]), float(row["accuracy"].iloc[0])


def heal(run_dir: str | os.PathLike, *, fractions: Any = HEAL_FRACTIONS, steps: int = HEAL_STEPS,
         temperature: float = HEAL_TEMPERATURE, alpha: float = HEAL_ALPHA, seeds: Sequence[int] = HEAL_SEEDS,
         lr: Optional[float] = None, out: Optional[str | os.PathLike] = None, sequences: int = PROBE_SEQUENCES,
         progress: Optional[bool] = None) -> pd.DataFrame:
    """Prune ``fractions`` of the heads of the run in ``run_dir``, heal each, write ``probes/heal.csv``.

    ``steps``, ``lr`` (default: the run's peak lr times ``LR_SCALE``), ``temperature`` and ``alpha``
    set the healing runs; ``seeds`` the random orders healed beside the importance order. Every
    argument, and every healing run's config, is checked before the first run starts; runs already
    under ``out`` from an earlier call are replaced.
    """
    path = rundata.require_run_dir(run_dir)
    layout = RunDir(path)
    if layout.model_json.exists() and not layout.checkpoint.exists():
        raise AttnlabError(f"attnlab heal retrains a run attnlab trained (its checkpoint/); {path} holds the results "
                           f"of a model from outside attnlab (model.json), which heal cannot retrain: expected a run "
                           f"directory made by attnlab train")
    model_cfg, train_cfg = read_configs(path)
    n_layers, n_heads = model_cfg.n_layers, model_cfg.n_heads
    fracs = _check_fractions(fractions, n_layers * n_heads)
    seeds = check_ints("seeds", seeds, 0) if seeds else ()
    check_positive_int("sequences", sequences)
    check_positive_int("steps", steps)
    base = train_cfg.replace(steps=steps, warmup=min(train_cfg.warmup, steps // 10), checkpoint_every=None,
                             eval_every=steps, log_every=max(1, steps // 10),
                             lr=train_cfg.lr * LR_SCALE if lr is None else lr)
    kinds = {"fine-tuned": base, "distilled": base.replace(distill_from=str(path), temperature=temperature,
                                                             alpha=alpha)}
    out_dir = Path(out) if out is not None else path / HEAL_DIR
    prepare_run_dir(out_dir)
    prepare_run_dir(path)  # heal.csv goes into the run: a read-only disk fails before the training

    teacher = harness.load_run(path)
    tokens, loss_mask = pipeline.probe_data(model_cfg, train_cfg, sequences)
    orders: list[tuple[str, Optional[int], torch.Tensor]] = [
        ("importance", None, importance_order(path, teacher, tokens, loss_mask))]
    orders += [("random", s, torch.randperm(n_layers * n_heads, generator=torch.Generator().manual_seed(s)))
               for s in seeds]
    plan = []
    for name, seed, order in orders:
        for f in fracs:
            n = round(f * n_layers * n_heads)
            mask = _mask(order, n, n_layers, n_heads)
            for kind, cfg in kinds.items():
                plan.append((name, seed, n, kind, cfg.replace(head_mask=mask)))  # validates every config
    rows = []
    for name, seed, order in orders:
        for f in fracs:
            n = round(f * n_layers * n_heads)
            student = harness.load_run(path)
            apply_head_mask(student, _mask(order, n, n_layers, n_heads))
            rows.append((name, seed, n, n / (n_layers * n_heads), "before", *_evaluate(student, tokens, loss_mask)))
    for name, seed, n, kind, cfg in plan:
        tag = f"{name}{'' if seed is None else seed}-{n:03d}of{n_layers * n_heads}-{kind}"
        student = harness.load_run(path)
        student.train(mode=True)  # load_run returns eval mode; fine-tuning wants dropout back on
        harness.train(student, cfg, out_dir / tag, overwrite=True, progress=progress)
        rows.append((name, seed, n, n / (n_layers * n_heads), kind,
                     *_evaluate(harness.load_run(out_dir / tag), tokens, loss_mask)))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["seed"] = frame["seed"].astype("Int64")
    layout.probes.mkdir(exist_ok=True)
    atomic_write(layout.probe_file(HEAL_CSV), lambda f: frame.to_csv(f, index=False))
    return frame
