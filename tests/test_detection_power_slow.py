"""Slow tier: detection power re-measured (``python -m reports.power``) equals the stored table, docs/power.json.

Seeded, with fixed example counts, so the same code gives the same verdicts: a difference means a check,
an allowance or a planted bug changed, and docs/precision.md's "Detection power" section is then
regenerated with ``python -m reports.power --write-docs``. Every family is re-run on the tiny models; on
SmolLM2 (30 layers a pass: the whole table takes ~20 min on two loaded cores) the families of the realistic
bugs it must catch (:data:`SMOLLM2_FAMILIES`): 202 s in all on two loaded cores. SmolLM2 comes from the
converted cache of tests/helpers/checkpoints.py (skipped, naming the package, where it is not installed).
"""

from __future__ import annotations

import json

import pytest

from reports.power.measure import measure
from reports.power.subjects import subjects
from reports.power.write import DOCS, summary
from tests.helpers.checkpoints import converted

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_FAMILIES = ("decode_offset", "window_wider", "scale_error")


def _key(record):
    return record["subject"], record["family"], record["dtype"]


@pytest.fixture(scope="module")
def stored():
    return {_key(r): r for r in json.loads((DOCS / "power.json").read_text())}


@pytest.fixture(scope="module")
def remeasured():
    tiny, smollm2 = subjects()[:2], subjects(converted(SMOLLM2))[2]
    cells = measure(tiny) + measure([smollm2], families=SMOLLM2_FAMILIES)
    return {_key(r): r for r in summary(cells)}


def test_the_measurement_reproduces_the_stored_table(stored, remeasured):
    assert set(remeasured) <= set(stored)
    changed = {k: (stored[k]["sizes"], remeasured[k]["sizes"]) for k in remeasured
               if (stored[k]["control"], stored[k]["caught_at"], stored[k]["sizes"])
               != (remeasured[k]["control"], remeasured[k]["caught_at"], remeasured[k]["sizes"])}
    assert not changed, changed


def test_no_control_is_a_false_alarm(remeasured):
    assert [k for k, r in remeasured.items() if r["control"] == "false alarm"] == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("family", "at_most"), [("decode_offset", 1), ("window_wider", 1)])
def test_realistic_bugs_in_smollm2_are_caught(remeasured, dtype, family, at_most):
    record = remeasured[("smollm2", family, dtype)]
    assert record["caught_at"] is not None and record["caught_at"] <= at_most, record
