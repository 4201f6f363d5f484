"""The field-bug catalogue (tests/field_bugs/): every replayed public bug is really wrong (its witness), the
property suite catches it through the properties it names, and the same model unpatched raises no alarm.

Fast tier: the catalogue's shape, every witness, and a sample of bugs (one per family) checked through
their named properties. Slow tier: the rest, and every unpatched model through the whole suite. The
full matrix: ``python -m tests.field_bugs``.
"""

from __future__ import annotations

import pytest

from properties import PROPERTIES
from tests.field_bugs.catalogue import BUGS
from tests.field_bugs.matrix import run

MAX_EXAMPLES = 10  # the shrunk counterexamples are a few tokens; each bug is found within the first examples
SAMPLE = {"hf29623_window_one_wider", "aprender2143_alibi_exponent_off_by_one",
          "pytorch103749_minus_inf_padding_rows", "hf25681_llama_inv_freq_bf16"}

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiered(bugs):
    return [pytest.param(b, id=b.name, marks=() if b.name in SAMPLE else pytest.mark.slow) for b in bugs]


def test_catalogue():
    names = [b.name for b in BUGS]
    assert len(names) >= 12 and len(set(names)) == len(names)
    assert SAMPLE <= set(names)
    for bug in BUGS:
        assert bug.links and all(url.startswith("https://github.com/") for _, url in bug.links), bug.name
        assert bug.must_flag and set(bug.must_flag) <= set(PROPERTIES), bug.name
        assert bug.summary and bug.replay, bug.name


@pytest.mark.parametrize("bug", BUGS, ids=lambda b: b.name)
def test_witness_shows_the_bug(bug):
    # independent of the suite: the patched model differs from the unpatched one (or from a hand-made value)
    finding = bug.witness()
    assert isinstance(finding, str) and finding


@pytest.mark.parametrize("bug", _tiered(BUGS))
def test_bug_is_caught(bug):
    frame = run(bug, properties=list(bug.must_flag), max_examples=MAX_EXAMPLES).set_index("property")
    for name in bug.must_flag:
        row = frame.loc[name]
        assert row.status == "fail", f"{bug.name} escaped {name}: {row.status} {row.reason}"
        assert row.worst > row.tolerance and row.counterexample.startswith("tokens=")


@pytest.mark.parametrize("bug", _tiered(BUGS))
def test_unpatched_model_passes_the_named_properties(bug):
    frame = run(bug, patched=False, properties=list(bug.must_flag), max_examples=MAX_EXAMPLES)
    assert (frame.status == "pass").all(), frame[["property", "status", "worst", "counterexample"]].to_dict("records")


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS, ids=lambda b: b.name)
def test_unpatched_model_raises_no_alarm(bug):
    frame = run(bug, patched=False, max_examples=MAX_EXAMPLES)
    failed = frame[frame.status == "fail"]
    assert failed.empty, failed[["property", "worst", "counterexample"]].to_dict("records")
