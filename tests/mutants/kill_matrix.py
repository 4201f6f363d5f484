"""The kill matrix: which property flags which mutant. ``python -m tests.mutants.kill_matrix`` prints it.

Cells: "killed" (the property failed on the mutant), "-" (it held), "n/a" (not applicable).
"""

from __future__ import annotations

import argparse
from typing import Optional

import pandas as pd

from properties import PROPERTIES, check_model
from tests.mutants.catalogue import MUTANTS, Mutant


def mutant_results(mutant: Mutant, *, seed: int = 0, max_examples: Optional[int] = None) -> pd.DataFrame:
    return check_model(mutant.build(), seed=seed, max_examples=max_examples)


def cell(row: pd.Series) -> str:
    if not row["applicable"]:
        return "n/a"
    return "-" if row["passed"] else "killed"


def kill_matrix(*, seed: int = 0, max_examples: Optional[int] = None) -> pd.DataFrame:
    """Mutants x properties, each cell from :func:`cell`."""
    rows = {}
    for mutant in MUTANTS:
        frame = mutant_results(mutant, seed=seed, max_examples=max_examples).set_index("property")
        rows[mutant.name] = {p: cell(frame.loc[p]) for p in PROPERTIES}
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
    args = parser.parse_args(argv)
    from properties.strategies import load_profile

    load_profile()
    print(to_markdown(kill_matrix(seed=args.seed, max_examples=args.max_examples)))


if __name__ == "__main__":
    main()
