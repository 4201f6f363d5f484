"""The field-bug catalogue (tests/field_bugs/): every replayed public bug is really wrong (its witness), the
property suite catches it through the properties it names, and the same model unpatched raises no alarm.

Fast tier: the catalogue's shape, every witness, and a sample of bugs (one per family) checked through
their named properties. Slow tier: the rest, and every unpatched model through the whole suite. The
full matrix: ``python -m tests.field_bugs``.
"""

from __future__ import annotations

import pytest

from properties import PROPERTIES
from tests.field_bugs.catalogue import BUGS, KNOWN_FALSE_ALARMS
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
    assert SAMPLE <= set(names) and set(KNOWN_FALSE_ALARMS) <= set(names)
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


# strict: once the cause of a known false alarm is fixed the test turns red and the entry must go
def _alarm_tiered(bugs):
    return [pytest.param(b, id=b.name, marks=[pytest.mark.slow] + (
        [pytest.mark.xfail(strict=True, reason=KNOWN_FALSE_ALARMS[b.name])] if b.name in KNOWN_FALSE_ALARMS else []))
        for b in bugs]


@pytest.mark.parametrize("bug", _alarm_tiered(BUGS))
def test_unpatched_model_raises_no_alarm(bug):
    frame = run(bug, patched=False, max_examples=MAX_EXAMPLES)
    failed = frame[frame.status == "fail"]
    assert failed.empty, failed[["property", "worst", "counterexample"]].to_dict("records")


def _llama_bf16(cast: bool):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.field_bugs import models

    if cast:  # the user's cast: Module.to casts the non-persistent inv_freq buffer as well
        return models.llama(n_ctx=2048).to(torch.bfloat16)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(models.llama(n_ctx=2048).config, dtype=torch.bfloat16).eval()


def test_live_bf16_cast_rounds_inv_freq():
    # transformers #25681 still reproduces unpatched in the installed release: .to(torch.bfloat16) rounds
    # LlamaRotaryEmbedding.inv_freq to bf16, building the model in bf16 (dtype=) keeps it in float32
    import torch

    from harness.adapters import adapt
    from properties import check_model

    cast, built = _llama_bf16(True), _llama_bf16(False)
    assert cast.model.rotary_emb.inv_freq.dtype == torch.bfloat16  # the witness: the buffer itself
    assert built.model.rotary_emb.inv_freq.dtype == torch.float32
    bad = check_model(adapt(cast), properties=["rotary_precision"], max_examples=MAX_EXAMPLES).iloc[0]
    good = check_model(adapt(built), properties=["rotary_precision"], max_examples=MAX_EXAMPLES).iloc[0]
    assert bad.status == "fail" and "position_offset=" in bad.counterexample, bad.to_dict()
    assert good.status == "pass", good.to_dict()
