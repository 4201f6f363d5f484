"""``python -m tests.field_bugs``: the field-bug matrix (bug x property), optionally written to docs/field-bugs.md."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--bugs", nargs="*", default=None, help="names from tests.field_bugs.catalogue.BUGS")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="check every model in this dtype, cast as from_pretrained(dtype=) loads it")
    parser.add_argument("--write-docs", type=Path, default=None, help="write the Markdown page here")
    args = parser.parse_args(argv)
    from properties.strategies import load_profile
    from tests.field_bugs.catalogue import BUGS
    from tests.field_bugs.matrix import bug_matrix, docs, summary, to_markdown

    load_profile()
    torch.set_num_threads(1)  # the same weights and the same search everywhere
    bugs = BUGS if not args.bugs else [b for b in BUGS if b.name in args.bugs]
    unknown = set(args.bugs or ()) - {b.name for b in BUGS}
    if unknown:
        parser.error(f"unknown bugs {sorted(unknown)}: expected names from {[b.name for b in BUGS]}")
    matrix, frames = bug_matrix(bugs, seed=args.seed, max_examples=args.max_examples, dtype=args.dtype)
    print(to_markdown(matrix))
    print(summary(matrix, bugs))
    if args.write_docs is not None:
        command = "python -m tests.field_bugs --write-docs " + str(args.write_docs) + (
            f" --max-examples {args.max_examples}" if args.max_examples else "")
        args.write_docs.write_text(docs(matrix, frames, bugs, command))


if __name__ == "__main__":
    main()
