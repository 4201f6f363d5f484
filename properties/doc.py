"""docs/properties.md, generated from the property registry: ``python -m properties.doc --write docs/properties.md``.

One row per registered property (model properties in report order, then component properties):
what it checks (the first line of its docstring), the designs it applies to, the hooks it needs,
its tolerance and why, and the module that holds it. tests/test_properties_registry.py fails
when the file is stale.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from properties import checks as checks  # imported for its effect: every property registers itself
from properties.registry import Property, registered

COMMAND = "python -m properties.doc --write docs/properties.md"
HEADER = ["property", "kind", "what it checks", "applies to", "hooks needed", "tolerance", "module"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def row(prop: Property) -> list[str]:
    return [f"`{prop.name}`", prop.kind, prop.summary, prop.applies_to, prop.hooks_text, prop.tolerance_text,
            f"`{prop.module}`"]


def render(props: Optional[list[Property]] = None) -> str:
    """The whole of docs/properties.md for ``props`` (default: every registered property)."""
    props = registered() if props is None else props
    lines = [
        "# Properties",
        "",
        f"Generated from the property registry (`properties/registry.py`) by `{COMMAND}`; do not edit by hand.",
        "",
        "A **model** property is a row of `properties.check_model` (in this order): pass, fail (with a shrunk",
        "counterexample), n/a (the model's design is not one it applies to) or unobservable (a hook it needs",
        "does not exist or never fires; the reason names it). A **component** property checks a formula of",
        "`harness.model.positions` (or a drop-in replacement), not a model, so it is exported but is not a row.",
        "Adding a property is one module in `properties/checks/` (one `@model_property`) and its mutant in",
        "`tests/mutants/catalogue.py`.",
        "",
        "Each row also says what it cost: `model_passes`, `twin_passes` (its float64 golden copy's) and `seconds`",
        "(`properties/cost.py`). With `max_examples` left to it, a row on a big model runs within a budget of weight",
        "reads (`properties/budget.py`: 4 GiB a row, at least 3 examples; GPT-2 small in float32 gets 3 examples of a",
        "logit row, 8 of an exact one) and its reason says how many examples ran; a model under ~1.8M parameters runs",
        "its full search, and an explicit `max_examples` is run exactly.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + " --- |" * len(HEADER),
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row(p)) + " |" for p in props]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, default=None, help="write the table to this file (default: print it)")
    args = parser.parse_args(argv)
    text = render()
    if args.write is None:
        print(text, end="")
    else:
        args.write.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
