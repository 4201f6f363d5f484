"""`attnlab kernels`: the attention-kernel conformance suite on built-in and user kernels, as a table.

The CLI command (reports/cli.py) only maps its options here. A user kernel is named ``module:function``
(``module:Class.attribute`` too) and checked before any work: it must import, be callable and accept
transformers' attention signature ``fn(module, query, key, value, attention_mask, **kw)``. ``--write-docs``
regenerates docs/kernels.md from the built-ins at float32, bfloat16 and float16.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from harness.errors import AttnlabError
from harness.run_dir import atomic_write_text
from properties.kernels import DEFAULT_EXAMPLES, NAMES, builtins, check_kernel
from properties.kernels.builtins import TRANSFORMERS_VERSION
from properties.kernels.capabilities import capabilities_of
from properties.kernels.grid import ROWS
from properties.kernels.reference import __doc__ as TOLERANCE_DOC
from reports import kernels_doc

DOC = Path(__file__).resolve().parents[1] / "docs" / "kernels.md"
DOC_DTYPES = ("float32", "bfloat16", "float16")
SIGNATURE = "fn(module, query, key, value, attention_mask, **kw)"


def resolve(spec: str) -> Callable[..., Any]:
    """The kernel ``module:function`` names, or AttnlabError naming what was expected."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AttnlabError(f"--kernel {spec!r} is invalid: expected module:function")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise AttnlabError(f"--kernel {spec!r}: module {module_name!r} does not import ({type(exc).__name__}: "
                           f"{exc}): expected an importable module") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttnlabError(f"--kernel {spec!r}: {module_name} has no attribute {attr!r}: expected module:function")
        obj = getattr(obj, part)
    check_signature(obj, f"--kernel {spec!r}")
    return obj


def check_signature(fn: Any, what: str) -> None:
    if not callable(fn):
        raise AttnlabError(f"{what} is a {type(fn).__name__}, not callable: expected a kernel {SIGNATURE}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the calls will tell
    try:
        sig.bind(None, None, None, None, None)
    except TypeError as exc:
        raise AttnlabError(f"{what} has signature {sig} ({exc}): expected a kernel {SIGNATURE}") from None


def select(specs: Sequence[str], names: Sequence[str]) -> list[Callable[..., Any]]:
    """The kernels to check: the user's, then the named built-ins (all built-ins when neither is given)."""
    table = builtins()
    unknown = [n for n in names if n not in table]
    if unknown:
        raise AttnlabError(f"--builtin {unknown[0]!r} is unknown: expected one of {', '.join(table)}")
    chosen = [resolve(s) for s in specs]
    for fn in chosen:
        capabilities_of(fn)  # a malformed declaration is bad input too
    if not specs and not names:
        return list(table.values())
    return chosen + [table[n] for n in names]


def cell(status: str, ratio: float) -> str:
    if status in ("pass", "fail") and not math.isnan(ratio):
        return f"{status} {ratio:.2g}" if math.isfinite(ratio) else f"{status} inf"
    return status


def grid(frame: pd.DataFrame) -> pd.DataFrame:
    """kernel x property rows, one column per dtype: "status ratio"."""
    shown = frame.assign(cell=[cell(s, r) for s, r in zip(frame.status, frame.ratio, strict=True)])
    wide = shown.pivot_table(index=["kernel", "property"], columns="dtype", values="cell", aggfunc="first", sort=False)
    order = {p: i for i, p in enumerate(NAMES)}
    wide = wide.reset_index()
    wide["_k"] = wide.kernel.map({k: i for i, k in enumerate(dict.fromkeys(frame.kernel))})
    wide["_p"] = wide.property.map(order)
    dtypes = list(dict.fromkeys(frame.dtype))
    return wide.sort_values(["_k", "_p"])[["kernel", "property", *dtypes]].reset_index(drop=True)


def run(specs: Sequence[str] = (), names: Sequence[str] = (), dtypes: Sequence[str] = ("float32",),
        max_examples: Optional[int] = None, seed: int = 0, write_docs: bool = False,
        echo: Callable[[str], None] = print) -> pd.DataFrame:
    """Check the chosen kernels (:func:`select`) and print the table; ``write_docs`` rewrites docs/kernels.md
    from every built-in at :data:`DOC_DTYPES`. Returns the long frame."""
    if write_docs and (specs or names):
        raise AttnlabError("--write-docs regenerates docs/kernels.md from every built-in: expected neither "
                           "--kernel nor --builtin with it")
    dtypes = DOC_DTYPES if write_docs else tuple(dtypes)
    kernels = select(specs, names)
    frames = []
    for fn in kernels:
        frames.append(check_kernel(fn, dtypes=dtypes, max_examples=max_examples, seed=seed))
    frame = pd.concat(frames, ignore_index=True)
    echo(grid(frame).to_string(index=False))
    failed = frame[frame.status == "fail"]
    for r in failed.itertuples():
        echo(f"FAIL {r.kernel} {r.property} {r.dtype}: {r.counterexample}")
    if write_docs:
        text = kernels_doc.render(frame, grid(frame), kernels, examples=max_examples or DEFAULT_EXAMPLES, seed=seed,
                                  transformers_version=TRANSFORMERS_VERSION, tolerance_doc=TOLERANCE_DOC or "",
                                  rows=ROWS)
        atomic_write_text(DOC, text)
        echo(f"wrote {DOC}")
    return frame
