"""The zoo in low precision: ``python -m tests.helpers.zoo_precision [--dtype ...] [--arch ...]``.

Every architecture of :data:`tests.helpers.zoo.ZOO` (tiny random Hugging Face models built from configs in
memory), loaded in each dtype as ``from_pretrained(dtype=...)`` loads a checkpoint
(:func:`tests.field_bugs.matrix.loaded_in`: rotary ``inv_freq`` kept in float32), behind HFAdapter, through
:func:`properties.check_model`. Prints one line per architecture and dtype: the failed rows (which must be
only the zoo's documented findings, :data:`tests.helpers.zoo.FINDINGS`), the rows not comparable because of
non-finite values, the rows noted hidden under rounding (their float64 twin fails them), and the
largest ratio of deviation to allowance among the passing rows.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from harness.adapters import HFAdapter
from properties import check_model
from properties.precision import HIDDEN, NOT_COMPARABLE
from tests.field_bugs.matrix import loaded_in
from tests.helpers.zoo import FINDINGS, MAX_EXAMPLES, SEED, ZOO, build

DTYPES = ("bfloat16", "float16")


def known(arch: str) -> set[str]:
    """The rows the zoo documents as findings on ``arch`` through HFAdapter (real bugs, with witnesses)."""
    return {f.prop for f in FINDINGS if f.arch == arch and f.adapter == "hf"}


def row(arch: str, dtype: str, max_examples: int = MAX_EXAMPLES) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = check_model(HFAdapter(loaded_in(build(arch), dtype)), seed=SEED, max_examples=max_examples)
    failed = set(frame.property[frame.status == "fail"])
    passing = frame[frame.status == "pass"]
    return {"arch": arch, "dtype": dtype, "failed": sorted(failed), "false_alarms": sorted(failed - known(arch)),
            "not_comparable": sorted(frame.property[frame.reason.fillna("").str.startswith(NOT_COMPARABLE)]),
            "hidden": sorted(frame.property[frame.reason.fillna("").str.startswith(HIDDEN)]),
            "max_ratio": float(passing.ratio.max()) if len(passing) else 0.0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="*", default=list(DTYPES))
    parser.add_argument("--arch", nargs="*", default=sorted(ZOO))
    parser.add_argument("--max-examples", type=int, default=MAX_EXAMPLES)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    alarms = 0
    for dtype in args.dtype:
        for arch in args.arch:
            start = time.perf_counter()
            r = row(arch, dtype, args.max_examples)
            alarms += len(r["false_alarms"])
            seconds = time.perf_counter() - start
            print(f"| {arch} | {dtype} | {', '.join(r['failed']) or '-'} | {', '.join(r['false_alarms']) or '0'} | "
                  f"{', '.join(r['not_comparable']) or '-'} | {', '.join(r['hidden']) or '-'} | {r['max_ratio']:.2g} | "
                  f"{seconds:.0f} s |", flush=True)
    print("| arch | dtype | failed | false alarms | not comparable | hidden | max ratio | time |")
    print(f"false alarms: {alarms}")


if __name__ == "__main__":
    main()
