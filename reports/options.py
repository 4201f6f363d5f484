"""Click options that map one to one onto ``ModelConfig`` and ``TrainConfig`` fields.

An option left unset keeps the preset's value (``--preset NAME``, default ``induction``, the demo
configuration ``harness.demo_configs()``), so ``attnlab train --out run --steps 200`` is the demo
model trained for 200 steps and ``--preset text --steps 50`` the text preset cut short. Validation is
the dataclasses' own: a value they refuse becomes the CLI's one-line error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar, Optional

import click

from harness.adapters.placement import DTYPE_NAMES
from harness.model.config import ACT_FNS, ATTENTION_DIRS, DTYPES, NORM_PLACEMENTS, POSITIONAL_TYPES
from harness.training.config import DEVICES, OPTIMIZERS, SCHEDULES
from harness.training.presets import PRESETS, preset
from harness.training.tasks import TASKS
from reports.defaults import ATTN_IMPLEMENTATION, DEVICE, DTYPE, PRESET, PROBE_SEQUENCES, SEEDS, comma

BENCH_MODES = {False: "short", True: "full"}


class _CommaNumbers(click.ParamType):
    """A comma-separated list of one kind of number, as a tuple (the stage checks the range): ``kind``
    parses one item, ``noun`` and ``example`` word the error."""

    kind: ClassVar[type]
    noun: ClassVar[str]
    example: ClassVar[str]

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        try:
            out = tuple(self.kind(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of {self.noun}", param, ctx)
        if not out:
            self.fail(f"{value!r} is empty: expected {self.noun} such as {self.example}", param, ctx)
        return out


class CommaInts(_CommaNumbers):
    """``8,16,32`` -> ``(8, 16, 32)``."""

    name = "INTS"
    kind = int
    noun = "integers"
    example = "0,1,2"


class _ExplicitNone:
    """``none`` given on the command line: unlike an unset option (None), it sets the field to None."""

    def __repr__(self) -> str:
        return "none"


EXPLICIT_NONE = _ExplicitNone()


class OptionalNumber(click.ParamType):
    """A number, or ``none`` for a field whose None switches the feature off."""

    def __init__(self, kind: type):
        self.kind = kind
        self.name = f"{kind.__name__.upper()}|none"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None or value is EXPLICIT_NONE or isinstance(value, self.kind):
            return value
        if str(value).lower() == "none":
            return EXPLICIT_NONE
        try:
            return self.kind(value)
        except ValueError:
            self.fail(f"{value!r} is not {'an integer' if self.kind is int else 'a number'} or 'none'", param, ctx)


class KeyValue(click.ParamType):
    """``key=value`` with a JSON value (``min_prefix=4``, ``path="data/"``); a bare word stays a string."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
        if isinstance(value, tuple):
            return value
        key, sep, raw = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r} is not of the form key=value", param, ctx)
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw
        return key.strip(), parsed


class Pair(click.ParamType):
    name = "B1,B2"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[float, float]:
        if isinstance(value, tuple):
            return value
        try:
            a, b = (float(v) for v in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not two comma-separated numbers", param, ctx)
        return a, b


class JsonGrid(click.ParamType):
    """``[[1,0],[1,1]]`` -> nested lists (TrainConfig checks the values)."""

    name = "JSON"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            self.fail(f"{value!r} is not JSON: expected a grid such as [[1,0],[1,1]]", param, ctx)


class CommaFloats(_CommaNumbers):
    """``0.25,0.5`` -> ``(0.25, 0.5)``."""

    name = "FLOATS"
    kind = float
    noun = "numbers"
    example = "0.25,0.5"


class OutDir(click.Path):
    """A folder to write into: a path, never empty (``--out ''`` would silently mean the current folder)."""

    def __init__(self, file_okay: bool = True) -> None:
        super().__init__(file_okay=file_okay, path_type=str)

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is empty: expected a folder to write into", param, ctx)
        return super().convert(value, param, ctx)


comma_ints = CommaInts()
comma_floats = CommaFloats()
NORM_CHOICES = {"LN": "LN", "RMS": "RMS", "none": None}

# (option, config, field, click type, help). Flags are given as "--name/--no-name".
MODEL_FIELDS: list[tuple[str, str, Any, str]] = [
    ("--n-layers", "n_layers", click.IntRange(min=1), "Transformer blocks."),
    ("--d-model", "d_model", click.IntRange(min=1), "Residual stream width."),
    ("--n-heads", "n_heads", click.IntRange(min=1), "Attention heads per layer."),
    ("--d-head", "d_head", click.IntRange(min=1), "Width of one head (default d_model / n_heads)."),
    ("--d-mlp", "d_mlp", click.IntRange(min=1), "MLP hidden width (default 4 d_model)."),
    ("--d-vocab", "d_vocab", click.IntRange(min=1), "Vocabulary size."),
    ("--n-ctx", "n_ctx", click.IntRange(min=1), "Longest sequence (rows of a learned position table)."),
    ("--act-fn", "act_fn", click.Choice(ACT_FNS), "MLP activation."),
    ("--gated-mlp/--no-gated-mlp", "gated_mlp", None, "SwiGLU-style gated MLP."),
    ("--normalization-type", "normalization_type", click.Choice(list(NORM_CHOICES)), "Norm layers."),
    ("--norm-placement", "norm_placement", click.Choice(NORM_PLACEMENTS), "Pre-norm or post-norm blocks."),
    ("--positional-embedding-type", "positional_embedding_type", click.Choice(POSITIONAL_TYPES),
     "Position information ('standard' = learned absolute)."),
    ("--rotary-base", "rotary_base", click.FloatRange(min=1.0), "Rotary base frequency."),
    ("--attention-dir", "attention_dir", click.Choice(ATTENTION_DIRS), "Causal (decoder) or bidirectional."),
    ("--attn-only/--no-attn-only", "attn_only", None, "Attention-only blocks (no MLP)."),
    ("--use-attn-scale/--no-use-attn-scale", "use_attn_scale", None, "Divide scores by sqrt(d_head)."),
    ("--use-attn-result/--no-use-attn-result", "use_attn_result", None, "Expose hook_result (memory-heavy)."),
    ("--tie-embeddings/--no-tie-embeddings", "tie_embeddings", None, "Unembedding = embedding transposed."),
    ("--n-key-value-heads", "n_key_value_heads", OptionalNumber(int), "Key/value heads (grouped-query attention)."),
    ("--attn-bias/--no-attn-bias", "attn_bias", None, "Biases in attention projections."),
    ("--mlp-bias/--no-mlp-bias", "mlp_bias", None, "Biases in MLP projections."),
    ("--eps", "eps", float, "Norm epsilon."),
    ("--init-range", "init_range", float, "Std of the initial weights."),
    ("--model-seed", "seed", click.IntRange(min=0), "Seed of the initial weights."),
    ("--dtype", "dtype", click.Choice(DTYPES), "Parameter dtype."),
]
TRAIN_FIELDS: list[tuple[str, str, Any, str]] = [
    ("--task", "task", click.Choice(sorted(TASKS)), "Synthetic task (or byte-level text)."),
    ("--seq-len", "seq_len", click.IntRange(min=2), "Sequence length (default: the task's own)."),
    ("--task-option", "task_options", KeyValue(), "A task option, key=value (repeatable)."),
    ("--batch-size", "batch_size", click.IntRange(min=1), "Global batch size."),
    ("--steps", "steps", click.IntRange(min=1), "Optimizer steps."),
    ("--lr", "lr", float, "Peak learning rate."),
    ("--optimizer", "optimizer", click.Choice(OPTIMIZERS), "Optimizer."),
    ("--schedule", "schedule", click.Choice(SCHEDULES), "Learning-rate schedule."),
    ("--warmup", "warmup", click.IntRange(min=0), "Warm-up steps."),
    ("--min-lr-ratio", "min_lr_ratio", float, "Final lr / peak lr for decaying schedules."),
    ("--weight-decay", "weight_decay", float, "Weight decay (decoupled for adamw)."),
    ("--betas", "betas", Pair(), "Adam betas, e.g. 0.9,0.98."),
    ("--momentum", "momentum", float, "SGD momentum."),
    ("--label-smoothing", "label_smoothing", float, "Label smoothing epsilon."),
    ("--grad-clip", "grad_clip", OptionalNumber(float), "Global gradient-norm clip ('none' = off)."),
    ("--eval-every", "eval_every", click.IntRange(min=1), "Steps between evaluations."),
    ("--eval-batches", "eval_batches", click.IntRange(min=1), "Validation batches per evaluation."),
    ("--checkpoint-every", "checkpoint_every", OptionalNumber(int), "Steps between checkpoints ('none' = end only)."),
    ("--log-every", "log_every", click.IntRange(min=1), "Steps between metrics rows."),
    ("--seed", "seed", click.IntRange(min=0), "Seed of the data order."),
    ("--device", "device", click.Choice(DEVICES), "Where to train."),
    ("--compile/--no-compile", "compile", None, "torch.compile the model (CUDA)."),
    ("--amp/--no-amp", "amp", None, "bf16 autocast on CUDA."),
    ("--head-mask", "head_mask", JsonGrid(), "Heads held at zero: a JSON [n_layers][n_heads] grid of 0/1."),
    ("--distill-from", "distill_from", click.Path(file_okay=False, path_type=str),
     "Teacher run to distill from (Hinton et al. 2015)."),
    ("--temperature", "temperature", float, "Distillation temperature T (needs --distill-from)."),
    ("--alpha", "alpha", float, "Weight of the distillation loss; 1 = pure distillation (needs --distill-from)."),
]


def placement_options(f: Callable) -> Callable:
    """--dtype / --device / --attn-implementation: where ``check`` and ``probe`` run the model.

    The values reach :func:`harness.adapters.placed` (and, for --hf, ``from_pretrained``, so the
    checkpoint is loaded in that dtype rather than cast after); the command validates them with
    :func:`harness.adapters.check_placement` before any model is loaded.
    """
    f = click.option("--attn-implementation", "attn_implementation", default=ATTN_IMPLEMENTATION, metavar="NAME",
                     help="Attention kernel of a Hugging Face model (sdpa, eager, ...; default: the checkpoint's "
                          "own).")(f)
    f = click.option("--device", "device", default=DEVICE, metavar="DEV",
                     help="Where the model runs (cpu, cuda:0, ...; default: where it loads, the CPU).")(f)
    return click.option("--dtype", "dtype", type=click.Choice(DTYPE_NAMES), default=DTYPE, show_default=True,
                        help="Precision the model runs in; auto = the checkpoint's own (its config's "
                             "torch_dtype), so you check what you run.")(f)


def _param_name(option: str, prefix: str) -> str:
    return prefix + option.split("/")[0].lstrip("-").replace("-", "_")


def _decorator(fields: list[tuple[str, str, Any, str]], prefix: str, group: str) -> Callable:
    def apply(f: Callable) -> Callable:
        for option, _field, kind, text in reversed(fields):
            name = _param_name(option, prefix)
            if kind is None:
                f = click.option(option, name, default=None, help=text)(f)
            else:
                f = click.option(option, name, type=kind, default=None, multiple=option == "--task-option",
                                 help=text)(f)
        return f

    apply.__doc__ = f"Add one option per {group} field."
    return apply


model_options = _decorator(MODEL_FIELDS, "model__", "ModelConfig")
train_options = _decorator(TRAIN_FIELDS, "train__", "TrainConfig")


def _value(value: Any) -> Any:
    return None if value is EXPLICIT_NONE else value


def sequences_option(help_text: str) -> Callable[[Callable], Callable]:
    """``--sequences N``: how many sequences the probes read (``help_text`` says whose)."""
    return click.option("--sequences", type=click.IntRange(min=1), default=PROBE_SEQUENCES, show_default=True,
                        help=help_text)


def seeds_option(help_text: str) -> Callable[[Callable], Callable]:
    """``--seeds A,B,...``: the seeds of the random prune orders (``help_text`` says what else they seed)."""
    return click.option("--seeds", type=comma_ints, default=comma(SEEDS), show_default=True, help=help_text)


def preset_option(f: Callable) -> Callable:
    """``--preset NAME``: the configs the other options start from (default: the demo's, ``induction``)."""
    return click.option("--preset", "preset_name", default=None, metavar="NAME",
                        help=f"Named preset to start from: {', '.join(PRESETS)} (default {PRESET}; explicit "
                             "options override its values).")(f)


def model_and_train_configs(values: dict[str, Any], preset_name: Optional[str] = None) -> tuple[Any, Any]:
    """The preset's configs (the demo's, ``induction``, by default) with every option that was given
    applied; the dataclasses validate. An unknown preset is a ValueError listing the known ones."""
    base_model, base_train = preset(PRESET if preset_name is None else preset_name)
    model_changes: dict[str, Any] = {}
    for option, field, _kind, _text in MODEL_FIELDS:
        value = values.pop(_param_name(option, "model__"))
        if value is not None:
            model_changes[field] = NORM_CHOICES[value] if field == "normalization_type" else _value(value)
    if "d_model" in model_changes or "n_heads" in model_changes:
        # d_head and d_mlp default from d_model and n_heads: re-derive them unless given explicitly.
        model_changes.setdefault("d_head", None)
        model_changes.setdefault("d_mlp", None)
    train_changes: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for option, field, _kind, _text in TRAIN_FIELDS:
        value = values.pop(_param_name(option, "train__"))
        if field == "task_options":
            extra = dict(value or ())
        elif value is not None:
            train_changes[field] = _value(value)
    same_task = train_changes.get("task", base_train.task) == base_train.task
    if not same_task:  # the demo's task options and length belong to its task, not the new one
        train_changes.setdefault("seq_len", None)
    if extra or not same_task:
        train_changes["task_options"] = {**(base_train.task_options if same_task else {}), **extra}
    if values:
        raise TypeError(f"unexpected options {sorted(values)}")
    model_cfg = base_model.replace(**model_changes) if model_changes else base_model
    train_cfg = base_train.replace(**train_changes) if train_changes else base_train
    return model_cfg, train_cfg
