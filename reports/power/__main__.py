"""``python -m reports.power [--write-docs]``: measure detection power and print (or write) the table.

Runs on one thread (tiny tensors; a fixed summation order), ~20 min for all three models and dtypes on
two loaded cores, most of it SmolLM2 (skipped, with the reason, where its package is not installed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from harness.errors import AttnlabError
from reports.power.measure import Cell, measure
from reports.power.plant import FAMILIES
from reports.power.subjects import DTYPES, subjects
from reports.power.write import markdown, summary, write_docs


def _progress(start: float):
    def show(cell: Cell) -> None:
        print(f"{time.monotonic() - start:7.1f}s {cell.subject} {cell.dtype} {cell.family} size {cell.size:g}: "
              f"{cell.verdict} (worst {cell.worst:.3g}, allowance {cell.allowance:.3g})", file=sys.stderr, flush=True)
    return show


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.power", description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write docs/power.{csv,json,png} and the section "
                                                                   "of docs/precision.md")
    parser.add_argument("--subject", action="append", help="ours, zoo-llama or smollm2 (repeatable; default all)")
    parser.add_argument("--dtype", action="append", help=f"one of {DTYPES} (repeatable; default all)")
    parser.add_argument("--family", action="append", help=f"one of {sorted(FAMILIES)} (repeatable; default all)")
    parser.add_argument("--smollm2-folder", type=Path, help="SmolLM2 already converted (config.json + weights)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        chosen = subjects(args.smollm2_folder)
        names = [s.name for s in chosen]
        unknown = [s for s in args.subject or [] if s not in names]
        if unknown:
            raise AttnlabError(f"--subject {unknown[0]!r} is unknown: expected one of {names}")
        chosen = [s for s in chosen if not args.subject or s.name in args.subject]
        start = time.monotonic()
        cells = measure(chosen, args.dtype or DTYPES, args.family or tuple(FAMILIES), progress=_progress(start))
    except AttnlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seconds = time.monotonic() - start
    if args.write_docs:
        for path in write_docs(cells, seconds):
            print(f"wrote {path}")
    else:
        print(markdown(summary(cells), seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
