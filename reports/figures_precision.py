"""How close each verdict was: every numeric property's deviation against its allowance, log axes.

The allowance of a numeric property is measured from this model's rounding noise at its dtype
(properties/precision.py, docs/precision.md); a row passes below the line y = x and fails above
it, so the distance to the line, read in decades, is the margin of the verdict. Exact
properties (allowance 0) and rows that measured nothing have no point. Kept apart from
reports/figures.py, which holds the run's other figures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from harness.errors import AttnlabError
from properties.suite import COLUMNS as PROPERTY_COLUMNS
from reports.figures import _figure, _require, _style

STATUS_COLORS = {"pass": "#009E73", "fail": "#D55E00"}
PLOTTED_COLUMNS = tuple(c for c in PROPERTY_COLUMNS if c in ("property", "worst", "allowance", "status"))


def plotted_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a point: a pass or fail with a positive, finite allowance and a finite deviation."""
    ok = df["status"].isin(list(STATUS_COLORS)) & (df["allowance"] > 0) & np.isfinite(df["allowance"])
    return df[ok & np.isfinite(df["worst"])]


def precision_margins(df: pd.DataFrame) -> Figure:
    """Deviation (y) against allowance (x) per property, per dtype when ``df`` has a ``dtype`` column.

    A deviation of exactly 0 is drawn at a tenth of the smallest plotted value (log axes have no
    0), marked with an open symbol.
    """
    _require(df, PLOTTED_COLUMNS, "precision_margins")
    rows = plotted_rows(df).copy()
    if rows.empty:
        raise AttnlabError("precision_margins: no row has a positive allowance and a finite deviation; expected "
                           "at least one numeric property that passed or failed")
    positive = pd.concat([rows["worst"][rows["worst"] > 0], rows["allowance"]])
    zero_at = float(positive.min()) / 10
    rows["deviation"] = rows["worst"].where(rows["worst"] > 0, zero_at)
    rows["seen"] = np.where(rows["worst"] > 0, "measured", "0 (drawn low)")
    hue = "dtype" if "dtype" in rows else "status"
    with _style():
        fig = _figure(7.5, 5.5)
        ax = fig.subplots()
        lo = min(float(rows["deviation"].min()), float(rows["allowance"].min())) / 3
        hi = max(float(rows["deviation"].max()), float(rows["allowance"].max())) * 3
        ax.plot([lo, hi], [lo, hi], color="0.4", linestyle="--", linewidth=1, label="deviation = allowance")
        sns.scatterplot(rows, x="allowance", y="deviation", hue=hue, style="seen", s=60, ax=ax,
                        palette=STATUS_COLORS if hue == "status" else None, markers={"measured": "o",
                                                                                   "0 (drawn low)": "v"})
        for r in rows.itertuples():
            ax.annotate(str(r.property), (r.allowance, r.deviation), fontsize=7, xytext=(4, 2),
                        textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="allowance (from the noise floor)",
               ylabel="worst deviation", title="Deviation against allowance: above the line fails")
        ax.legend(fontsize=7, loc="upper left")
    return fig
