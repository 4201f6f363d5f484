"""docs/findings/README.md: a short report per live finding, from the scripts' recorded outputs.

Grouped by witness kind (the summary once), then one entry per script: the findings it stands for, its output and exit
code when the docs were made, the lines at fault, how to run it.
"""

from __future__ import annotations

from collections.abc import Callable

from reports.census.repro_run import Outcome
from reports.census.repro_select import CLAIMS, Repro

INTRO = """# Census findings, reproduced without attnlab

Each `TYPE__witness.py` here reproduces live findings of attnlab's census (docs/models.md: "Census findings", "Bridge
findings", "Findings of some configurations") with torch and transformers only (a bridge finding: also
transformer_lens, where the bug is). Each builds the census's tiny random model from a literal config (seed 0, no
download), runs the witness's minimal input, prints expected against observed, and exits **1 while the bug is
present**, 0 once it is fixed (2: a control the witness relies on failed, so the script needs a look).

Run one: `python docs/findings/bart__left_padding_moves_positions.py`. One type's scripts, anywhere:
`attnlab census --repro TYPE --out DIR`. Regenerate this folder (it runs every script to record its output):
`python -m reports.census.repro --write-docs`. The slow tier (tests/test_census_repro_slow.py) runs them all and
checks that this folder is what the generator writes today.
"""


def _block(text: str) -> list[str]:
    return ["  ```", *(f"  {line}" for line in text.strip().splitlines()), "  ```"]


def render(repros: list[Repro], outputs: dict[str, Outcome], sites: dict[str, list[str]],
           versions: Callable[[Repro], str]) -> str:
    lines = [INTRO]
    kinds: dict[str, list[Repro]] = {}
    for repro in repros:
        kinds.setdefault(repro.witness, []).append(repro)
    for witness, group in sorted(kinds.items()):
        types = ", ".join(r.model_type for r in group)
        expected, observed = CLAIMS[witness]
        lines += [f"## {witness} ({types})", "", group[0].findings[0].summary, "",
                  f"Expected: {expected}. Observed: {observed}.", ""]
        for repro in group:
            out = outputs[repro.filename]
            census = "census" if repro.source == "census" else f"{repro.source} census"
            lines += [f"### {repro.model_type}: {', '.join(repro.props)} ({census})", "",
                      f"- Script: [`{repro.filename}`]({repro.filename}); made with {versions(repro)}.",
                      f"- Output (exit {out.returncode}):", *_block(out.stdout or out.stderr[-2000:]),
                      "- At fault:", *(f"  - `{s}`" for s in sites[repro.filename]),
                      f"- Run: `python docs/findings/{repro.filename}` (exit 1 while the bug is present).", ""]
    return "\n".join(lines).rstrip() + "\n"
