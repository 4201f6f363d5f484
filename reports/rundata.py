"""What a run directory holds, read back into DataFrames for the report.

Every stage writes plain files into the run directory, laid out by :class:`harness.run_dir.RunDir`
(see docs/architecture.md), so the report needs no model weights and each stage can be re-run alone.
This module reads them back and checks each has the columns its writer declares.

Stages that have not run leave their section of the report marked "not run" with the command
that fills it in; a file that exists but is unreadable is an error naming the file.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch

from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.transformer import Transformer
from harness.run_dir import RunDir, read_json
from harness.training.checkpoint import read_configs
from harness.training.metrics import CURVES
from probes._validate import KINDS, head_name
from probes.compare import ESTIMATOR_COLUMNS
from probes.importance import METHODS
from probes.roles import ROLES
from properties.saturation import COLUMNS as SATURATION_COLUMNS
from properties.suite import ADDED_COLUMNS
from properties.suite import COLUMNS as PROPERTY_COLUMNS
from reports.defaults import TOLERANCE  # the headline's prune budget: what `attnlab probe` uses by default

_LAYOUT = RunDir(".")  # file names only; RunDir owns the layout
PROPERTIES_CSV, SATURATION_CSV, METRICS_CSV = (_LAYOUT.properties_csv.name, _LAYOUT.saturation_csv.name,
                                               _LAYOUT.metrics_csv.name)
PROBES_DIR, FIGURES_DIR, REDUNDANCY_JSON = _LAYOUT.probes.name, _LAYOUT.figures.name, _LAYOUT.redundancy_json.name
IMPORTANCE_METHODS = METHODS  # one importance file per method, named after it
# The files the probe stage writes into probes/ (reports.pipeline.probe), by key.
PROBE_FILES = {
    **{f"importance_{m}": f"importance_{m}.csv" for m in IMPORTANCE_METHODS},
    "prune_curve": "prune_curve.csv",
    "similarity": "similarity_pattern.csv",
    "head_roles": "head_roles.csv",
    "attention_entropy": "attention_entropy.csv",
    "patterns": "patterns.csv",
    "example": "example_tokens.csv",
    "example_source": "example_source_tokens.csv",  # an encoder-decoder's: the example's source
    "heal": "heal.csv",  # written by the heal stage (reports.heal)
    "estimators": "estimators.csv",  # probes.compare_estimators
    "manifest": "manifest.json",  # reports.probe_run.manifest: what a probe run was made from, what finished
}
ACCURACY_DROP = 0.01  # the second reading of the prune curve: accuracy may fall by at most 1 point
INDUCTION_THRESHOLD = 0.5  # induction score above which a head counts as an induction head (Olsson et al. 2022)

# The columns a reader needs from each file; each list is owned by the module that writes the file.
COLUMNS = {
    METRICS_CSV: CURVES,
    PROPERTIES_CSV: tuple(c for c in PROPERTY_COLUMNS if c not in ADDED_COLUMNS),  # older files lack those
    SATURATION_CSV: tuple(SATURATION_COLUMNS),
    "importance": ("layer", "head", "importance", "loss_delta"),
    "prune_curve": ("order", "seed", "n_pruned", "fraction_pruned", "loss", "accuracy"),
    "head_roles": ("layer", "head", *ROLES),
    "attention_entropy": ("layer", "head", "entropy", "max_prob"),
    "patterns": ("layer", "head", "rank", "query", "key", "weight"),
    "example": ("position", "token"),
    "example_source": ("position", "token", "real"),
    "heal": ("order", "seed", "n_pruned", "fraction_pruned", "stage", "loss", "accuracy"),
    "estimators": ESTIMATOR_COLUMNS,
}


def read_csv(path: Path, columns: tuple[str, ...], *, index_col: Optional[int] = None) -> pd.DataFrame:
    """A CSV file with at least ``columns``; any damage is a ValueError naming the file."""
    try:
        df = pd.read_csv(path, index_col=index_col)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise AttnlabError(f"{path} is not a readable CSV file: {exc}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise AttnlabError(f"{path} lacks column(s) {missing}: expected {list(columns)}")
    return df


def _optional_csv(path: Path, columns: tuple[str, ...], **kw: Any) -> Optional[pd.DataFrame]:
    return read_csv(path, columns, **kw) if path.exists() else None


def require_run_dir(run_dir: Any) -> Path:
    """``run_dir`` as a Path if it is an existing folder holding a trained run; else a clear error."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise AttnlabTypeError(f"run_dir must be a path, got {type(run_dir).__name__}")
    path = Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"run directory {path} does not exist (create one with `attnlab train --out {path}`)")
    if not path.is_dir():
        raise AttnlabError(f"run directory {path} is a file: expected a folder made by `attnlab train`")
    return path


def parameter_counts(model: Any) -> dict[str, int]:
    """Parameters by part: embeddings, attention, MLP, norms, unembedding (tied weights counted once)."""
    seen, counts = set(), {"embedding": 0, "attention": 0, "mlp": 0, "norms": 0, "unembedding": 0}
    for name, p in model.named_parameters():  # named_parameters already skips a tied duplicate
        if id(p) in seen:
            continue
        seen.add(id(p))
        parts = name.split(".")
        part = ("attention" if "attn" in parts else "mlp" if "mlp" in parts
                else "norms" if any(x.startswith("ln") for x in parts)
                else "unembedding" if parts[0] == "unembed" else "embedding")
        counts[part] += p.numel()
    counts["total"] = sum(counts.values())
    return counts


@dataclass
class RunData:
    """Everything the report shows, as read from one run directory."""

    run_dir: Path
    name: str
    model_config: Any
    train_config: Any
    params: dict[str, int]
    metrics: pd.DataFrame
    properties: Optional[pd.DataFrame] = None
    saturation: Optional[pd.DataFrame] = None
    importance: dict[str, pd.DataFrame] = field(default_factory=dict)
    prune_curve: Optional[pd.DataFrame] = None
    redundancy: Optional[dict] = None
    similarity: Optional[pd.DataFrame] = None
    head_roles: Optional[pd.DataFrame] = None
    attention_entropy: Optional[pd.DataFrame] = None
    patterns: Optional[pd.DataFrame] = None
    example_tokens: Optional[list[int]] = None
    example_source: Optional[list[int]] = None  # an encoder-decoder's: the example's source tokens
    heal: Optional[pd.DataFrame] = None
    model_card: Optional[dict] = None  # model.json of a model from outside attnlab (then no configs, no metrics)
    estimators: Optional[pd.DataFrame] = None
    probe_manifest: Optional[dict] = None  # probes/manifest.json (reports.probe_run.manifest): plan and finished

    @property
    def has_probes(self) -> bool:
        return bool(self.importance) or self.prune_curve is not None or self.head_roles is not None

    @property
    def stacks(self) -> list[str]:
        """The kinds of heads the probe files name (an encoder-decoder's ``encoder``, ``decoder``, ``cross``, in
        that order); empty for a decoder-only model, whose files have no ``kind`` column."""
        frames = [*self.importance.values(), self.head_roles, self.attention_entropy, self.patterns]
        seen = {str(k) for f in frames if f is not None and "kind" in f for k in f["kind"].dropna()}
        return [kind for kind in KINDS if kind in seen]


def load(run_dir: Any) -> RunData:
    """Read a run directory; the checkpoint's config and metrics.csv are required, the rest optional.

    A run directory of a model from outside attnlab (``attnlab check --hf/--model``) has
    ``model.json`` instead of a checkpoint and no metrics: its card stands in for the configs.
    """
    path = require_run_dir(run_dir)
    layout = RunDir(path)
    if layout.model_json.exists() and not layout.checkpoint.exists():
        card = read_json(layout.model_json)
        if not isinstance(card, dict):
            raise AttnlabError(f"{layout.model_json} is not a JSON object: expected the model card attnlab check "
                               f"--hf/--model writes")
        params = {"total": card["parameters"]} if isinstance(card.get("parameters"), int) else {}
        return _load_stages(RunData(run_dir=path, name=path.resolve().name, model_config=None, train_config=None,
                                    params=params, metrics=pd.DataFrame(columns=list(COLUMNS[METRICS_CSV])),
                                    model_card=card))
    return _load_trained(path)


def _load_trained(path: Path) -> RunData:
    model_cfg, train_cfg = read_configs(path)
    with torch.device("meta"):  # counting parameters needs shapes, not memory
        params = parameter_counts(Transformer(model_cfg))
    layout = RunDir(path)
    metrics = read_csv(layout.metrics_csv, COLUMNS[METRICS_CSV])
    # Damaged values would otherwise surface as an unnamed pandas or plotting error.
    text = [c for c in COLUMNS[METRICS_CSV] if not pd.api.types.is_numeric_dtype(metrics[c])]
    if text or metrics.empty or metrics["step"].isna().any():
        what = ("no rows" if metrics.empty else f"non-numeric values in column(s) {text}" if text
                else "rows without a step")
        raise AttnlabError(f"{layout.metrics_csv} has {what}: expected one numeric row per logged training step")
    return _load_stages(RunData(run_dir=path, name=path.resolve().name, model_config=model_cfg,
                                train_config=train_cfg, params=params, metrics=metrics))


def _load_stages(data: RunData) -> RunData:
    """The analysis stages' files (each optional) into ``data``."""
    layout = RunDir(data.run_dir)
    data.properties = _optional_csv(layout.properties_csv, COLUMNS[PROPERTIES_CSV])
    if data.properties is not None:
        for column in ADDED_COLUMNS:  # a file from before the precision or cost columns: nothing was measured
            if column not in data.properties:
                data.properties[column] = math.nan
    data.saturation = _optional_csv(layout.saturation_csv, COLUMNS[SATURATION_CSV])
    for method in IMPORTANCE_METHODS:
        df = _optional_csv(layout.probe_file(PROBE_FILES[f"importance_{method}"]), COLUMNS["importance"])
        if df is not None:
            data.importance[method] = df
    for key in ("prune_curve", "head_roles", "attention_entropy", "patterns", "heal", "estimators"):
        setattr(data, key, _optional_csv(layout.probe_file(PROBE_FILES[key]), COLUMNS[key]))
    data.similarity = _optional_csv(layout.probe_file(PROBE_FILES["similarity"]), (), index_col=0)
    if data.similarity is not None and list(data.similarity.index) != list(data.similarity.columns):
        raise AttnlabError(f"{layout.probe_file(PROBE_FILES['similarity'])} is not a square head-by-head table")
    example = _optional_csv(layout.probe_file(PROBE_FILES["example"]), COLUMNS["example"])
    data.example_tokens = None if example is None else [int(t) for t in example.sort_values("position")["token"]]
    source = _optional_csv(layout.probe_file(PROBE_FILES["example_source"]), COLUMNS["example_source"])
    data.example_source = None if source is None else [int(t) for t in source.sort_values("position")["token"]]
    if layout.redundancy_json.exists():
        data.redundancy = read_json(layout.redundancy_json)
    manifest = layout.probe_file(PROBE_FILES["manifest"])
    if manifest.exists():
        data.probe_manifest = read_json(manifest)
    return data


def probe_status(data: RunData) -> Optional[dict[str, list[str]]]:
    """A probe run that is partial or planned down: its ``missing`` methods (planned, not finished) and the
    plan's ``notes`` (what a budget replaced or dropped); None for a whole run or one without a manifest."""
    m = data.probe_manifest
    if not isinstance(m, dict):
        return None
    finished = m.get("finished") or {}
    missing = [str(s.get("method")) for s in m.get("plan") or [] if s.get("method") not in finished]
    notes = [str(n) for n in m.get("notes") or []]
    return {"missing": missing, "notes": notes} if missing or notes else None


def _last(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.iloc[-1]) if len(s) else math.nan


def induction_heads(head_roles: pd.DataFrame, threshold: float = INDUCTION_THRESHOLD) -> list[str]:
    strong = head_roles[head_roles["induction"] > threshold].sort_values("induction", ascending=False)
    return [head_name(getattr(r, "kind", None), r.layer, r.head) for r in strong.itertuples()]


def prunable_by_accuracy(curve: pd.DataFrame, drop: float = ACCURACY_DROP) -> dict[str, float]:
    """Fraction of heads each prune order removes before accuracy first falls ``drop`` below the unpruned one.

    A loss budget relative to a near-zero loss (a model that has solved its task) allows almost
    nothing, so the report also reads the prune curve by accuracy. Random orders are averaged over
    seeds. The resolution is the curve's own grid of head counts.
    """
    out: dict[str, float] = {}
    n_heads = float(curve["n_pruned"].max())
    if n_heads <= 0:
        return out
    for order, part in curve.groupby("order"):
        fractions = []
        for _, one in part.groupby(part["seed"].fillna(-1)):
            one = one.sort_values("n_pruned")
            limit = float(one["accuracy"].iloc[0]) - drop
            below = one[one["accuracy"] < limit]
            last_ok = one[one["n_pruned"] < below["n_pruned"].min()] if len(below) else one
            fractions.append(float(last_ok["n_pruned"].max()) / n_heads)
        out[str(order)] = sum(fractions) / len(fractions)
    return out


def property_status(applicable: Any, passed: Any) -> str:
    """A properties.csv row's status from ``applicable``/``passed`` (files written before the status column)."""
    if not _truthy(applicable):
        return "n/a"
    if passed is None or (isinstance(passed, float) and math.isnan(passed)):
        return "unobservable"
    return "pass" if _truthy(passed) else "fail"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0")


def headline(data: RunData) -> dict[str, Any]:
    """The numbers the report opens with; None where the stage behind one has not run."""
    out: dict[str, Any] = {
        "final_accuracy": _last(data.metrics["val_accuracy"]),
        "final_val_loss": _last(data.metrics["val_loss"]),
        "steps": int(data.metrics["step"].max()) if len(data.metrics) else 0,
        "properties_passed": None, "properties_applicable": None, "properties_failed": [],
        "properties_unobservable": [],
        "prunable_fraction": None, "random_prunable_fraction": None, "tolerance": TOLERANCE,
        "induction_heads": None, "accuracy_drop": ACCURACY_DROP,
        "accuracy_drop_label": f"{ACCURACY_DROP * 100:g} accuracy point{'' if ACCURACY_DROP == 0.01 else 's'}",
        "prunable_by_accuracy": None, "random_prunable_by_accuracy": None,
    }
    if data.properties is not None:
        df = data.properties
        status = df["status"] if "status" in df else pd.Series(
            [property_status(a, p) for a, p in zip(df["applicable"], df["passed"], strict=True)], index=df.index)
        names = df["property"].astype(str)
        # "applicable" in the headline counts what was checked: an unobservable row is listed, not failed
        out.update(properties_passed=int((status == "pass").sum()),
                   properties_applicable=int(status.isin(["pass", "fail"]).sum()),
                   properties_failed=list(names[status == "fail"]),
                   properties_unobservable=list(names[status == "unobservable"]))
    if data.redundancy is not None:
        out["prunable_fraction"] = data.redundancy.get("prunable_fraction")
        out["random_prunable_fraction"] = data.redundancy.get("random_prunable_fraction")
        out["tolerance"] = data.redundancy.get("tolerance", TOLERANCE)
    if data.prune_curve is not None:
        by_acc = prunable_by_accuracy(data.prune_curve)
        out["prunable_by_accuracy"] = by_acc.get("importance")
        out["random_prunable_by_accuracy"] = by_acc.get("random")
    if data.head_roles is not None:
        out["induction_heads"] = induction_heads(data.head_roles)
    return out
