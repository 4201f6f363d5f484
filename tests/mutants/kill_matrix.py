"""The kill matrix: which property flags which mutant. ``python -m tests.mutants.kill_matrix`` prints it.

``--dtype bfloat16 float16`` casts every mutant (:func:`harness.adapters.placed`) and prints one
matrix per dtype. Cells: "killed" (the property failed on the mutant), "-" (it held), "n/a" (not
applicable), "n/c" (unobservable, e.g. not comparable: the model went non-finite); a property
the mutant's bug must break that holds at a dtype is "hidden (ratio r)": the bug is below that
dtype's noise floor (``r`` = deviation / allowance), reported, never a silent miss.
"""

from __future__ import annotations

import argparse
from typing import Optional

import pandas as pd

from harness.adapters.placement import placed
from properties import PROPERTIES, check_model
from properties.precision import HIDDEN
from properties.strategies import load_profile
from tests.mutants.catalogue import MUTANTS, Mutant


def mutant_results(mutant: Mutant, *, seed: int = 0, max_examples: Optional[int] = None,
                   dtype: Optional[str] = None) -> pd.DataFrame:
    return check_model(placed(mutant.build(), dtype=dtype), seed=seed, max_examples=max_examples)


def cell(row: pd.Series, must_flag: bool = False) -> str:
    if not row["applicable"]:
        return "n/a"
    if row["passed"] is None:
        return "n/c"
    if row["passed"]:
        if str(row.get("reason", "")).startswith(HIDDEN):  # the twin fails it: rounding hides a real deviation
            return f"hidden, twin fails (ratio {row['ratio']:.2g})"
        return f"hidden (ratio {row['ratio']:.2g})" if must_flag else "-"
    return "killed"


def kill_matrix(*, seed: int = 0, max_examples: Optional[int] = None, dtype: Optional[str] = None) -> pd.DataFrame:
    """Mutants x properties at ``dtype`` (None: as built, float32), each cell from :func:`cell`."""
    rows = {}
    for mutant in MUTANTS:
        frame = mutant_results(mutant, seed=seed, max_examples=max_examples, dtype=dtype).set_index("property")
        rows[mutant.name] = {p: cell(frame.loc[p], p in mutant.must_flag) for p in PROPERTIES}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(PROPERTIES))


def to_markdown(matrix: pd.DataFrame) -> str:
    header = "| mutant | " + " | ".join(matrix.columns) + " |"
    rule = "| --- " * (len(matrix.columns) + 1) + "|"
    body = ["| " + name + " | " + " | ".join(row) + " |" for name, row in matrix.iterrows()]
    return "\n".join([header, rule, *body])


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--dtype", nargs="*", default=[None], help="float32 bfloat16 float16 (default: as built)")
    args = parser.parse_args(argv)
    load_profile()
    for dtype in args.dtype:
        if dtype is not None:
            print(f"\n{dtype}:\n")
        print(to_markdown(kill_matrix(seed=args.seed, max_examples=args.max_examples, dtype=dtype)))


if __name__ == "__main__":
    main()
