"""check_kernel: every row of the grid on one attention kernel, at each dtype, one table row each.

Each row is one seeded hypothesis search over its strategy (properties/kernels/grid.py): every example runs
the kernel, the float64 reference and the at-dtype plain formula (properties/kernels/reference.py) and
measures ``ratio = deviation / allowance``; a ratio over 1 fails the row and hypothesis shrinks the input.

What a kernel raising means. A raise is the kernel refusing that input (SDPA's flash backend refuses a value
head dim other than the key's; a backend this machine lacks refuses everything): that input is n/a, with
the error text. A row whose every input was refused is n/a ("raises on every input"); otherwise the row is
judged on the inputs the kernel computed, and its reason counts the refused ones and quotes the first. A
declared lack (properties/kernels/capabilities.py) is n/a without a call.

Fully masked query rows (``masked_rows``) have no single right answer; the row records which convention the
kernel gives (0, NaN or the mean of V), per mask form, and fails only mixed conventions, within one output or
across inputs with the same mask form, or a boolean mask's convention that is not the one the kernel
declares. Under an additive mask the row is not hidden but filled with ``finfo.min``: its scores are equal
and the uniform mean of V is what the formula gives (at float16 ``-65504 + s`` rounds to ``-inf`` for
``s < -16``, leaving a subset: "mixed"), so those rows are recorded, never judged. The rows it does
compute are held to the reference like every other row's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional

import pandas as pd
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky

from harness._checks import check_int, check_positive_int
from harness.errors import AttnlabError
from properties.design import unit_roundoff
from properties.kernels.capabilities import capabilities_of
from properties.kernels.case import DTYPES, Case, call
from properties.kernels.grid import NAMES, ROWS, Row, strategy
from properties.kernels.reference import allowance, deviation, eager, seen_rows
from properties.precision import FACTOR
from properties.search import PropertyResult

DEFAULT_EXAMPLES = 20  # per row and dtype: sdpa at one dtype in ~2 s, uncompiled FlexAttention under a minute
COLUMNS = ["kernel", "property", "dtype", "status", "worst", "allowance", "ratio", "floor", "counterexample",
           "reason"]


class _Broke(Exception):
    def __init__(self, text: str):
        super().__init__(text)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def convention(case: Case, out: torch.Tensor, t: dict[str, torch.Tensor]) -> str:
    """Which answer the kernel gives on the query rows that see no key: zero, nan, uniform or mixed."""
    if not case.masked_rows or case.sinks:
        return ""
    got = out[:, list(case.masked_rows)].double()  # [b, rows, h, dv]
    if bool(got.isnan().all()):
        return "nan"
    if not bool(got.isfinite().all()):
        return "mixed"
    v = t["v"].double().repeat_interleave(case.h // case.h_kv, dim=1)  # [b, h, k, dv]
    mean = v.mean(dim=2).unsqueeze(1).expand_as(got)
    unit = FACTOR * unit_roundoff(case.torch_dtype) * max(1.0, float(v.abs().max()))
    if float(got.abs().max()) <= unit:
        return "zero"
    if float((got - mean).abs().max()) <= unit:
        return "uniform"
    return "mixed"


def _row(fn: Any, row: Row, dtype: str, seed: int, max_examples: int) -> tuple[PropertyResult, str]:
    """(result, masked-row convention) of one row."""
    caps = capabilities_of(fn)
    name = row.name
    if caps.unavailable:
        return PropertyResult.not_applicable(name, math.nan, caps.unavailable), ""
    lacking = caps.lacks(row.feature) if row.feature else ""
    if lacking:
        return PropertyResult.not_applicable(name, math.nan, lacking), ""
    worst = [(0.0, 0.0, math.nan, math.nan)]  # (ratio, deviation, floor, allowance) at the largest ratio
    raised: list[str] = []
    computed = [0]
    seen: dict[str, str] = {}  # convention -> the first input that gave it

    def measure(case: Case) -> None:
        t = case.tensors()
        try:
            out = call(fn, case, t)
            again = call(fn, case, t) if name == "determinism" else None
        except Exception as exc:  # the kernel (or its output's shape) failed on this input
            raised.append(f"{case.describe()}: raised {type(exc).__name__}: {_one_line(exc)}")
            return
        computed[0] += 1
        if again is not None:
            same = torch.equal(torch.nan_to_num(out, nan=0.0), torch.nan_to_num(again, nan=0.0)) and torch.equal(
                out.isnan(), again.isnan())
            gap = 0.0 if same else math.inf
            if gap > worst[0][1]:
                worst[0] = (math.inf, gap, math.nan, 0.0)
            if not same:
                diff = float(torch.nan_to_num((out.double() - again.double()).abs(), nan=math.inf).max())
                raise _Broke(f"{case.describe()}: two calls differ by up to {diff:.3g}")
            return
        ref = eager(case, t, torch.float64)
        rows = seen_rows(case)
        dev, where = deviation(out, ref, rows)
        floor, allow = allowance(case, t, ref, rows)
        ratio = dev / allow
        if ratio >= worst[0][0]:
            worst[0] = (ratio, dev, floor, allow)
        target(min(ratio, 1e300), label=name)
        if ratio > 1:
            raise _Broke(f"{case.describe()}: deviation {dev:.3g} > allowance {allow:.3g} {where}")
        kind = convention(case, out, t)
        if kind == "mixed" and case.mask == "bool":
            raise _Broke(f"{case.describe()}: the fully masked rows mix conventions (neither all 0, all NaN nor "
                         f"all the mean of V): {out[:, list(case.masked_rows)].flatten()[:6].tolist()}")
        if kind:  # per mask form: under an additive mask's finite fill a row is not hidden, its scores are equal
            seen.setdefault(f"{case.mask} mask: {kind}", case.describe())
            if case.mask == "bool" and caps.masked_rows is not None and kind != caps.masked_rows:
                raise _Broke(f"{case.describe()}: fully masked rows give {kind}, declared {caps.masked_rows}")

    def run(examples: int) -> Optional[str]:
        configured = settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                              phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
                              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                              verbosity=Verbosity.quiet, print_blob=False)
        test = configured(hypothesis_seed(seed)(given(strategy(row, caps, dtype))(measure)))
        try:
            test()
        except _Broke as exc:
            return str(exc)
        except Flaky:  # an input failed once and passed when replayed: the kernel is not deterministic
            return "non-deterministic: an input failed once and passed when replayed"
        return None

    broke = run(max_examples)
    if broke is None and raised and not computed[0]:
        return PropertyResult.not_applicable(name, math.nan, f"raises on every input: {raised[0]}"), ""
    forms = [k.split(":")[0] for k in seen if k.startswith("bool")]
    if broke is None and len(set(forms)) < len(forms):
        broke = "inconsistent: " + "; ".join(f"{k} on {v}" for k, v in seen.items())
    ratio, dev, floor, allow = worst[0]
    conv = ", ".join(sorted(seen))
    reason = "; ".join(r for r in (
        f"fully masked rows: {conv}" if conv else "",
        f"refused {len(raised)} of {len(raised) + computed[0]} inputs, first: {raised[0]}" if raised else "") if r)
    if name == "determinism":
        return PropertyResult(name, True, broke is None, dev, 0.0, broke or "", reason=reason, allowance=0.0,
                              ratio=0.0 if broke is None else math.inf), conv
    if broke is not None and math.isnan(allow):
        ratio, dev, allow = math.inf, math.inf, math.nan
    return PropertyResult(name, True, broke is None, dev, allow, broke or "", reason=reason, noise_floor=floor,
                          allowance=allow, ratio=ratio if broke is None or ratio > 1 else math.inf), conv


def kernel_name(fn: Any) -> str:
    return str(getattr(fn, "attnlab_name", None) or f"{getattr(fn, '__module__', '?')}:"
               f"{getattr(fn, '__qualname__', type(fn).__name__)}")


def check_kernel(fn: Callable[..., Any], dtypes: tuple[str, ...] | list[str] = ("float32",),
                 max_examples: Optional[int] = None, seed: int = 0,
                 properties: Optional[list[str]] = None) -> pd.DataFrame:
    """The suite on attention kernel ``fn`` (transformers' AttentionInterface signature): one row per
    property and dtype, columns :data:`COLUMNS` (``floor``: the plain formula's deviation at the worst ratio;
    ``reason``: why n/a, or the fully masked rows' convention). Seeded by ``seed``; ``max_examples`` per row
    and dtype (default :data:`DEFAULT_EXAMPLES`)."""
    if not callable(fn):
        raise AttnlabError(f"kernel {fn!r} is invalid: expected a callable with transformers' attention "
                           "signature fn(module, query, key, value, attention_mask, **kw)")
    check_int("seed", seed, 0)
    check_positive_int("max_examples", max_examples, none_ok=True)
    if isinstance(dtypes, str) or not dtypes or any(d not in DTYPES for d in dtypes):
        raise AttnlabError(f"dtypes={dtypes!r} is invalid: expected a list of {', '.join(DTYPES)}")
    chosen = list(NAMES) if properties is None else list(properties)
    unknown = [p for p in chosen if p not in NAMES]
    if unknown:
        raise AttnlabError(f"properties {unknown} are unknown: expected some of {', '.join(NAMES)}")
    capabilities_of(fn)  # a malformed declaration is bad input, raised before any work
    records = []
    for dtype in dtypes:
        for row in ROWS:
            if row.name not in chosen:
                continue
            result, _ = _row(fn, row, dtype, seed, max_examples or DEFAULT_EXAMPLES)
            records.append({"kernel": kernel_name(fn), "property": row.name, "dtype": dtype,
                            "status": result.status, "worst": result.worst, "allowance": result.allowance,
                            "ratio": result.ratio, "floor": result.noise_floor,
                            "counterexample": result.counterexample, "reason": result.reason})
    return pd.DataFrame.from_records(records, columns=COLUMNS)
