"""The reference a kernel is judged against, and the measured allowance around it.

:func:`eager` is the textbook attention formula, written once and run at two precisions:

- in float64 on the case's (dtype-rounded) inputs: the **reference** (``ref64``);
- at the case's dtype with the softmax upcast to float32 (transformers' eager:
  ``softmax(..., dtype=torch.float32).to(query.dtype)``): the **plain rounding** computation, what an
  honest implementation at that dtype computes. It runs in the three places the scale is commonly applied
  (:data:`ORDERS`), since one sample of rounding can be small by chance where a kernel's equally honest
  order is not: the floor is the largest of the three (PyTorch's math backend scales q and k by
  ``sqrt(scaling)``; against the scores-scaled formula alone it read 1.35 allowances at float32 on a
  d=64, scaling=0.5 case, 60 examples in, and matches the float64 reference to 1.3e-15 when run in float64).

The formula: ``s = scaling * q k^T`` (Vaswani et al. 2017 §3.2.1, eq. 1), each K/V head repeated over its
group of ``h / h_kv`` query heads in order (``repeat_interleave``: query head ``i`` reads K/V head
``i // groups``, transformers' ``repeat_kv``); a soft cap ``cap * tanh(s / cap)`` before the mask (Gemma-2,
Team Gemma 2024 §2); the per-head additive bias (ALiBi, Press et al. 2022); masked scores removed; attention
sinks as one extra per-head logit in the softmax's denominator, dropped after it (gpt-oss; Xiao et al. 2023,
StreamingLLM); ``softmax(s) v``.

The allowance (flash-attention's tests compare ``|out - ref| <= 2 |out_pt - ref|``, the at-dtype PyTorch
formula's own error against a float32 reference; PyTorch's SDPA tests scale by the low-precision reference's
deviation from a float64 golden run; we follow the second with the model suite's factor)::

    deviation(x)  = max|x - ref64| / max(1, max|ref64|)      over the query rows that see a key
    floor         = max over ORDERS of deviation(plain rounding)
    allowance     = FACTOR * max(floor, u(dtype))

``FACTOR`` is properties/precision.py's (4: two sides of a triangle inequality, times 2 for a deviation
derived from the tensors). The minimum ``FACTOR * u(dtype)`` (unit roundoff, Higham 2002 §2.1) is one
rounding of the output to the kernel's dtype, in the output's ``max(1, .)`` unit: a kernel that accumulates
in higher precision than the plain formula is allowed at least to round its result, and the allowance never
collapses to 0 where the plain formula happens to be exact.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from properties.design import unit_roundoff
from properties.kernels.case import Case
from properties.precision import FACTOR

ORDERS = ("scores", "query", "split")


def eager(case: Case, t: dict[str, Tensor], dtype: torch.dtype, order: str = "scores") -> Tensor:
    """The formula above at ``dtype`` (float64: the reference), output ``[b, q, h, dv]``; a row that sees no
    key (and has no sink) is NaN. ``order``: where the scale is applied, each as correct as the others and
    each rounding differently: to the scores (transformers' eager), to the query before the product, or
    ``sqrt(scaling)`` to both query and key (PyTorch's math SDPA backend, which keeps the product in range)."""
    q, k, v = (t[n].to(dtype) for n in ("q", "k", "v"))
    groups = case.h // case.h_kv
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if order == "query":
        s = torch.matmul(q * case.scale, k.transpose(-1, -2))
    elif order == "split":
        root = math.sqrt(case.scale)
        s = torch.matmul(q * root, (k * root).transpose(-1, -2))
    else:
        s = torch.matmul(q, k.transpose(-1, -2)) * case.scale
    if case.softcap is not None:  # Gemma-2: cap * tanh(s / cap), before the mask
        s = torch.tanh(s / case.softcap) * case.softcap
    if "bias" in t:
        s = s + t["bias"].to(dtype)
    s = s.masked_fill(~case.visible(), -math.inf)
    soft = torch.float64 if dtype == torch.float64 else torch.float32
    if case.sinks:  # one more logit per head in the denominator, dropped after the softmax
        sink = t["sinks"].to(dtype).reshape(1, -1, 1, 1).expand(case.b, -1, case.q, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1).to(soft), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s.to(soft), dim=-1)
    out = torch.matmul(p.to(dtype), v)
    return out.transpose(1, 2)


def seen_rows(case: Case) -> Tensor:
    """bool ``[b, q, h, 1]``: the output entries with a defined value (their row sees a key, or has a sink)."""
    rows = case.visible().any(dim=-1)  # [b, 1, q]
    if case.sinks:
        rows = torch.ones_like(rows)
    return rows.transpose(1, 2).unsqueeze(-1).expand(case.b, case.q, case.h, 1)


def deviation(x: Tensor, ref: Tensor, rows: Tensor) -> tuple[float, str]:
    """``max|x - ref| / max(1, max|ref|)`` over ``rows`` and where it is largest ("b,q,h,dv"); NaN in x is inf."""
    keep = rows.expand_as(ref)
    if not bool(keep.any()):
        return 0.0, ""
    diff = (x.double() - ref).abs().masked_fill(~keep, 0.0)
    diff = torch.nan_to_num(diff, nan=math.inf, posinf=math.inf)
    scale = max(1.0, float(ref[keep].abs().max()))
    at = int(diff.flatten().argmax())
    where = ",".join(str(int(i)) for i in torch.unravel_index(torch.tensor(at), diff.shape))
    return float(diff.max()) / scale, f"at [b,q,h,dv]=[{where}]"


def allowance(case: Case, t: dict[str, Tensor], ref: Tensor, rows: Tensor) -> tuple[float, float]:
    """(floor, allowance) of the module docstring."""
    floor = max(deviation(eager(case, t, case.torch_dtype, order), ref, rows)[0] for order in ORDERS)
    return floor, FACTOR * max(floor, unit_roundoff(case.torch_dtype))
