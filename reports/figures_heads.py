"""Seaborn figures of the per-head probe tables: importance, similarity, roles, entropy, attention patterns.

Each takes the DataFrame a probe wrote (read back from the run directory) and returns a Figure on the Agg canvas
(:mod:`reports.figures`). An encoder-decoder's tables carry a ``kind`` column: its encoder self-attention,
decoder self-attention and cross-attention heads are drawn apart, rows labelled by the probes' one spelling of a
head's name (``enc L0``, ``L0``, ``xL0``: :func:`probes._validate.head_name`), stacks separated by a line, and
similarity drawn as one clustered panel per stack (two stacks' patterns are not compared).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from harness.errors import AttnlabError
from probes._validate import KIND_NAMES, KINDS, head_name, parse_head_name
from probes.roles import ROLES
from reports.cluster import average_linkage
from reports.figures import _figure, _require, _style

STACKS_NOTE = "enc = encoder self-attention, x = cross-attention, no prefix = decoder self-attention"


def head_label(layer: int, head: int, kind: Optional[str] = None) -> str:
    """``L{layer}H{head}``; an encoder-decoder's ``enc L0H1``, ``L0H1``, ``xL0H1`` (``probes._validate.head_name``)."""
    return head_name(kind, layer, head)


def _order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in stack order (encoder, decoder, cross), then layer and head."""
    rank = df["kind"].map({k: i for i, k in enumerate(KINDS)}) if "kind" in df else 0
    return df.assign(_stack=rank).sort_values(["_stack", "layer", "head"], kind="stable").drop(columns="_stack")


def _layer_head_matrix(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """Layer x head; an encoder-decoder's rows are each stack's layers, labelled and in stack order."""
    if "kind" not in df:
        m = df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean")
        return m.sort_index().sort_index(axis=1)
    ordered = _order(df)
    rows = [head_name(k, layer) for k, layer in zip(ordered["kind"], ordered["layer"], strict=True)]
    m = ordered.assign(row=pd.Categorical(rows, categories=list(dict.fromkeys(rows)))).pivot_table(
        index="row", columns="head", values=value, aggfunc="mean", observed=True, dropna=False)
    m.index = pd.Index([str(row) for row in m.index], dtype=object)
    return m.sort_index(axis=1)


def _stack_lines(ax: Any, rows: list[str]) -> None:
    """A line between two stacks' rows of a heatmap."""
    kinds = [parse_head_name(r)[0] for r in rows]
    for i in range(1, len(kinds)):
        if kinds[i] != kinds[i - 1]:
            ax.axhline(i, color="#222222", lw=1.5)


def _heatmap(ax: Any, matrix: pd.DataFrame, *, cmap: str, label: str, center: Any = None, vmin: Any = None,
             vmax: Any = None, fmt: str = ".3g") -> None:
    annotate = matrix.size <= 96  # numbers stay legible up to about 12 x 8 cells
    sns.heatmap(matrix, ax=ax, cmap=cmap, center=center, vmin=vmin, vmax=vmax, annot=annotate, fmt=fmt,
                annot_kws={"fontsize": 7}, linewidths=0.5, linecolor="white", square=False,
                cbar_kws={"label": label, "shrink": 0.8})
    if matrix.index.dtype == object:
        _stack_lines(ax, [str(r) for r in matrix.index])


def _note_stacks(fig: Figure, df: pd.DataFrame) -> None:
    """An encoder-decoder's figure says what its row labels' prefixes mean."""
    if "kind" in df:
        fig.suptitle(STACKS_NOTE, fontsize=8)


def importance_heatmaps(by_method: Mapping[str, pd.DataFrame]) -> Figure:
    """One layer x head heatmap of importance per method (Michel, Levy & Neubig 2019)."""
    if not by_method:
        raise AttnlabError("importance_heatmaps: no importance tables given")
    for method, df in by_method.items():
        _require(df, ("layer", "head", "importance"), f"importance_heatmaps[{method!r}]")
    n = len(by_method)
    first = next(iter(by_method.values()))
    n_rows, n_heads = _layer_head_matrix(first, "importance").shape
    with _style(grid=False):
        fig = _figure(min(4.2 * n, 13), max(2.4, 0.45 * n_rows + 1.6) if n_heads <= 16 else 5)
        axes = np.atleast_1d(fig.subplots(1, n))
        for ax, (method, df) in zip(axes, by_method.items(), strict=True):
            _heatmap(ax, _layer_head_matrix(df, "importance"), cmap="rocket_r", label="importance")
            ax.set(title=method.replace("_", " "), xlabel="head", ylabel="layer")
        _note_stacks(fig, first)
    return fig


def _stacks_of(labels: list[str]) -> list[str]:
    """The stack of each similarity label ("" for all when no label names an encoder-decoder's stack, or a label is
    not a head name): a plain ``L0H1`` beside ``enc``/``x`` labels is the decoder's."""
    try:
        kinds = [parse_head_name(label)[0] for label in labels]
    except AttnlabError:
        return [""] * len(labels)
    if not set(kinds) - {None}:
        return [""] * len(labels)
    return [kind or "decoder" for kind in kinds]


def similarity_clustermap(sim: pd.DataFrame, metric: str = "pattern") -> Figure:
    """Head-by-head similarity, rows and columns ordered by average-linkage clustering, with its dendrogram; an
    encoder-decoder's one panel per stack (the probe compares heads within a stack only)."""
    if not isinstance(sim, pd.DataFrame) or sim.shape[0] != sim.shape[1] or sim.empty:
        raise AttnlabError(f"similarity_clustermap: expected a non-empty square DataFrame, got shape "
                           f"{getattr(sim, 'shape', None)}")
    of = _stacks_of([str(label) for label in sim.index])
    panels = []
    for stack in dict.fromkeys(of):
        keep = [i for i, s in enumerate(of) if s == stack]
        part = sim.iloc[keep, keep]
        if not part.isna().all().all():  # a stack without informative queries has nothing to draw
            panels.append((stack, part))
    if not panels:
        raise AttnlabError("similarity_clustermap: every similarity is NaN: expected some heads compared")
    side = min(9.5, max(4.5, 0.28 * max(len(p) for _, p in panels) + 2.5))
    with _style(grid=False):
        fig = _figure((side + 1.0) * len(panels), side)
        # per panel: tree above the heatmap in one gridspec column (so their x axes line up), colour bar beside
        grid = fig.add_gridspec(2, 2 * len(panels), height_ratios=(1, 5), width_ratios=(30, 1) * len(panels))
        for i, (stack, part) in enumerate(panels):
            values = np.nan_to_num(part.to_numpy(float), nan=0.0)  # a constant head's output CKA: unlike all
            order, links = average_linkage(1.0 - values)
            ordered = part.iloc[order, order]
            n = len(order)
            ax_tree = fig.add_subplot(grid[0, 2 * i])
            ax = fig.add_subplot(grid[1, 2 * i], sharex=ax_tree)
            cax = fig.add_subplot(grid[1, 2 * i + 1])
            sns.heatmap(ordered, ax=ax, cbar_ax=cax, cmap="mako", vmin=0, vmax=1, annot=n <= 12, fmt=".2f",
                        annot_kws={"fontsize": 6}, cbar_kws={"label": f"{metric} similarity"})
            _draw_dendrogram(ax_tree, links, order)
            ax.set(xlabel="", ylabel="")
            ax.tick_params(labelsize=7)
            where = f", {KIND_NAMES[stack]}" if stack else ""
            ax_tree.set_title(f"Head similarity ({metric}{where}), clustered")
    return fig


def _draw_dendrogram(ax: Any, links: list[tuple[int, int, float]], order: list[int]) -> None:
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
    """How strongly each head attends where each known role would (Olsson et al. 2022); blank: n/a in that stack."""
    _require(df, ("layer", "head", *ROLE_COLUMNS), "head_roles")
    ordered = _order(df)
    kinds = ordered["kind"] if "kind" in ordered else [None] * len(ordered)
    labels = [head_label(r.layer, r["head"], k) for k, (_, r) in zip(kinds, ordered.iterrows(), strict=True)]
    table = ordered.set_index(pd.Index(labels))[list(ROLE_COLUMNS)].T
    table.index = [c.replace("_", " ") for c in table.index]
    with _style(grid=False):
        fig = _figure(min(13, max(5, 0.45 * table.shape[1] + 2.5)), 2.8)
        ax = fig.subplots()
        sns.heatmap(table, ax=ax, cmap="viridis", vmin=0, vmax=1, annot=table.size <= 128, fmt=".2f",
                    annot_kws={"fontsize": 6}, cbar_kws={"label": "score"})
        ax.set(title="Head roles" + (" (blank: n/a in that stack)" if "kind" in df else ""), xlabel="", ylabel="")
        ax.tick_params(labelsize=7)
        _note_stacks(fig, df)
    return fig


def attention_entropy(df: pd.DataFrame) -> Figure:
    """Per-head mean attention entropy and mean largest weight (layer x head)."""
    _require(df, ("layer", "head", "entropy", "max_prob"), "attention_entropy")
    entropy = _layer_head_matrix(df, "entropy")
    with _style(grid=False):
        fig = _figure(9, max(2.4, 0.45 * len(entropy) + 1.6))
        ax_e, ax_m = fig.subplots(1, 2)
        _heatmap(ax_e, entropy, cmap="crest", label="nats", vmin=0)
        ax_e.set(title="Attention entropy", xlabel="head", ylabel="layer")
        _heatmap(ax_m, _layer_head_matrix(df, "max_prob"), cmap="flare", label="weight", vmin=0, vmax=1)
        ax_m.set(title="Largest attention weight", xlabel="head", ylabel="layer")
        _note_stacks(fig, df)
    return fig


def attention_patterns(patterns: pd.DataFrame, tokens: list[int] | None = None,
                       source: list[int] | None = None) -> Figure:
    """Attention patterns (query x key) of a few heads on one example.

    ``patterns`` is long-format: columns layer, head, query, key, weight (one row per cell),
    with an optional ``rank`` column giving the head's importance rank for the panel titles and an encoder-
    decoder's ``kind``: an encoder head's queries and keys are the ``source`` tokens, a cross-attention head's
    queries the decoder's ``tokens`` and its keys the source's.
    """
    _require(patterns, ("layer", "head", "query", "key", "weight"), "attention_patterns")
    keys = (["kind"] if "kind" in patterns.columns else []) + ["layer", "head"] + \
        (["rank"] if "rank" in patterns.columns else [])
    heads = patterns[keys].drop_duplicates()
    if "rank" in heads.columns:
        heads = heads.sort_values("rank")
    n = len(heads)
    cols = min(n, 4)
    rows = -(-n // cols)
    with _style(grid=False):
        fig = _figure(3.1 * cols + 0.6, 3.0 * rows + 0.3)
        axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
        for ax, head in zip(axes[:n], heads.to_dict("records"), strict=True):
            kind = head.get("kind")
            cells = patterns[(patterns["layer"] == head["layer"]) & (patterns["head"] == head["head"])]
            if kind is not None:
                cells = cells[cells["kind"] == kind]
            n_q, n_k = int(cells["query"].max()) + 1, int(cells["key"].max()) + 1
            m = np.full((n_q, n_k), np.nan)
            m[cells["query"].to_numpy(int), cells["key"].to_numpy(int)] = cells["weight"].to_numpy(float)
            ax.imshow(m, cmap="Blues", vmin=0, vmax=1, interpolation="nearest", aspect="auto")
            title = head_label(head["layer"], head["head"], kind)
            if "rank" in head:
                title += f"  (#{int(head['rank']) + 1} by importance)"
            ax.set_title(title + ("" if kind is None else f"\n{KIND_NAMES[kind]}"), fontsize=9)
            q_tokens = source if kind == "encoder" else tokens
            k_tokens = tokens if kind in (None, "decoder") else source
            for axis, ids, n_pos, what in ((ax.xaxis, k_tokens, n_k, "key"), (ax.yaxis, q_tokens, n_q, "query")):
                if ids is not None and len(ids) == n_pos and n_pos <= 32:
                    axis.set_ticks(np.arange(n_pos), [str(t) for t in ids], fontsize=5,
                                   rotation=90 if axis is ax.xaxis else 0)
                    axis.set_label_text(f"{what} (token id)", fontsize=8)
                else:
                    axis.set_label_text(f"{what} position", fontsize=8)
        for ax in axes[n:]:
            ax.set_axis_off()
    return fig
