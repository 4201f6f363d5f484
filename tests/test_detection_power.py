"""Detection power (reports/power): planted bugs of graded size, their controls, and the table they make.

Fast tier: the tiny subjects at float32 (and one bfloat16 case), each family's control passing and a
planted size caught by the family's row; the bug travels into the golden twin; bad input is refused
before any work. The whole measurement against docs/power.json is tests/test_detection_power_slow.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from harness.adapters import adapt
from harness.errors import AttnlabError
from properties.precision import golden_twin
from reports.power.measure import Cell, check_args, measure, one, verdict_of
from reports.power.plant import FAMILIES, ROTARY_BUGS, plant
from reports.power.subjects import subjects
from reports.power.write import BEGIN, END, cell_text, heatmap, markdown, replace_section, summary

pytestmark = pytest.mark.usefixtures("one_thread")
OURS, LLAMA = subjects()[0], subjects()[1]
# the largest size of each family: any row that exists for it must fail on it in float32
# (not on attnlab's Transformer: the window family needs a declared window, the rotary ones a Hugging Face config)
FAMILY_CASES = [(s, f) for s in (OURS, LLAMA) for f in FAMILIES
                if not (s is OURS and (f == "window_wider" or f in ROTARY_BUGS))]


@pytest.mark.parametrize(("subject", "fam"), FAMILY_CASES, ids=lambda x: getattr(x, "name", x))
def test_control_passes_and_the_largest_size_is_caught(subject, fam):
    control = one(subject, "float32", fam, 0.0, max_examples=5)
    assert control.verdict == "pass", control
    planted = one(subject, "float32", fam, FAMILIES[fam].sizes[-1], max_examples=5)
    assert planted.verdict == "caught", planted
    assert planted.ratio > 1 and control.ratio <= 1


def test_a_window_family_on_a_model_without_windows_is_not_applicable():
    cell = one(OURS, "float32", "window_wider", 1, max_examples=2)
    assert cell.verdict == "n/a" and "sliding_window" in cell.reason


def test_the_bug_is_in_the_golden_twin_too():
    # a bug only in the model would sit in the floor and hide itself: the twin is a deep copy and keeps it
    model = plant(LLAMA.load("float32"), "pad_leak", 0.1)
    twin = golden_twin(adapt(model))
    attn = twin.hf_model.model.layers[0].self_attn
    assert type(attn) is type(model.model.layers[0].self_attn) and attn._planted == ("pad_leak", 0.1)
    assert next(twin.hf_model.parameters()).dtype == torch.float64


def test_the_scale_bug_keeps_the_declared_scale():
    model = plant(LLAMA.load("float32"), "scale_error", 0.05)
    declared = model.model.layers[0].self_attn.scaling
    assert adapt(model).cfg.attn_scale == pytest.approx(declared)  # the adapter sees what the module declares
    x = torch.arange(6)[None]
    clean = LLAMA.load("float32")
    with torch.no_grad():
        assert not torch.allclose(model(x).logits, clean(x).logits)  # and the kernel gets another one


def test_decode_offset_moves_only_cached_steps():
    clean, planted = OURS.load("float32"), plant(OURS.load("float32"), "decode_offset", 1)
    x = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(planted(x), clean(x), rtol=0, atol=0)  # the full forward is untouched
        _, past = planted.forward_with_cache(x[:, :3])
        step, _ = planted.forward_with_cache(x[:, 3:4], past=past)
        assert (step[:, 0] - clean(x[:, :4])[:, 3]).abs().max() > 1e-3


@pytest.mark.parametrize(("name", "size"), [("nope", 1), ("pad_leak", -1e-3), ("scale_error", math.nan),
                                            ("causal_leak", "1")])
def test_bad_plants_are_refused(name, size):
    with pytest.raises(AttnlabError, match="family|size"):
        plant(OURS.load("float32"), name, size)


def test_plant_refuses_a_model_it_cannot_reach():
    with pytest.raises(AttnlabError, match="cannot plant into Linear"):
        plant(torch.nn.Linear(2, 2), "pad_leak", 0.1)


@pytest.mark.parametrize(("dtypes", "families", "match"), [(["float8"], ["pad_leak"], "dtypes"),
                                                           (["float32"], ["nope"], "families"),
                                                           ([], ["pad_leak"], "dtypes")])
def test_bad_measure_arguments_are_refused(dtypes, families, match):
    with pytest.raises(AttnlabError, match=match):
        check_args([OURS], dtypes, families)


def test_measure_stops_at_the_first_caught_size_and_renders():
    cells = measure([OURS], ["float32"], ["pad_leak"], max_examples={"ours": 5})
    assert [c.size for c in cells] == [0.0, FAMILIES["pad_leak"].sizes[0]]  # caught at the smallest: stop
    records = summary(cells)
    ratios = records[0].pop("ratios")
    assert ratios["0"] < 1 < ratios["0.0001"], ratios  # the control passes, the leak fails: each run's ratio kept
    assert records == [{"subject": "ours", "family": "pad_leak", "dtype": "float32", "row": "padding_outputs",
                        "control": "pass", "caught_at": 1e-4, "sizes": {"0.0001": "caught"}, "reason": ""}]
    text = markdown(records, 1.0)
    assert "| ours | pad_leak (padding_outputs) | caught at 0.0001 |" in text
    assert heatmap(records).axes
    page = replace_section(f"a\n{BEGIN}\nold\n{END}\nb", "new")
    assert page == f"a\n{BEGIN}\nnew\n{END}\nb"
    with pytest.raises(AttnlabError, match="markers"):
        replace_section("no markers", "new")


def test_verdicts_and_cell_texts():
    assert verdict_of("fail", "", 0.0) == "false alarm" and verdict_of("fail", "", 1.0) == "caught"
    assert verdict_of("pass", "hidden under rounding (bfloat16): ...", 1.0) == "hidden"
    assert verdict_of("pass", "hidden under rounding (bfloat16): ...", 0.0) == "false alarm"
    assert verdict_of("n/a", "", 1.0) == "n/a"
    entry = {"control": "pass", "caught_at": None, "sizes": {"0.01": "hidden", "0.1": "missed"}, "reason": ""}
    assert cell_text(entry) == "hidden up to 0.1"
    assert cell_text({**entry, "control": "false alarm"}) == "FALSE ALARM on the control"


def test_a_planted_bfloat16_decode_offset_is_caught_on_ours():
    cell = one(OURS, "bfloat16", "decode_offset", 1, max_examples=5)
    assert cell.verdict == "caught", cell
    assert isinstance(cell, Cell) and cell.allowance > 0


def test_planting_twice_reuses_one_class():
    a, b = plant(OURS.load("float32"), "pad_leak", 0.1), plant(copy.deepcopy(OURS.load("float32")), "pad_leak", 0.01)
    assert type(a) is type(b)


@pytest.mark.parametrize("row", ["padding_outputs", "padding_pattern"])
def test_a_left_pad_leak_is_caught_where_the_search_draws_only_right_padding(monkeypatch, row):
    # right padding sits after every real token: only the mirrored (left-padded) batch can show the leak
    from properties import PROPERTIES
    from properties.checks import padding_logits, padding_mask
    from properties.strategies import padded_batches

    def right_only(cfg):
        return padded_batches(cfg.d_vocab, max_batch=2, max_len=3, max_pad=2, sides=("right",))

    monkeypatch.setattr(padding_logits, "padded_inputs", right_only)
    monkeypatch.setattr(padding_mask, "padded_inputs", right_only)
    model = plant(OURS.load("float32"), "pad_leak", 1e-2)
    with torch.no_grad():
        result = PROPERTIES[row](adapt(model), seed=0, max_examples=2)
    assert result.status == "fail" and "mirrored" in result.counterexample, result
    with torch.no_grad():
        control = PROPERTIES[row](adapt(plant(OURS.load("float32"), "pad_leak", 0)), seed=0, max_examples=2)
    assert control.status == "pass", control
