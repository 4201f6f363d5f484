"""What a kernel declares it supports, so a feature it does not support is n/a, never a red row.

A kernel declares by an attribute, ``fn.attnlab_capabilities = Capabilities(...)`` (or a dict of the same
fields); one without it is held to every feature but the SDPA-only ``causal_flag``, and a feature it cannot
take shows as n/a when it raises on the feature's simplest input (properties/kernels/suite.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

from harness.errors import AttnlabTypeError

CONVENTIONS = ("zero", "nan", "uniform")


@dataclass(frozen=True)
class Capabilities:
    """``softcap``/``sinks``/``bias``/``gqa``: the kernel takes the feature (a string: it does not, and why).
    ``causal_flag``: with no mask it applies ``module.is_causal`` itself (transformers' SDPA path; otherwise
    causal cases always carry a mask). ``window_from_kwarg``: it builds the sliding window from
    ``sliding_window`` and the mask carries causality and padding only (the flash-attention contract);
    otherwise the mask carries the window too (transformers' eager and SDPA). ``masked_rows``: the answer it
    promises for a query row that sees no key (one of :data:`CONVENTIONS`; None: whichever, consistently).
    ``mask_forms``: the masks it reads ("bool": True attends; "additive": 0 or a bias, ``finfo.min`` hidden;
    transformers hands its eager kernels additive masks only).
    ``unavailable``: why the kernel cannot run on this machine at all (every row n/a with it)."""

    softcap: Any = True
    sinks: Any = True
    bias: Any = True
    gqa: Any = True
    causal_flag: bool = False
    window_from_kwarg: bool = False
    masked_rows: Optional[str] = None
    mask_forms: tuple[str, ...] = ("bool", "additive")
    unavailable: str = ""

    def __post_init__(self) -> None:
        if not self.mask_forms or any(m not in ("bool", "additive") for m in self.mask_forms):
            raise AttnlabTypeError(f"mask_forms={self.mask_forms!r} is invalid: expected some of bool, additive")
        if self.masked_rows is not None and self.masked_rows not in CONVENTIONS:
            raise AttnlabTypeError(f"masked_rows={self.masked_rows!r} is invalid: expected None or one of "
                                   f"{', '.join(CONVENTIONS)}")

    def lacks(self, feature: str) -> str:
        """Why the kernel does not take ``feature`` ("" when it does)."""
        value = getattr(self, feature, True)
        if value is True:
            return ""
        return value if isinstance(value, str) and value else f"the kernel declares no {feature} support"


def capabilities_of(fn: Any) -> Capabilities:
    declared = getattr(fn, "attnlab_capabilities", None)
    if declared is None:
        return Capabilities()
    if isinstance(declared, Capabilities):
        return declared
    if isinstance(declared, dict):
        known = {f.name for f in fields(Capabilities)}
        unknown = sorted(set(declared) - known)
        if unknown:
            raise AttnlabTypeError(f"attnlab_capabilities has unknown fields {unknown}: expected some of "
                                   f"{sorted(known)}")
        return Capabilities(**declared)
    raise AttnlabTypeError(f"attnlab_capabilities={declared!r} is invalid: expected a Capabilities or a dict")
