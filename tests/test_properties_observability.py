"""Observability: pass / fail / n/a / unobservable, plain modules and functions, and the model's own KV cache.

A hook that is missing, never fires, or that the harness's own hook code cannot read makes only
the properties that need it unobservable (its name in the reason), never failed; output-level
properties judge a plain ``nn.Module`` or function given with a cfg; ``kv_cache`` decodes through
the optional ``forward_with_cache`` (tests/mutants/base.py and ``harness.Transformer`` have it).
"""

from __future__ import annotations

import math

import pytest
import torch

import properties
from harness import ModelConfig, Transformer
from harness.adapters.protocol import check_protocol, observed_hooks
from properties.search import PropertyResult
from tests.helpers.protocol_models import PlainLM, SilentPattern, TuplePattern, ref_model
from tests.mutants.base import RefConfig, RefModel
from tests.mutants.catalogue import MUTANTS

FAST = 6
PATTERN_ROWS = ("causal_pattern", "pattern_distribution", "padding_pattern")
OUTPUT_ROWS = ("causal_outputs", "padding_outputs", "batch_independence", "relative_position")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_result_kinds_are_consistent():
    assert PropertyResult("p", True, None, math.nan, 0.0).status == "unobservable"
    assert PropertyResult("p", False, None, math.nan, 0.0).status == "n/a"
    assert PropertyResult("p", True, False, 1.0, 0.0, "x").status == "fail"
    with pytest.raises(ValueError, match="status='pass'"):
        PropertyResult("p", True, False, 1.0, 0.0, status="pass")


def test_a_hook_that_never_fires_makes_only_its_properties_unobservable():
    model = ref_model(SilentPattern)
    name = "blocks.0.attn.hook_pattern"
    assert name in model.hook_dict and name not in observed_hooks(model)
    with pytest.raises(TypeError, match=f"hook point {name} never fires"):
        check_protocol(model)  # the full protocol: every required hook must fire
    check_protocol(model, hooks=False)  # the suite's part: forward and cfg
    frame = properties.check_model(model, max_examples=FAST).set_index("property")
    assert not (frame.status == "fail").any(), frame[frame.status == "fail"].to_dict("index")
    for prop in PATTERN_ROWS:
        r = frame.loc[prop]
        assert r.status == "unobservable" and r.applicable and r.passed is None and math.isnan(r.worst)
        assert name in r.reason and "never fires" in r.reason
    for prop in (*OUTPUT_ROWS, "attention_scale"):  # scores still fire: the scale is still checked
        assert frame.loc[prop, "status"] == "pass"


def test_a_crash_in_the_harness_hook_is_unobservable_not_failed():
    r = properties.check_model(ref_model(TuplePattern), max_examples=FAST, properties=["causal_pattern"]).iloc[0]
    assert r.status == "unobservable"
    assert "harness's hook on blocks.0.attn.hook_pattern failed: AttributeError" in r.reason


def test_a_bug_stays_a_failure_when_other_hooks_are_silent():
    class SilentOffByOne(SilentPattern):  # the causal mask sees one key ahead, and hook_pattern is silent
        def allowed(self, q_idx, k_idx, key_mask):
            ok = (k_idx[None, :] <= q_idx[:, None] + 1)[None] & key_mask[:, None, :]
            return ok[:, None]

    frame = properties.check_model(ref_model(SilentOffByOne), max_examples=FAST,
                                   properties=["causal_outputs", "causal_pattern"]).set_index("property")
    assert frame.loc["causal_outputs", "status"] == "fail"
    assert frame.loc["causal_pattern", "status"] == "unobservable"


# --- plain modules and functions ----------------------------------------------------------------

PLAIN_CFG = dict(n_layers=1, n_heads=1, d_head=16, d_model=16, d_vocab=16, n_ctx=16,
                 positional_embedding_type="none", attention_dir="causal")


@pytest.mark.parametrize("as_function", [False, True], ids=["module", "function"])
def test_a_plain_module_or_function_gets_its_output_properties_checked(as_function):
    plain = PlainLM()
    target = (lambda tokens, attention_mask=None, position_offset=0: plain(tokens, attention_mask)) \
        if as_function else plain
    frame = properties.check_model(target, cfg=PLAIN_CFG, max_examples=FAST).set_index("property")
    for prop in OUTPUT_ROWS:
        assert frame.loc[prop, "status"] == "pass", frame.loc[prop].to_dict()
    for prop in (*PATTERN_ROWS, "attention_scale"):
        r = frame.loc[prop]
        assert r.status == "unobservable" and "no hook point blocks.0.attn" in r.reason
    assert frame.loc["kv_cache", "status"] == "n/a"  # neither forward_with_cache nor generate
    assert set(frame.status) <= {"pass", "n/a", "unobservable"}


def test_a_plain_module_that_ignores_padding_fails_padding_outputs():
    r = properties.check_model(PlainLM(use_mask=False), cfg=PLAIN_CFG, max_examples=FAST,
                               properties=["padding_outputs"]).iloc[0]
    assert r.status == "fail" and "mask=" in r.counterexample


def test_cfg_is_only_for_plain_models():
    with pytest.raises(ValueError, match="HookedRootModule"):
        properties.check_model(RefModel(RefConfig()), cfg=PLAIN_CFG)
    with pytest.raises(TypeError, match=r"check_model\(model, cfg=\.\.\.\)"):
        properties.check_model(PlainLM())
    with pytest.raises(TypeError, match="n_ctx"):
        properties.check_model(PlainLM(), cfg={k: v for k, v in PLAIN_CFG.items() if k != "n_ctx"})


# --- the model's own KV cache ----------------------------------------------------------------------

def test_harness_forward_with_cache_equals_a_full_forward_on_a_left_padded_batch():
    model = Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=32, n_ctx=32,
                                    positional_embedding_type="rotary", init_range=0.2)).eval()
    prompt = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    chunk = torch.tensor([[7, 8], [9, 10]])
    with torch.no_grad():
        first, past = model.forward_with_cache(prompt, attention_mask=mask)
        second, _ = model.forward_with_cache(chunk, past=past)
        full = model(torch.cat((prompt, chunk), 1), attention_mask=torch.cat((mask, torch.ones_like(chunk)), 1))
    # float32, same kernels: the cached and full passes differ only in summation order (~1e-7)
    torch.testing.assert_close(second, full[:, 4:], atol=1e-5, rtol=0)
    torch.testing.assert_close(first[:, -1], full[:, 3], atol=1e-5, rtol=0)
    with pytest.raises(TypeError, match="past must be None or the KVCache"):
        model.forward_with_cache(chunk, past=object())


def test_kv_cache_decodes_through_forward_with_cache_and_catches_a_restarting_cache():
    ok = properties.kv_cache(RefModel(RefConfig(positional_embedding_type="standard")), max_examples=FAST)
    assert ok.status == "pass" and ok.reason == "decoded through forward_with_cache"
    mutant = next(m for m in MUTANTS if m.name == "kv_cache_restarts_positions")
    bad = properties.kv_cache(mutant.build(), max_examples=FAST)
    assert bad.status == "fail" and "decoded through forward_with_cache" == bad.reason
    assert "then chunks=" in bad.counterexample


def test_kv_cache_falls_back_to_generate():
    mutant = next(m for m in MUTANTS if m.name == "kv_cache_restarts_positions")
    generate_only = type("GenerateOnly", (mutant.model_cls,), {"forward_with_cache": None})(mutant.cfg)
    bad = properties.kv_cache(generate_only, max_examples=FAST)
    assert bad.status == "fail" and bad.reason == "decoded through generate (greedy)"
    assert "new tokens=" in bad.counterexample


def test_an_input_the_adapter_cannot_express_is_unobservable_but_a_model_error_fails():
    from harness.adapters.protocol import UnsupportedInput

    class NoOffsetAdapter(RefModel):  # an adapter whose wrapped model takes no position ids
        def forward(self, tokens, attention_mask=None, position_offset=0, cache=None):
            if position_offset:
                raise UnsupportedInput(f"position_offset={position_offset}: this architecture takes no position ids")
            return super().forward(tokens, attention_mask, position_offset, cache)

    class NoOffsetModel(RefModel):  # the same refusal from the model's own code is the model's failure
        def forward(self, tokens, attention_mask=None, position_offset=0, cache=None):
            if position_offset:
                raise ValueError("position_offset is not supported")
            return super().forward(tokens, attention_mask, position_offset, cache)

    cfg = RefConfig(n_layers=1, positional_embedding_type="rotary")
    r = properties.relative_position(NoOffsetAdapter(cfg), max_examples=FAST)
    assert r.status == "unobservable" and "the adapter cannot run this input: position_offset=1" in r.reason
    r = properties.relative_position(NoOffsetModel(cfg), max_examples=FAST)
    assert r.status == "fail" and "raised ValueError: position_offset is not supported" in r.counterexample
