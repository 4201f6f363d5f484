"""How the report writes numbers: significant figures, percentages, an em dash for a missing value."""

from __future__ import annotations

import math
from typing import Any


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers to ``digits`` significant figures; missing values as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e6:
            return f"{value:,.0f}"
        if 1e-3 <= abs(value) < 1e5:
            return f"{value:.{digits}g}"
        return f"{value:.{max(digits - 1, 1)}e}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in value) if value else "none"
    return str(value)


def pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    v = float(value)
    text = f"{v:.2%}" if 0.999 <= v < 1 else f"{v:.1%}"  # never round a near miss up to a perfect 100%
    return text.replace(".0%", "%")
