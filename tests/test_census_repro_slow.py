"""docs/findings/, slow tier: every script still reproduces its bug on the pinned versions, run as a maintainer
would (outside the repository, no PYTHONPATH; each forked from one interpreter that imported torch and transformers,
set up as a fresh ``python script``, and one of them also run in a fresh interpreter to the same outcome), and the
folder is what the generator writes today (the scripts byte for byte; README.md from the outputs this run
recorded)."""

from __future__ import annotations

import re

import pytest

from reports.census import repro, repro_readme
from reports.census.enumerate import by_name
from reports.census.repro_run import Outcome, run_all, run_one
from reports.census.repro_select import live
from reports.census.repro_sites import SITES
from tests.helpers.shared_result import shared

pytestmark = pytest.mark.slow
# a number at rounding level (a control's 1e-17) may differ in its digits from run to run with the threads' reduction
# order; anything 1e-6 and larger is evidence and must match
_ROUNDING = re.compile(r"\d(\.\d+)?e-(0[7-9]|[1-9]\d)")


def _evidence(text: str) -> str:
    return _ROUNDING.sub("(rounding)", text)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, worker_id):
    """Each docs/findings script's outcome, two at a time (the tiny models take seconds; imports dominate); run once
    per test run (tests/helpers/shared_result.py)."""
    return shared(tmp_path_factory, worker_id, "findings_outcomes",
                  lambda: run_all(sorted(repro.FINDINGS_DIR.glob("*__*.py")), workers=2),
                  lambda d: {k: [o.returncode, o.stdout, o.stderr] for k, o in d.items()},
                  lambda d: {k: Outcome(*o) for k, o in d.items()})


@pytest.mark.long
def test_every_script_still_reproduces_and_is_what_the_generator_writes(outcomes) -> None:
    """One test reads the scripts' outcomes: two would land on both xdist workers, and the second would wait idle on
    the shared result's lock for minutes while the first computes it."""
    assert outcomes, "docs/findings holds no script: python -m reports.census.repro --write-docs"
    for name, out in outcomes.items():
        # exit 1: the bug is present; each prints expected against observed with its numbers
        assert out.returncode == 1, (name, out.returncode, out.stdout, out.stderr[-2000:])
        assert "expected:" in out.stdout and "observed" in out.stdout and "BUG PRESENT" in out.stdout, name
    # the folder is what the generator writes: the scripts, and the README with these outcomes
    repros = live()
    assert sorted(outcomes) == sorted(r.filename for r in repros), "stale or missing scripts: regenerate"
    for r in repros:
        assert (repro.FINDINGS_DIR / r.filename).read_text() == repro.render(r), f"{r.filename}: regenerate"
    sites = {r.filename: SITES[r.witness](r.model_type, by_name()[r.model_type].class_name) for r in repros}
    readme = repro_readme.render(repros, outcomes, sites, repro.versions)
    assert _evidence((repro.FINDINGS_DIR / "README.md").read_text()) == _evidence(readme), "README.md: regenerate"
    # a script's own interpreter gives the outcome its forked run gave (the imports shared, nothing else)
    first = sorted(outcomes)[0]
    alone, forked = run_one(repro.FINDINGS_DIR / first), outcomes[first]
    assert (alone.returncode, _evidence(alone.stdout)) == (forked.returncode, _evidence(forked.stdout)), first
