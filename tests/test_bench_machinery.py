"""The benchmark suite's machinery, fast: every row runs at a tiny size, the table renders, bad
input is refused, and the suite's check that hooks added after ``torch.compile`` fire through
``HookAwareCompiled`` (the wrapper itself, and inside training: tests/test_compiled.py).
Timings are not checked here (one round at tiny shapes means nothing): that is ``nox -s bench``.
"""

import math

import pandas as pd
import pytest
import torch

import harness.model.layers
import harness.model.transformer
from harness import ModelConfig, Transformer
from reports.bench.cases import hook_points
from reports.bench.core import Row, interleaved_medians, interleaved_times, paired_ratio
from reports.bench.reference import PlainGPT, naive_head_ablation
from reports.bench.suite import COLUMNS, format_table, run_suite
from reports.bench.train import compiled_hook_check

ROW_FAMILIES = ("train step vs plain GPT", "MFU of the train step", "idle hooks vs bypassed",
                "every hook vs forward", "names_filter one hook vs forward", "bytes kept / bytes requested",
                "head ablation", "gradient importance", "forward vs HF GPT-2", "run_with_cache vs HF GPT-2")


@pytest.fixture(scope="module")
def smoke() -> pd.DataFrame:
    return run_suite("smoke", device="cpu")


def test_smoke_table_has_every_row(smoke):
    assert list(smoke.columns) == COLUMNS
    for family in ROW_FAMILIES:
        assert smoke["name"].str.contains(family, regex=False).any(), family
    assert smoke["name"].str.contains("train step vs plain GPT").sum() == 2  # two sizes in smoke mode
    assert all(math.isfinite(v) and v > 0 for v in smoke["ratio"])
    assert all(isinstance(v, bool) for v in smoke["met"])
    text = format_table(smoke)
    assert all(name in text for name in smoke["name"])
    assert "mode=smoke" in text


def test_smoke_contenders_compute_the_same(smoke):
    checks = smoke.attrs["checks"]
    assert checks["cache_all_keys_missing"] == 0
    assert checks["cache_one_extra_keys"] == 0
    # The batched probe and the naive loop in float32: summation order differs, losses ~ ln(64) ~ 4.
    assert checks["ablation_vs_naive_max_abs"] < 1e-4
    assert checks["bridge_logprob_max_abs"] < 1e-4  # same weights, different float32 kernels
    memory = smoke[smoke["name"].str.contains("bytes kept")].iloc[0]
    assert memory["ratio"] == 1.0  # exactly the one requested activation is kept


def test_row_goal_direction():
    assert Row("a", 1.0, 2.0, "s", 2.0, ">=", 1.0).met
    assert not Row("a", 1.0, 2.0, "s", 0.9, ">=", 1.0).met
    assert Row("a", 1.0, 1.0, "s", 1.02, "<=", 1.03).met
    assert not Row("a", 1.0, 1.0, "s", 1.04, "<=", 1.03).met
    assert not Row("a", 1.0, 1.0, "s", math.nan, "<=", 1.03).met
    with pytest.raises(ValueError, match="op"):
        Row("a", 1.0, 1.0, "s", 1.0, ">", 1.0)


@pytest.mark.parametrize("mode, device, error", [
    ("quick", None, ValueError), ("short", "tpu", ValueError), ("short", 3, TypeError),
])
def test_bad_input_is_refused_before_work(mode, device, error):
    with pytest.raises(error):
        run_suite(mode, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_suite("smoke", device="cuda")


def test_format_table_warns_when_the_machine_was_busy(smoke):
    busy = smoke.copy()
    busy.attrs = dict(smoke.attrs, load=(100.0, 100.0))
    assert "warning: load average 100.0" in format_table(busy)
    quiet = smoke.copy()
    quiet.attrs = dict(smoke.attrs, load=(0.0, 2.0))
    assert "warning" not in format_table(quiet)


def test_format_table_refuses_other_frames():
    with pytest.raises(ValueError, match="run_suite"):
        format_table(pd.DataFrame({"x": [1]}))


def test_interleaved_medians_refuses_bad_rounds():
    with pytest.raises(ValueError, match="rounds"):
        interleaved_medians({"f": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="at least one"):
        interleaved_medians({}, rounds=1)


def test_interleaving_alternates_order_and_pairs_rounds():
    calls = []
    times = interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds in alternating order
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    # Per-round ratios 2, 2, 100 (one disturbed round): the median ignores the outlier.
    assert paired_ratio({"x": [2.0, 4.0, 100.0], "y": [1.0, 2.0, 1.0]}, "x", "y") == 2.0


def _tiny() -> Transformer:
    return Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=2, n_ctx=16, d_vocab=64, act_fn="gelu")).eval()


def test_hook_points_bypass_is_the_same_function_and_restores():
    model, tokens = _tiny(), torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    saved = harness.model.layers.hook, harness.model.layers.active, harness.model.transformer.hook
    with torch.no_grad():
        ref = model(tokens)
        for mode in ("bypassed", "called"):
            with hook_points(mode):
                torch.testing.assert_close(model(tokens), ref, rtol=0, atol=0)  # the same ops, bit for bit
        with pytest.raises(RuntimeError), hook_points("bypassed"):
            raise RuntimeError("restored even when the body raises")
    assert (harness.model.layers.hook, harness.model.layers.active, harness.model.transformer.hook) == saved
    with pytest.raises(ValueError, match="mode"), hook_points("off"):
        pass


def test_plain_gpt_matches_our_parameter_count_and_refuses_bad_shapes():
    ours = _tiny()
    plain = PlainGPT(2, 32, 2, 16, 64)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in plain.parameters())
    with pytest.raises(ValueError, match="n_heads"):
        PlainGPT(2, 30, 4, 16, 64)
    with pytest.raises(ValueError, match="n_layers"):
        PlainGPT(0, 32, 2, 16, 64)


def test_naive_head_ablation_zeroes_exactly_one_head():
    model = _tiny()
    tokens = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    delta = naive_head_ablation(model, tokens)
    assert delta.shape == (2, 2) and torch.isfinite(delta).all()
    # Independent route for head (1, 0): scale W_O's rows of that head to zero.
    with torch.no_grad():
        base = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].reshape(-1, 64), tokens[:, 1:].reshape(-1))
        saved = model.blocks[1].attn.o.weight.clone()
        model.blocks[1].attn.o.weight[:, :16] = 0  # head 0's d_head=16 input columns
        ablated = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].reshape(-1, 64), tokens[:, 1:].reshape(-1))
        model.blocks[1].attn.o.weight.copy_(saved)
    assert abs(float(ablated - base) - float(delta[1, 0])) < 1e-5  # float32 losses ~ ln 64
    with pytest.raises(ValueError, match="pos >= 2"):
        naive_head_ablation(model, tokens[:, :1])


def test_hooks_added_after_compile_fire():
    # TorchDynamo decides hooks at trace time, whatever the backend; "eager" skips code generation.
    result = compiled_hook_check(torch.device("cpu"), backend="eager")
    assert result["compiled_hook_fires"] and result["compiled_after_removal_equal"]
    assert not result["bare_compile_hook_fires"]  # what the wrapper fixes (tests/test_compiled.py tests it)
