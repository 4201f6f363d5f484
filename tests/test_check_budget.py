"""The pass budget of a search left to the suite (max_examples=None; properties/budget.py).

A big model is simulated by a tiny one whose passes are priced as GPT-2 small's (its parameter
count patched): the budget is counted from sizes and pass counts, never from a clock, so what it
cuts is exact and asserted.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tr
from hypothesis import settings

from harness import ModelConfig, Transformer
from harness.adapters import adapt
from harness.errors import AttnlabError
from properties import budget, check_model
from properties.cost import counting, one_pass
from tests.mutants.catalogue import MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")
GPT2_SMALL = 124_439_808  # GPT2LMHeadModel's parameters at 12 layers x 768, vocab 50257 (wte tied to the head)


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=32, n_ctx=16, **kw)).eval()


@pytest.fixture
def priced_as_gpt2(monkeypatch):
    monkeypatch.setattr(budget, "parameter_count", lambda model: GPT2_SMALL)


def ran(frame):
    return frame[frame.status.isin(["pass", "fail"])].set_index("property")


def test_a_small_model_keeps_its_whole_search():
    frame = ran(check_model(tiny(positional_embedding_type="rotary"), max_examples=None))
    assert not frame.reason.str.contains("budget:").any(), frame.reason.to_dict()
    full = ran(check_model(tiny(positional_embedding_type="rotary"), max_examples=settings.default.max_examples))
    # the loaded profile's count: the same search, pass for pass, with and without the budget
    assert frame.drop(columns="seconds").equals(full.drop(columns="seconds"))


def test_a_big_model_runs_the_first_examples_of_its_search(priced_as_gpt2):
    model = tiny(positional_embedding_type="rotary")
    frame = ran(check_model(model))
    cut = frame[frame.reason.str.contains("budget:")]
    assert len(cut) == len(frame), frame.reason.to_dict()  # every row runs out at GPT-2 small's price
    assert cut.reason.str.contains(rf"budget: \d+ of {settings.default.max_examples} examples").all()
    examples = cut.reason.str.extract(r"budget: (\d+) of")[0].astype(int)
    assert (examples >= budget.MIN_EXAMPLES).all()
    # an exact row (one pass an example, no twin) keeps more examples than a calibrated logit row
    assert examples["causal_pattern"] > examples["batch_independence"]
    # as many examples as the budget pays for, priced by the first (the simplest, so the cheapest) input
    spent = cut.model_passes * GPT2_SMALL * 4 + cut.twin_passes * GPT2_SMALL * budget.TWIN_BYTES
    assert ((spent <= 2 * budget.ROW_BUDGET) | (examples == budget.MIN_EXAMPLES)).all(), spent.to_dict()
    again = ran(check_model(model))  # counted, not timed: the same seed cuts at the same examples
    assert again.model_passes.to_dict() == frame.model_passes.to_dict()
    assert again.reason.to_dict() == frame.reason.to_dict()


def test_an_explicit_max_examples_is_run_exactly(priced_as_gpt2):
    model = tiny()
    frame = ran(check_model(model, properties=["causal_pattern", "batch_independence"], max_examples=6))
    assert not frame.reason.str.contains("budget:").any()
    assert frame.loc["causal_pattern", "model_passes"] == 6  # one pass per example, no twin: exactly 6 examples


@pytest.mark.parametrize("name", ["causal_mask_off_by_one", "batch_axis_norm", "left_padding_shifts_positions",
                                  "kv_cache_restarts_positions"])
def test_a_budgeted_search_still_finds_and_shrinks_a_planted_bug(priced_as_gpt2, name):
    mutant = next(m for m in MUTANTS if m.name == name)
    frame = check_model(mutant.build(), properties=list(mutant.must_flag)).set_index("property")
    full = check_model(mutant.build(), properties=list(mutant.must_flag), max_examples=25).set_index("property")
    for prop in mutant.must_flag:
        assert frame.loc[prop, "status"] == "fail", (name, prop, frame.loc[prop, "reason"])
        # found among the first examples, then shrunk without a budget: the full search's counterexample
        assert frame.loc[prop, "counterexample"] == full.loc[prop, "counterexample"]


def test_a_cached_decoding_step_is_a_pass_whether_or_not_forward_sees_it():
    hf = tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=4)).eval()
    adapter = adapt(hf)
    x = torch.tensor([[1, 2]])
    with counting(adapter) as cost:
        with one_pass():  # the adapter's cached decoding calls the HF model, not its own forward
            adapter.forward_with_cache(x)
        with one_pass():  # a pass the hooks see is not counted twice
            adapter(x)
    assert cost.model_passes == 2
    own = tiny()
    with counting(own) as cost:
        with one_pass():
            own.forward_with_cache(x)
    assert cost.model_passes == 1


def test_budget_true_makes_an_explicit_max_examples_a_cap(priced_as_gpt2):
    """`attnlab check --max-examples 25` (budget on, its default): a large model's rows run within their budget;
    `--no-budget` runs exactly 25 (check_model's budget=False, the API's default)."""
    model = tiny(positional_embedding_type="rotary")
    capped = ran(check_model(model, max_examples=25, budget=True, properties=["causal_outputs"]))
    assert capped.reason.str.contains("budget: \\d+ of 25 examples").all(), capped.reason.to_dict()
    exact = ran(check_model(model, max_examples=25, properties=["causal_outputs"]))
    assert not exact.reason.str.contains("budget:").any()
    assert int(exact.model_passes.iloc[0]) > int(capped.model_passes.iloc[0])
    with pytest.raises(AttnlabError, match="budget='yes' is invalid"):
        check_model(model, budget="yes")
