"""properties.testing.assert_properties: the property suite as one assertion in a user's own tests."""

from __future__ import annotations

import pytest

from properties.testing import assert_properties
from tests.helpers.protocol_models import SilentPattern, ref_model
from tests.mutants.base import RefConfig, RefModel
from tests.mutants.catalogue import MUTANTS

FAST = 4

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_correct_model_passes_and_the_table_comes_back():
    table = assert_properties(RefModel(RefConfig(n_layers=1)), ["causal_outputs", "attention_scale"],
                              max_examples=FAST)
    assert list(table.status) == ["pass", "pass"]


def test_a_failure_lists_each_failed_property_with_its_shrunk_counterexample():
    mutant = next(m for m in MUTANTS if m.name == "causal_mask_off_by_one")
    with pytest.raises(AssertionError) as err:
        assert_properties(mutant.build(), ["causal_outputs", "causal_pattern", "padding_pattern"], seed=1,
                          max_examples=FAST)
    msg = str(err.value)
    assert msg.startswith("2 of 3 properties failed (3 checked, seed=1):")
    assert "- causal_outputs: worst " in msg and "- causal_pattern: worst " in msg
    assert "padding_pattern" not in msg
    assert "counterexample: tokens=[[0, 0]]" in msg  # shrunk: two tokens show a key seen one ahead


def test_unobservable_rows_fail_only_when_asked():
    model = ref_model(SilentPattern)
    assert_properties(model, ["causal_pattern", "causal_outputs"], max_examples=FAST)  # n/a and unobservable pass
    with pytest.raises(AssertionError, match=r"causal_pattern: unobservable: hook blocks\.0\.attn\.hook_pattern"):
        assert_properties(model, ["causal_pattern", "causal_outputs"], max_examples=FAST, allow_unobservable=False)


def test_bad_arguments():
    with pytest.raises(TypeError, match="allow_unobservable"):
        assert_properties(RefModel(RefConfig()), allow_unobservable="yes")
    with pytest.raises(ValueError, match="seed"):
        assert_properties(RefModel(RefConfig()), seed=-1)
