"""The mutation catalogue (tests/mutants/): check_model flags every mutant, through the properties its
bug must break, and passes the unbroken reference model of every configuration the mutants use.

One check_model run per mutant with a small search (10 examples; the shrunk counterexamples are
one or two tokens, so a bug is found within the first few examples). The full kill matrix at the
ci profile's 25 examples: ``python -m tests.mutants.kill_matrix``.
"""

from __future__ import annotations

import pytest

from properties import PROPERTIES, check_model
from tests.mutants.base import RefConfig, RefModel
from tests.mutants.catalogue import MUTANTS

MAX_EXAMPLES = 10


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_flagged(mutant):
    frame = check_model(mutant.build(), max_examples=MAX_EXAMPLES).set_index("property")
    for name in mutant.must_flag:
        row = frame.loc[name]
        assert row.applicable and row.passed is False, f"{mutant.name} ({mutant.bug}) escaped {name}"
    failed = frame[frame.passed == False]  # noqa: E712
    assert (failed.worst > failed.tolerance).all()
    assert failed.counterexample.str.startswith(("tokens=", "prompt=")).all()


# the encoder-decoder mutants' reference (harness's EncoderDecoder) is checked in tests/test_properties_cross.py
@pytest.mark.parametrize("cfg", sorted({m.cfg for m in MUTANTS if isinstance(m.cfg, RefConfig)}, key=repr),
                         ids=lambda c: f"{c.positional_embedding_type}-{c.attention_dir}-{c.normalization_type}")
def test_reference_model_passes(cfg):
    # the kills above come from the planted bugs: the same model without them raises no alarm
    frame = check_model(RefModel(cfg), max_examples=MAX_EXAMPLES)
    failed = frame[frame.passed == False]  # noqa: E712
    assert failed.empty, failed.to_dict("records")


def test_catalogue():
    names = [m.name for m in MUTANTS]
    assert len(names) >= 12 and len(set(names)) == len(names)
    flagged = {p for m in MUTANTS for p in m.must_flag}
    assert flagged <= set(PROPERTIES)
    # every model-level property is shown to bite on at least one mutant
    assert flagged == set(PROPERTIES)
