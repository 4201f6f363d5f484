"""The report's tables, built from what a run directory holds (:class:`reports.rundata.RunData`): the most
important heads, an encoder-decoder's heads stack by stack, redundancy, heal and the estimator comparison.

Values stay raw or pre-formatted strings; the templates escape them. An encoder-decoder's heads are named by the
probes' one spelling (``enc L0H1``, ``L0H1``, ``xL0H1``: ``probes._validate.head_name``) and each table that lists
heads says which stack each belongs to.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import pandas as pd

from probes._validate import KIND_NAMES, KINDS, parse_head_name
from probes.roles import NOT_APPLICABLE
from reports.figures_heads import head_label
from reports.format import fmt, pct
from reports.rundata import RunData


def ranking(data: RunData) -> Optional[pd.DataFrame]:
    """The importance the report ranks heads by: exact ablation's, else the first method's."""
    return data.importance.get("ablation", next(iter(data.importance.values()), None))


def top_heads(data: RunData, k: int = 8) -> list[dict]:
    df = ranking(data)
    if df is None:
        return []
    top = df.sort_values("importance", ascending=False).head(k)
    return [{"head": head_label(r.layer, r.head, getattr(r, "kind", None)),
             "stack": KIND_NAMES[str(r.kind)] if "kind" in df else "", "importance": float(r.importance),
             "loss_delta": float(r.loss_delta)} for r in top.itertuples()]


def stack_rows(data: RunData) -> list[dict]:
    """An encoder-decoder's heads stack by stack: how many, the most important and the mean attention entropy;
    empty for a decoder-only model."""
    importance, entropy = ranking(data), data.attention_entropy
    rows = []
    for kind in data.stacks:
        row: dict[str, Any] = {"stack": KIND_NAMES[kind], "heads": None, "top": None, "importance": None,
                               "entropy": None}
        if importance is not None and "kind" in importance:
            part = importance[importance["kind"] == kind]
            best = part.sort_values("importance", ascending=False).iloc[0]
            row.update(heads=len(part), top=head_label(best["layer"], best["head"], kind),
                       importance=float(best["importance"]))
        if entropy is not None and "kind" in entropy:
            row["entropy"] = float(entropy.loc[entropy["kind"] == kind, "entropy"].mean())
        rows.append(row)
    return rows


def not_applicable_roles(data: RunData) -> list[str]:
    """The head roles an encoder-decoder's stacks do not have, and why (``probes.roles.NOT_APPLICABLE``)."""
    if data.head_roles is None or "kind" not in data.head_roles:
        return []
    return [f"{KIND_NAMES[kind]}: {', '.join(roles)} ({'; '.join(dict.fromkeys(roles.values()))})"
            for kind, roles in NOT_APPLICABLE.items() if kind in data.stacks]


# Readable names for probes.redundancy's keys; per-layer keys end in _L{l}. Unknown keys show as they are.
REDUNDANCY_ROWS = (
    ("prunable_fraction", "heads prunable, importance order", pct),
    ("random_prunable_fraction", "heads prunable, random order (mean over seeds)", pct),
    ("prunable_heads", "heads prunable (count)", fmt),
    ("n_heads", "heads in the model", fmt),
    ("tolerance", "loss budget (relative)", pct),
    ("baseline_loss", "loss, nothing pruned", fmt),
    ("pruned_loss", "loss, prunable heads pruned", fmt),
    ("baseline_accuracy", "accuracy, nothing pruned", pct),
    ("pruned_accuracy", "accuracy, prunable heads pruned", pct),
    ("one_head_all_layers_rel_increase", "loss rise keeping one head per layer", pct),
    ("one_head_all_layers_accuracy", "accuracy keeping one head per layer", pct),
)
REDUNDANCY_PER_LAYER = (
    ("heads_needed_", "heads {layer} needs (others intact)", fmt),
    ("one_head_best_", "best single head of {layer}", None),
    ("one_head_rel_increase_", "loss rise keeping only that head in {layer}", pct),
)
_PER_LAYER = re.compile(r"(?:heads_needed|one_head_best|one_head_rel_increase)_((?:enc |x)?L\d+)")


def redundancy_rows(red: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, formatted value)`` rows for the redundancy table, known keys first, in a reading order; an
    encoder-decoder's per-layer rows (keys named by ``probes._validate.head_name``) stack by stack."""
    rows, used = [], set()
    for key, label, how in REDUNDANCY_ROWS:
        if key in red:
            rows.append((label, how(red[key])))
            used.add(key)
    names = {m.group(1) for k in red if (m := _PER_LAYER.fullmatch(k))}
    parsed = {name: parse_head_name(name) for name in names}
    stacked = any(kind is not None for kind, _, _ in parsed.values())
    order = {kind: i for i, kind in enumerate(KINDS)}
    for name in sorted(names, key=lambda n: (order[parsed[n][0] or "decoder"], parsed[n][1])):
        kind, layer, _ = parsed[name]
        kind = kind or ("decoder" if stacked else None)
        where = f"layer {layer}" if kind is None else f"{KIND_NAMES[kind]} layer {layer}"
        for prefix, label, layer_how in REDUNDANCY_PER_LAYER:
            key = f"{prefix}{name}"
            if key in red:
                value = head_label(layer, int(red[key]), kind) if layer_how is None else \
                    layer_how(red[key])
                rows.append((label.format(layer=where), value))
                used.add(key)
    rows += [(k, fmt(v)) for k, v in sorted(red.items()) if k not in used]
    return rows


def heal_rows(heal: Any) -> list[dict] | None:
    """The heal table: per pruned fraction (importance order), loss and accuracy at each stage."""
    if heal is None:
        return None
    imp = heal[heal["order"] == "importance"]
    rows = []
    for frac, group in imp.groupby("fraction_pruned", sort=True):
        by = group.set_index("stage")
        rows.append({"fraction": pct(frac), "n_pruned": int(group["n_pruned"].iloc[0]),
                     **{f"{col}_{s.replace('-', '_')}": by[col].get(s) for col in ("loss", "accuracy")
                        for s in ("before", "fine-tuned", "distilled")}})
    return rows


def estimator_rows(df: Any) -> list[dict] | None:
    """The estimator table: one row per method, its prunable fraction per budget as ``budgets``."""
    if df is None:
        return None
    rows = []
    for method, group in df.groupby("method", sort=False):
        first = group.iloc[0]
        rows.append({"method": method, "spearman": float(first["spearman"]), "kendall": float(first["kendall"]),
                     "budgets": [(pct(b), pct(f)) for b, f in zip(group["budget"], group["prunable_fraction"],
                                                                  strict=True)],
                     "seconds": float(first["seconds"]),
                     "passes": float(first["forward_passes"] + first["backward_passes"])})
    return rows
