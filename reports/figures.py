"""Seaborn figures from the DataFrames the other packages produce.

Every function takes plain DataFrames (as read back from a run directory's CSV files) and
returns a :class:`matplotlib.figure.Figure`. Figures are built on the Agg canvas directly,
never through ``pyplot``: no global figure registry to leak, no GUI backend needed, and a
notebook user's backend is left alone (a returned Figure still displays inline there).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
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
from probes.roles import ROLES
from properties.saturation import COLUMNS as SWEEP_COLUMNS
from reports.cluster import average_linkage

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


def head_label(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def _layer_head_matrix(df: pd.DataFrame, value: str) -> pd.DataFrame:
    m = df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean")
    return m.sort_index().sort_index(axis=1)


def _heatmap(ax, matrix: pd.DataFrame, *, cmap: str, label: str, center=None, vmin=None, vmax=None,
             fmt: str = ".3g") -> None:
    annotate = matrix.size <= 96  # numbers stay legible up to about 12 x 8 cells
    sns.heatmap(matrix, ax=ax, cmap=cmap, center=center, vmin=vmin, vmax=vmax, annot=annotate, fmt=fmt,
                annot_kws={"fontsize": 7}, linewidths=0.5, linecolor="white", square=False,
                cbar_kws={"label": label, "shrink": 0.8})


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


# --- heads --------------------------------------------------------------------------------
def importance_heatmaps(by_method: Mapping[str, pd.DataFrame]) -> Figure:
    """One layer x head heatmap of importance per method (Michel, Levy & Neubig 2019)."""
    if not by_method:
        raise AttnlabError("importance_heatmaps: no importance tables given")
    for method, df in by_method.items():
        _require(df, ("layer", "head", "importance"), f"importance_heatmaps[{method!r}]")
    n = len(by_method)
    first = next(iter(by_method.values()))
    n_layers, n_heads = first["layer"].nunique(), first["head"].nunique()
    with _style(grid=False):
        fig = _figure(min(4.2 * n, 13), max(2.4, 0.45 * n_layers + 1.6) if n_heads <= 16 else 5)
        axes = np.atleast_1d(fig.subplots(1, n))
        for ax, (method, df) in zip(axes, by_method.items(), strict=True):
            _heatmap(ax, _layer_head_matrix(df, "importance"), cmap="rocket_r", label="importance")
            ax.set(title=method.replace("_", " "), xlabel="head", ylabel="layer")
    return fig


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


def similarity_clustermap(sim: pd.DataFrame, metric: str = "pattern") -> Figure:
    """Head-by-head similarity, rows and columns ordered by average-linkage clustering, with its dendrogram."""
    if not isinstance(sim, pd.DataFrame) or sim.shape[0] != sim.shape[1] or sim.empty:
        raise AttnlabError(f"similarity_clustermap: expected a non-empty square DataFrame, got shape "
                           f"{getattr(sim, 'shape', None)}")
    values = sim.to_numpy(float)
    order, links = average_linkage(1.0 - values)
    ordered = sim.iloc[order, order]
    n = len(order)
    side = min(9.5, max(4.5, 0.28 * n + 2.5))
    with _style(grid=False):
        fig = _figure(side + 1.0, side)
        # Tree above the heatmap in one gridspec column (so their x axes line up), colour bar beside.
        grid = fig.add_gridspec(2, 2, height_ratios=(1, 5), width_ratios=(30, 1))
        ax_tree = fig.add_subplot(grid[0, 0])
        ax = fig.add_subplot(grid[1, 0], sharex=ax_tree)
        cax = fig.add_subplot(grid[1, 1])
        sns.heatmap(ordered, ax=ax, cbar_ax=cax, cmap="mako", vmin=0, vmax=1, annot=n <= 12, fmt=".2f",
                    annot_kws={"fontsize": 6}, cbar_kws={"label": f"{metric} similarity"})
        _draw_dendrogram(ax_tree, links, order)
        ax.set(xlabel="", ylabel="")
        ax.tick_params(labelsize=7)
        ax_tree.set_title(f"Head similarity ({metric}), clustered")
    return fig


def _draw_dendrogram(ax, links: list[tuple[int, int, float]], order: list[int]) -> None:
    """Draw merges as U shapes over leaf positions 0.5, 1.5, ... (the heatmap's cell centres)."""
    x = {leaf: pos + 0.5 for pos, leaf in enumerate(order)}
    y = dict.fromkeys(order, 0.0)
    n = len(order)
    for k, (a, b, height) in enumerate(links):
        for c in (a, b):
            ax.plot([x[c], x[c]], [y[c], height], color="#555555", lw=0.8)
        ax.plot([x[a], x[b]], [height, height], color="#555555", lw=0.8)
        x[n + k], y[n + k] = (x[a] + x[b]) / 2, height
    ax.set_ylim(0, max([h for _, _, h in links], default=1.0) * 1.05 or 1.0)
    ax.set_axis_off()


ROLE_COLUMNS = ROLES  # owned by probes.roles, which computes them


def head_roles(df: pd.DataFrame) -> Figure:
    """How strongly each head attends where each known role would (Olsson et al. 2022)."""
    _require(df, ("layer", "head", *ROLE_COLUMNS), "head_roles")
    table = df.sort_values(["layer", "head"]).set_index(
        [pd.Index([head_label(r.layer, r.head) for r in df.sort_values(["layer", "head"]).itertuples()])]
    )[list(ROLE_COLUMNS)].T
    table.index = [c.replace("_", " ") for c in table.index]
    with _style(grid=False):
        fig = _figure(min(13, max(5, 0.45 * table.shape[1] + 2.5)), 2.8)
        ax = fig.subplots()
        sns.heatmap(table, ax=ax, cmap="viridis", vmin=0, vmax=1, annot=table.size <= 128, fmt=".2f",
                    annot_kws={"fontsize": 6}, cbar_kws={"label": "score"})
        ax.set(title="Head roles", xlabel="", ylabel="")
        ax.tick_params(labelsize=7)
    return fig


def attention_entropy(df: pd.DataFrame) -> Figure:
    """Per-head mean attention entropy and mean largest weight (layer x head)."""
    _require(df, ("layer", "head", "entropy", "max_prob"), "attention_entropy")
    with _style(grid=False):
        fig = _figure(9, max(2.4, 0.45 * df["layer"].nunique() + 1.6))
        ax_e, ax_m = fig.subplots(1, 2)
        _heatmap(ax_e, _layer_head_matrix(df, "entropy"), cmap="crest", label="nats", vmin=0)
        ax_e.set(title="Attention entropy", xlabel="head", ylabel="layer")
        _heatmap(ax_m, _layer_head_matrix(df, "max_prob"), cmap="flare", label="weight", vmin=0, vmax=1)
        ax_m.set(title="Largest attention weight", xlabel="head", ylabel="layer")
    return fig


def attention_patterns(patterns: pd.DataFrame, tokens: list[int] | None = None) -> Figure:
    """Attention patterns (query x key) of a few heads on one example.

    ``patterns`` is long-format: columns layer, head, query, key, weight (one row per cell),
    with an optional ``rank`` column giving the head's importance rank for the panel titles.
    """
    _require(patterns, ("layer", "head", "query", "key", "weight"), "attention_patterns")
    keys = ["layer", "head"] + (["rank"] if "rank" in patterns.columns else [])
    heads = patterns[keys].drop_duplicates()
    if "rank" in heads.columns:
        heads = heads.sort_values("rank")
    n = len(heads)
    cols = min(n, 4)
    rows = -(-n // cols)
    n_pos = int(patterns["query"].max()) + 1
    with _style(grid=False):
        fig = _figure(3.1 * cols + 0.6, 3.0 * rows + 0.3)
        axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
        for ax, head in zip(axes[:n], heads.itertuples(index=False), strict=True):
            cells = patterns[(patterns["layer"] == head.layer) & (patterns["head"] == head.head)]
            m = np.full((n_pos, n_pos), np.nan)
            m[cells["query"].to_numpy(int), cells["key"].to_numpy(int)] = cells["weight"].to_numpy(float)
            ax.imshow(m, cmap="Blues", vmin=0, vmax=1, interpolation="nearest", aspect="auto")
            title = head_label(head.layer, head.head)
            if "rank" in heads.columns:
                title += f"  (#{int(head.rank) + 1} by importance)"
            ax.set_title(title, fontsize=9)
            if tokens is not None and len(tokens) == n_pos and n_pos <= 32:
                ax.set_xticks(np.arange(n_pos), [str(t) for t in tokens], fontsize=5, rotation=90)
                ax.set_yticks(np.arange(n_pos), [str(t) for t in tokens], fontsize=5)
                ax.set_xlabel("key (token id)", fontsize=8)
                ax.set_ylabel("query (token id)", fontsize=8)
            else:
                ax.set_xlabel("key position", fontsize=8)
                ax.set_ylabel("query position", fontsize=8)
        for ax in axes[n:]:
            ax.set_axis_off()
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
