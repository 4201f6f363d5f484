"""Render a run directory into ``report.html`` (self-contained) and ``report.md`` (its twin).

The HTML embeds every figure as a base64 PNG and carries its own CSS, so it renders offline
from a single file. Text from configs, paths and tasks is untrusted: the HTML environment
autoescapes every ``{{ }}`` (jinja2 ``autoescape``), and the Markdown environment passes every
value through :func:`md_escape` (``finalize``), so a run named ``<script>`` shows as text.
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Optional

import jinja2
import pandas as pd
from markupsafe import Markup
from PIL import Image  # matplotlib's own dependency: reads back the figures' sizes

from harness.run_dir import RunDir, atomic_write_text
from reports import figures as plots  # not `F`: that reads as torch.nn.functional
from reports import figures_heads as head_plots
from reports import figures_precision as precision_plot
from reports import rundata
from reports.format import fmt, pct
from reports.rundata import RunData
from reports.tables import estimator_rows, heal_rows, not_applicable_roles, redundancy_rows, stack_rows, top_heads

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    figures: tuple[Path, ...]


@dataclass(frozen=True)
class FigureInfo:
    key: str
    title: str
    caption: str
    file: str  # relative to the run directory (what report.md links)
    b64: str  # the PNG, base64 (what report.html embeds)
    width: int
    height: int


# --- escaping and formatting -------------------------------------------------------------------
def md_escape(value: Any) -> Markup:
    """Neutralise HTML and table syntax in a value bound for Markdown (renderers pass raw HTML through).

    Markup (a macro's output, already escaped piece by piece) passes unchanged.
    """
    if isinstance(value, Markup):
        return value
    text = "" if value is None else str(value)
    text = html.escape(text, quote=False).replace("|", "\\|")
    return Markup(" ".join(text.splitlines()))


def _environment(kind: str) -> jinja2.Environment:
    common: dict[str, Any] = {"loader": jinja2.FileSystemLoader(str(TEMPLATES)), "undefined": jinja2.StrictUndefined,
                              "trim_blocks": True, "lstrip_blocks": True, "keep_trailing_newline": True}
    # Both autoescape, so macro output is Markup and is not escaped twice; Markdown swaps the HTML
    # escaping for md_escape, which also escapes table pipes and leaves quotes readable.
    env = (jinja2.Environment(autoescape=True, **common) if kind == "html"
           else jinja2.Environment(autoescape=True, finalize=md_escape, **common))
    env.filters["fmt"] = fmt
    env.filters["pct"] = pct
    return env


# --- figures -----------------------------------------------------------------------------------
def _figure_specs(data: RunData) -> list[tuple[str, str, str, Callable[[], Any]]]:
    """(key, title, caption, build) for every figure the data supports, in report order."""
    specs: list[tuple[str, str, str, Callable[[], Any]]] = [
        ("training", "Training curves", "Train and validation loss, validation accuracy on the "
         "task's target positions, and the learning-rate schedule.", lambda: plots.training_curves(data.metrics)),
    ] if len(data.metrics) else []  # a model from outside attnlab (model.json) has no training curves
    if data.saturation is not None:
        specs.append(("saturation", "Softmax saturation versus d_head",
                      "Freshly initialised attention on unit-variance inputs; log-log axes, band = spread over "
                      "seeds. Without the 1/sqrt(d_head) scale the score variance grows like d_head and the "
                      "softmax saturates (Vaswani et al. 2017, section 3.2.1).",
                      lambda: plots.saturation(data.saturation)))
    if data.properties is not None and not precision_plot.plotted_rows(data.properties).empty:
        specs.append(("precision", "How close each verdict was", "Each numeric property's worst deviation against "
                      "its allowance, which is measured from this model's rounding noise at its dtype (4 x the "
                      "deviation of what the check read from a float64 twin; docs/precision.md). Log axes; rows "
                      "above the dashed line y = x fail.", lambda: precision_plot.precision_margins(data.properties)))
    if data.importance:
        specs.append(("importance", "Head importance", "Loss change when each head is removed (ablation: output "
                      "set to zero; mean ablation: replaced by its per-position mean) and the gradient estimate "
                      "of Michel, Levy & Neubig (2019).", lambda: head_plots.importance_heatmaps(data.importance)))
    if data.prune_curve is not None:
        tol = (data.redundancy or {}).get("tolerance", rundata.TOLERANCE)
        specs.append(("prune_curve", "Pruning curve", "Heads removed cumulatively, least important first, "
                      "against random order; band = spread over seeds; dashed line = the loss budget of the "
                      "headline.", lambda: plots.prune_curve(data.prune_curve, tolerance=float(tol))))
    if data.similarity is not None:
        specs.append(("similarity", "Head similarity", "1 - mean Jensen-Shannon divergence between the heads' "
                      "attention patterns, ordered by average-linkage clustering.",
                      lambda: head_plots.similarity_clustermap(data.similarity)))
    if data.head_roles is not None:
        specs.append(("head_roles", "Head roles", "Attention mass each head puts on the previous token, on the "
                      "token after an earlier copy of the current one (induction), on an earlier copy of itself, "
                      "and on the first position.", lambda: head_plots.head_roles(data.head_roles)))
    if data.attention_entropy is not None:
        specs.append(("attention_entropy", "Attention entropy", "Mean entropy of each head's attention rows and "
                      "its mean largest weight.", lambda: head_plots.attention_entropy(data.attention_entropy)))
    if data.patterns is not None:
        specs.append(("patterns", "Attention patterns of the most important heads", "One validation example; "
                      "rows are queries, columns keys.",
                      lambda: head_plots.attention_patterns(data.patterns, data.example_tokens,
                                                            data.example_source)))
    if data.estimators is not None:
        specs.append(("estimators", "Importance estimators against the exact answer", "Each estimator's head "
                      "ranking against exact leave-one-out ablation (rank correlation), the heads its order prunes "
                      "within each loss budget, and its cost in passes over the data (labels: seconds). Exact "
                      "ablation agrees with itself by construction.", lambda: plots.estimators(data.estimators)))
    if data.heal is not None:
        specs.append(("heal", "Prune, then heal", "Loss and accuracy on the probe batch with heads pruned (solid: "
                      "least important first by gradient importance; dashed: random orders), before healing, "
                      "after fine-tuning on the labels and after distilling from the unpruned run (Hinton et al. "
                      "2015), the pruned heads held at zero throughout.", lambda: plots.heal_curves(data.heal)))
    return specs


def _make_figures(data: RunData, layout: RunDir) -> list[FigureInfo]:
    layout.figures.mkdir(exist_ok=True)
    out = []
    for key, title, caption, build in _figure_specs(data):
        path = layout.figure(key)
        png = plots.save_png(build(), path)
        with Image.open(path) as im:
            width, height = im.size
        out.append(FigureInfo(key, title, caption, path.relative_to(layout.path).as_posix(),
                              base64.b64encode(png).decode("ascii"), width, height))
    return out


# --- context -----------------------------------------------------------------------------------
def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in df.to_dict("records")]


def _properties_rows(df: pd.DataFrame) -> list[dict]:
    rows = []
    for r in _records(df):
        status = r.get("status") or rundata.property_status(r["applicable"], r["passed"])
        rows.append({**r, "status": status, "reason": r.get("reason") or ""})
    order = {"fail": 0, "unobservable": 1, "pass": 2, "n/a": 3}
    return sorted(rows, key=lambda r: order[r["status"]])


def card_rows(card: dict[str, Any]) -> list[tuple[str, Any]]:
    """The model card of a model from outside attnlab: where it came from, its adapter, then its design facts."""
    raw = card.get("design")
    design: dict[str, Any] = raw if isinstance(raw, dict) else {}
    top = [(k, v) for k, v in card.items() if k != "design" and v is not None]
    return top + [(k, v) for k, v in sorted(design.items()) if k not in card]


def source_args(card: Optional[dict[str, Any]]) -> str:
    """What `attnlab check`/`probe` need before the run directory to re-run a stage: nothing for a trained
    run, ``--hf PATH --out `` or ``--model SPEC --out `` for a model from outside attnlab."""
    if card is None:
        return ""
    if card.get("source") == "hf":
        return f"--hf {card.get('path')} --out "
    return f"--model {card.get('factory')} --out "


def attnlab_version() -> str:
    """The installed attnlab's version, or ``0+unknown`` in a source tree that is not installed."""
    try:
        return version("attnlab")
    except PackageNotFoundError:
        return "0+unknown"


def context(data: RunData, figures: list[FigureInfo]) -> dict[str, Any]:
    """Everything the templates show (values raw; the templates escape and format)."""
    ver = attnlab_version()
    final = data.metrics.iloc[-1].to_dict() if len(data.metrics) else {}
    last_val = data.metrics.dropna(subset=["val_loss"])
    train_rows = [("steps", int(final.get("step", 0))),
                  ("final train loss", final.get("train_loss")),
                  ("final validation loss", float(last_val["val_loss"].iloc[-1]) if len(last_val) else None),
                  ("final validation accuracy", float(last_val["val_accuracy"].iloc[-1]) if len(last_val) else None)]
    for col, label, how in (("elapsed_s", "training time (s)", fmt), ("tokens_per_s", "throughput (tokens/s)", fmt),
                            ("mfu", "model FLOP utilisation", pct)):
        if col in data.metrics.columns and data.metrics[col].notna().any():
            train_rows.append((label, how(float(data.metrics[col].dropna().iloc[-1]))))
    card = data.model_card
    if card is not None:
        train_rows = [("training", "none here: a model from outside attnlab (see the model card)")]
    slopes = None
    if data.saturation is not None:
        sat = data.saturation
        slopes = [(label, plots.loglog_slope_or_nan(sat[sat["scaled"].astype(bool) == scaled], "score_var"),
                   plots.loglog_slope_or_nan(sat[sat["scaled"].astype(bool) == scaled], "entropy"))
                  for scaled, label in ((True, "scaled"), (False, "unscaled"))]
    return {
        "name": data.name, "task": data.train_config.task if card is None else "no",
        "run_dir": str(data.run_dir.resolve()), "version": ver,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "headline": rundata.headline(data),
        "model_config": sorted(data.model_config.to_dict().items()) if card is None else card_rows(card),
        "train_config": sorted(data.train_config.to_dict().items()) if card is None else [],
        "params": list(data.params.items()),
        "train_rows": train_rows,
        "source_args": source_args(card),
        "properties": None if data.properties is None else _properties_rows(data.properties),
        "slopes": slopes,
        "redundancy": None if data.redundancy is None else redundancy_rows(data.redundancy),
        "top_heads": top_heads(data),
        "stacks": stack_rows(data),
        "stacks_note": head_plots.STACKS_NOTE if data.stacks else "",
        "na_roles": not_applicable_roles(data),
        "has_probes": data.has_probes,
        "probe_status": rundata.probe_status(data),
        "heal_rows": heal_rows(data.heal),
        "estimator_rows": estimator_rows(data.estimators),
        "figures": {f.key: f for f in figures},
        "sections": [("headline", "Headline"), ("model", "Model card"), ("training", "Training"),
                     ("properties", "Properties"), ("saturation", "Softmax saturation"), ("heads", "Heads"),
                     *([("estimators", "Estimators")] if data.estimators is not None else []),
                     *([("heal", "Prune, then heal")] if data.heal is not None else [])],
    }


def render(run_dir: str | os.PathLike) -> ReportPaths:
    """Write ``report.html``, ``report.md`` and ``figures/*.png`` into ``run_dir``; returns their paths."""
    data = rundata.load(run_dir)
    layout = RunDir(data.run_dir)
    figs = _make_figures(data, layout)
    ctx = context(data, figs)
    html_path, md_path = layout.report_html, layout.report_md
    atomic_write_text(html_path, _environment("html").get_template("report.html.j2").render(**ctx))
    atomic_write_text(md_path, _environment("md").get_template("report.md.j2").render(**ctx))
    return ReportPaths(html_path, md_path, tuple(data.run_dir / f.file for f in figs))
