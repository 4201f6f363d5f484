"""Seaborn figures from the DataFrames the other packages produce.

Every function takes plain DataFrames (as read back from a run directory's CSV files) and
returns a :class:`matplotlib.figure.Figure`. Figures are built on the Agg canvas directly,
never through ``pyplot``: no global figure registry to leak, no GUI backend needed, and a
notebook user's backend is left alone (a returned Figure still displays inline there).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from harness.errors import AttnlabError, AttnlabTypeError
from harness.run_dir import atomic_write_bytes
from harness.training.metrics import CURVES
from properties.saturation import COLUMNS as SWEEP_COLUMNS

DPI = 110
ORDER_COLORS = {"importance": "#0072B2", "random": "#D55E00"}
SCALED_LABELS = {True: "scaled (÷√d_head)", False: "unscaled"}


@contextlib.contextmanager
def _style(grid: bool = True) -> Iterator[None]:
    with sns.axes_style("whitegrid" if grid else "white"), sns.plotting_context("notebook", font_scale=0.9):
        yield


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _require(df: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise AttnlabTypeError(f"{what}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise AttnlabError(f"{what}: missing column(s) {missing}; expected columns {list(columns)}")
    if df.empty:
        raise AttnlabError(f"{what}: the DataFrame is empty")


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (what the HTML report embeds)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def save_png(fig: Figure, path: str | Path) -> bytes:
    """Write the figure to ``path`` as PNG and return the bytes written."""
    data = png_bytes(fig)
    atomic_write_bytes(path, data)
    return data


def _wide_positive(values: pd.Series) -> bool:
    """Whether a log axis helps: all positive and spanning more than a factor of 3."""
    v = values.dropna()
    return len(v) > 0 and bool((v > 0).all()) and float(v.max()) > 3 * float(v.min())


def _log_y(ax, values: pd.Series) -> None:
    """Log y axis labelled in plain numbers; minor ticks get labels only when the data span under a decade."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    v = values[values > 0]
    narrow = len(v) > 0 and float(v.max()) < 10 * float(v.min())
    ax.yaxis.set_minor_formatter(plain if narrow else NullFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=7)


# --- training -----------------------------------------------------------------------------
METRIC_COLUMNS = CURVES  # owned by harness.training.metrics, the writer of metrics.csv


def training_curves(metrics: pd.DataFrame) -> Figure:
    """Loss (train and validation), validation accuracy and learning rate against step."""
    _require(metrics, METRIC_COLUMNS, "training_curves")
    with _style():
        fig = _figure(11, 3.4)
        ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
        ax_loss.plot(metrics["step"], metrics["train_loss"], label="train", color="#0072B2", lw=1.2)
        val = metrics.dropna(subset=["val_loss"])
        ax_loss.plot(val["step"], val["val_loss"], "o-", label="validation", color="#D55E00", ms=3, lw=1.2)
        ax_loss.set(xlabel="step", ylabel="cross-entropy (nats)", title="Loss")
        if _wide_positive(metrics["train_loss"]):
            _log_y(ax_loss, metrics["train_loss"])
        ax_loss.legend(frameon=False)
        acc = metrics.dropna(subset=["val_accuracy"])
        ax_acc.plot(acc["step"], acc["val_accuracy"], "o-", color="#009E73", ms=3, lw=1.2)
        ax_acc.set(xlabel="step", ylabel="accuracy on target positions", title="Validation accuracy",
                   ylim=(-0.02, 1.02))
        ax_lr.plot(metrics["step"], metrics["lr"], color="#CC79A7", lw=1.2)
        ax_lr.set(xlabel="step", ylabel="learning rate", title="Learning-rate schedule")
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    return fig


# --- softmax saturation -------------------------------------------------------------------
SATURATION_COLUMNS = tuple(SWEEP_COLUMNS)  # owned by properties.saturation, the writer of saturation.csv


def loglog_slope_or_nan(df: pd.DataFrame, value: str) -> float:
    """Least-squares slope of log(mean value over seeds) against log(d_head), over the positive means.

    NaN, not an error, where fewer than two d_head values are left: a figure legend or a report
    line then reads "nan". The checked version is :func:`properties.saturation.loglog_slope`.
    """
    means = df.groupby("d_head")[value].mean()
    means = means[means > 0]
    if len(means) < 2:
        return float("nan")
    return float(np.polyfit(np.log(means.index.to_numpy(float)), np.log(means.to_numpy(float)), 1)[0])


def saturation(df: pd.DataFrame) -> Figure:
    """Score variance, attention entropy, max probability and softmax-Jacobian norm against d_head.

    Log-log axes, scaled vs unscaled, with the seed spread as a band. Unscaled dot products of
    unit-variance vectors have variance d_head, so the softmax saturates as d_head grows; dividing
    by sqrt(d_head) keeps the variance at 1 (Vaswani et al. 2017, section 3.2.1 and footnote 4).
    """
    _require(df, SATURATION_COLUMNS, "saturation")
    df = df.assign(scaling=df["scaled"].astype(bool).map(SCALED_LABELS))
    panels = (("score_var", "score variance", "Score variance"),
              ("entropy", "attention entropy (nats)", "Attention entropy"),
              ("max_prob", "largest attention weight", "Largest weight"),
              ("jacobian_norm", "softmax Jacobian norm", "Softmax Jacobian norm"))
    palette = {SCALED_LABELS[True]: "#0072B2", SCALED_LABELS[False]: "#D55E00"}
    with _style():
        fig = _figure(11, 3.5)
        for ax, (col, label, title) in zip(fig.subplots(1, 4), panels, strict=True):
            sns.lineplot(df, x="d_head", y=col, hue="scaling", palette=palette, marker="o", ax=ax,
                         errorbar=("pi", 100), legend=col == "score_var")
            ax.set_xscale("log", base=2)
            d_heads = sorted(df["d_head"].unique())
            ax.set_xticks(d_heads, [str(int(d)) for d in d_heads])
            ax.minorticks_off()
            if (df[col] > 0).all():
                _log_y(ax, df[col])
            ax.set(xlabel="d_head", ylabel=label, title=title)
        first = fig.axes[0]
        handles, labels = first.get_legend_handles_labels()
        legend = first.get_legend()
        if legend is not None:
            legend.remove()
        slopes = {SCALED_LABELS[True]: loglog_slope_or_nan(df[df["scaled"].astype(bool)], "score_var"),
                  SCALED_LABELS[False]: loglog_slope_or_nan(df[~df["scaled"].astype(bool)], "score_var")}
        labels = [f"{lab}: score-variance slope {slopes[lab]:.2f}" if lab in slopes else lab for lab in labels]
        fig.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    return fig


# --- pruning ------------------------------------------------------------------------------
def prune_curve(df: pd.DataFrame, tolerance: float = 0.01) -> Figure:
    """Loss and accuracy as heads are pruned cumulatively: by importance against random order.

    The band is the full spread (min to max) over seeds; the dashed line is the unpruned loss
    raised by ``tolerance`` (relative), the budget behind the "prunable fraction" headline.
    """
    _require(df, ("order", "seed", "fraction_pruned", "loss", "accuracy"), "prune_curve")
    palette = {o: ORDER_COLORS.get(o, "#555555") for o in df["order"].unique()}
    base = df.loc[df["fraction_pruned"] == df["fraction_pruned"].min(), "loss"].mean()
    with _style():
        fig = _figure(10, 3.4)
        ax_loss, ax_acc = fig.subplots(1, 2)
        for ax, col, label in ((ax_loss, "loss", "loss (nats)"), (ax_acc, "accuracy", "accuracy")):
            sns.lineplot(df, x="fraction_pruned", y=col, hue="order", palette=palette, marker="o",
                         errorbar=("pi", 100), ax=ax, legend=col == "loss")
            ax.set(xlabel="fraction of heads pruned", ylabel=label)
        ax_loss.axhline(base * (1 + tolerance), ls="--", color="#444444", lw=1,
                        label=f"unpruned loss + {tolerance:.0%}")
        ax_loss.set_title("Loss as heads are pruned")
        ax_acc.set_title("Accuracy as heads are pruned")
        ax_loss.legend(frameon=False)
        if _wide_positive(df["loss"]):
            _log_y(ax_loss, df["loss"])
    return fig


STAGE_COLORS = {"before": "#888888", "fine-tuned": "#009E73", "distilled": "#CC79A7"}


def heal_curves(df: pd.DataFrame) -> Figure:
    """Loss and accuracy of pruned models before healing, after fine-tuning and after distillation.

    Solid lines: heads pruned least important first; dashed: random orders (band = spread over seeds).
    """
    _require(df, ("order", "seed", "fraction_pruned", "stage", "loss", "accuracy"), "heal_curves")
    stages = [s for s in STAGE_COLORS if s in set(df["stage"])] + sorted(set(df["stage"]) - set(STAGE_COLORS))
    palette = {s: STAGE_COLORS.get(s, "#555555") for s in stages}
    dashes = {"importance": "", "random": (4, 2)}
    with _style():
        fig = _figure(10, 3.4)
        ax_loss, ax_acc = fig.subplots(1, 2)
        for ax, col, label in ((ax_loss, "loss", "loss (nats)"), (ax_acc, "accuracy", "accuracy")):
            sns.lineplot(df, x="fraction_pruned", y=col, hue="stage", hue_order=stages, palette=palette,
                         style="order", dashes={o: dashes.get(o, (1, 1)) for o in df["order"].unique()},
                         marker="o", errorbar=("pi", 100), ax=ax, legend=col == "loss")
            ax.set(xlabel="fraction of heads pruned", ylabel=label)
        ax_loss.set_title("Loss: pruned, fine-tuned, distilled")
        ax_acc.set_title("Accuracy: pruned, fine-tuned, distilled")
        ax_loss.legend(frameon=False, fontsize="small")
        if _wide_positive(df["loss"]):
            _log_y(ax_loss, df["loss"])
    return fig


def estimators(df: pd.DataFrame) -> Figure:
    """Importance estimators against exact leave-one-out (``probes.compare_estimators``).

    Left: rank correlation (Spearman, Kendall tau-b) with the exact loss change; middle: fraction
    of heads each order prunes within each loss budget; right: cost in whole-data passes (forward +
    backward), log scale, each bar labelled with its seconds.
    """
    _require(df, ("method", "spearman", "kendall", "budget", "prunable_fraction", "seconds", "forward_passes",
                  "backward_passes"), "estimators")
    methods = list(dict.fromkeys(df["method"]))
    one = df.drop_duplicates("method").set_index("method").loc[methods]
    corr = one[["spearman", "kendall"]].reset_index().melt(id_vars="method", var_name="rank correlation",
                                                           value_name="value")
    with _style():
        fig = _figure(13, 3.6)
        ax_corr, ax_prune, ax_cost = fig.subplots(1, 3)
        sns.barplot(corr, x="method", y="value", hue="rank correlation", order=methods, ax=ax_corr,
                    palette=["#0072B2", "#56B4E9"])
        ax_corr.set(ylim=(-1, 1.05), xlabel="", ylabel="correlation with exact", title="Rank agreement")
        ax_corr.axhline(0, color="#444444", lw=0.8)
        ax_corr.legend(frameon=False, fontsize="small")
        budgets = df.assign(budget=[f"{b:.0%}" if b >= 0.01 else f"{b:.1%}" for b in df["budget"]])
        sns.barplot(budgets, x="method", y="prunable_fraction", hue="budget", order=methods, ax=ax_prune,
                    palette="crest")
        # headroom above 1 for the legend: bars often reach 1 (every head prunable within the budget)
        ax_prune.set(ylim=(0, 1.3), yticks=[0, 0.25, 0.5, 0.75, 1], xlabel="", ylabel="fraction of heads prunable",
                     title="Prunable within budget")
        ax_prune.legend(title="loss budget", frameon=False, fontsize="small", loc="upper center", ncol=3)
        passes = one["forward_passes"] + one["backward_passes"]
        ax_cost.bar(methods, passes.clip(lower=1e-3).to_numpy(), color="#999999")
        for x, (p, s) in enumerate(zip(passes, one["seconds"], strict=True)):
            ax_cost.annotate(f"{s:.2g} s", (x, max(p, 1e-3)), ha="center", va="bottom", fontsize="small")
        ax_cost.set_yscale("log")
        ax_cost.set(ylabel="passes over the data (fwd + bwd)", title="Cost")
        for ax in (ax_corr, ax_prune, ax_cost):
            ax.tick_params(axis="x", labelrotation=30)
    return fig
