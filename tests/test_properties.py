"""properties: the table check_model returns, the protocol check, argument checks, reproducibility,
the component-level position formulas, and no false alarm on a sample of harness configurations.

The full grid of harness configurations runs in tests/test_properties_grid.py (nox -s properties);
the mutation catalogue that shows each check bites is tests/test_mutants.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

import properties
from harness import ModelConfig, Transformer
from harness.model import positions as P
from properties import check_model, check_protocol, registry
from tests.mutants.base import RefConfig, RefModel
from tests.mutants.catalogue import MUTANTS

FAST = 6  # examples per search in these fast tests; the ci profile's 25 run in nox -s properties


pytestmark = pytest.mark.usefixtures("one_thread")


def small(**kw) -> Transformer:
    base = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=32, n_ctx=32)
    base.update(kw)
    return Transformer(ModelConfig(**base))


# --- the table ------------------------------------------------------------------------------

def test_table_columns_and_applicability():
    frame = check_model(small(positional_embedding_type="rotary"), max_examples=FAST)
    assert list(frame.columns) == ["property", "applicable", "passed", "worst", "tolerance", "noise_floor",
                                   "allowance", "ratio", "counterexample", "status", "reason", "model_passes",
                                   "twin_passes", "seconds"]
    assert list(frame.property) == list(properties.PROPERTIES)
    rows = frame.set_index("property")
    applicable = set(rows.index[rows.applicable])
    # the designs each property applies to are the registry's (properties/registry.py, Applies)
    model = small(positional_embedding_type="rotary")
    assert applicable == {p.name for p in registry.registered("model") if p.applies.not_applicable(model) is None}
    assert {"rotary_norm", "rotary_precision", "kv_cache"} <= applicable  # a rotary causal model decodes
    assert not applicable & {"permutation_equivariance", "sinusoidal_shift", "alibi_slopes", "sliding_window"}
    na = rows[~rows.applicable]
    assert na.passed.isna().all() and na.worst.isna().all()
    assert set(rows.status) <= {"pass", "n/a"} and (rows.status == "n/a").eq(~rows.applicable).all()
    ok = rows[rows.applicable]
    assert (ok.passed == True).all() and (ok.worst <= ok.tolerance).all()  # noqa: E712
    assert (ok.counterexample == "").all()


@pytest.mark.parametrize("kw, expected", [
    (dict(positional_embedding_type="none", attention_dir="bidirectional"), {"permutation_equivariance"}),
    (dict(positional_embedding_type="sinusoidal", attention_dir="bidirectional"), {"sinusoidal_shift"}),
    (dict(positional_embedding_type="alibi", attention_dir="bidirectional"), {"relative_position"}),
])
def test_position_specific_rows_apply(kw, expected):
    frame = check_model(small(n_layers=1, **kw), max_examples=3, properties=sorted(expected | {"kv_cache"}))
    rows = frame.set_index("property")
    assert set(rows.index[rows.applicable]) == expected  # kv_cache: bidirectional models cannot decode
    assert (rows.loc[sorted(expected), "passed"] == True).all()  # noqa: E712


def test_same_seed_same_table_and_shrunk_counterexample():
    mutant = next(m for m in MUTANTS if m.name == "missing_scale")
    a = check_model(mutant.build(), seed=3, max_examples=FAST, properties=["attention_scale"])
    b = check_model(mutant.build(), seed=3, max_examples=FAST, properties=["attention_scale"])
    assert a.drop(columns="seconds").equals(b.drop(columns="seconds"))  # all but the wall clock
    # hypothesis shrinks to a single token at offset 0: the smallest input that shows the scale
    assert a.counterexample[0].startswith("tokens=[[0]] position_offset=0")


def test_model_mode_is_restored():
    model = small(n_layers=1)
    model.train()
    check_model(model, max_examples=2, properties=["batch_independence"])
    assert model.training


@pytest.mark.parametrize("kw, match", [
    (dict(seed=-1), "seed"), (dict(seed=1.5), "seed"), (dict(max_examples=0), "max_examples"),
    (dict(max_examples=True), "max_examples"), (dict(properties=["scale"]), "properties"),
    (dict(properties=[]), "properties"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        check_model(small(n_layers=1), **kw)


def test_a_crash_on_valid_input_is_a_failure_not_an_error():
    class NoPadding(RefModel):
        def forward(self, tokens, attention_mask=None, position_offset=0, cache=None):
            if attention_mask is not None and not bool(attention_mask.all()):
                raise ValueError("padding is not supported")
            return super().forward(tokens, attention_mask, position_offset, cache)

    result = properties.padding_outputs(NoPadding(RefConfig()), max_examples=FAST)
    assert result.passed is False and result.worst == math.inf
    assert result.counterexample == "tokens=[[0, 0]] mask=[[0, 1]]: raised ValueError: padding is not supported"


def test_a_non_deterministic_model_is_reported():
    class Glitch(RefModel):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.calls = 0  # per instance: a second model, or a re-run in the same process, starts afresh

        def forward(self, tokens, attention_mask=None, position_offset=0, cache=None):
            self.calls += 1  # one glitched forward pass, never repeated on replay
            return super().forward(tokens, attention_mask, position_offset, cache) + float(self.calls == 6)

    for _ in range(2):  # the same check twice in one process: each model glitches on its own sixth call
        result = properties.batch_independence(Glitch(RefConfig()), max_examples=FAST)
        assert result.passed is False and result.counterexample.startswith("non-deterministic")


# --- the protocol ---------------------------------------------------------------------------

class Cfg:
    n_layers, n_heads, d_head, d_model, d_vocab, n_ctx = 1, 1, 4, 4, 5, 8
    positional_embedding_type, attention_dir = "none", "causal"


class Bare(HookedRootModule):
    """Right cfg and forward, but the only hook point is hook_q."""

    def __init__(self, cfg=Cfg()):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList([nn.Module()])
        self.blocks[0].attn = nn.Module()
        self.blocks[0].attn.hook_q = HookPoint()
        self.setup()

    def forward(self, tokens, attention_mask=None, position_offset=0):
        return torch.zeros(*tokens.shape, self.cfg.d_vocab)


def test_protocol_lists_missing_hooks():
    with pytest.raises(TypeError) as err:
        check_protocol(Bare())
    msg = str(err.value)
    assert "no hook point blocks.0.attn.hook_pattern" in msg and "no hook point blocks.0.hook_resid_pre" in msg
    assert "hook_q" not in msg.replace("hook_q_", "")  # present hooks are not reported


def test_protocol_lists_cfg_and_forward_problems():
    class NoOffset(Bare):
        def forward(self, tokens, attention_mask=None):
            return torch.zeros(*tokens.shape, 5)

    class BadCfg(Cfg):
        positional_embedding_type = "learned"

    class NoDirection:
        n_layers, n_heads, d_head, d_model, d_vocab, n_ctx = 1, 1, 4, 4, 5, 8
        positional_embedding_type = "none"

    with pytest.raises(TypeError, match="'position_offset'"):
        check_protocol(NoOffset())
    with pytest.raises(TypeError, match="positional_embedding_type='learned'"):
        check_protocol(Bare(BadCfg()))
    with pytest.raises(TypeError, match=r"no cfg\.attention_dir"):
        check_protocol(Bare(NoDirection()))


def test_protocol_checks_logits_shape():
    model = next(m for m in MUTANTS if m.name == "missing_scale").build()
    model.forward = lambda tokens, attention_mask=None, position_offset=0: torch.zeros(tokens.shape)
    with pytest.raises(TypeError, match=r"expected logits \[batch, pos, d_vocab\]"):
        check_protocol(model)


def test_non_hooked_models_are_refused():
    with pytest.raises(TypeError, match="not a transformer_lens.HookedRootModule"):
        check_model(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="TransformerBridge"):
        properties.BridgeAdapter(nn.Linear(2, 2))


# --- component-level formulas --------------------------------------------------------------

def test_harness_rotary_formula_is_relative():
    result = properties.rotary_formula(max_examples=30)
    assert result.passed and result.worst < 1e-9


def test_rotary_formula_flags_mixed_pair_layouts():
    def broken(x, pos):  # cos/sin in the interleaved frequency layout, applied with rotate-half pairs
        cos, sin = P.rotary_cos_sin(pos, x.shape[-1], dtype=torch.float64)
        half = x.shape[-1] // 2
        cos = cos[..., :half].repeat_interleave(2, -1)
        return P.apply_rotary(x, cos, sin)

    result = properties.rotary_formula(broken, max_examples=30)
    assert result.passed is False and result.worst > 1e-3
    assert "d_head=" in result.counterexample


def test_harness_sinusoidal_formula():
    assert properties.sinusoidal_formula(max_examples=30).passed


def test_sinusoidal_formula_flags_a_mismatched_base():
    table = lambda pos, d: P.sinusoidal_table(pos, d, base=1000.0, dtype=torch.float64)  # noqa: E731
    result = properties.sinusoidal_formula(table, max_examples=30)
    assert result.passed is False and result.counterexample.startswith("d_model=")


def test_component_arguments():
    with pytest.raises(TypeError, match="rotary"):
        properties.rotary_formula(rotary=3)
    with pytest.raises(ValueError, match="seed"):
        properties.sinusoidal_formula(seed=-2)


# --- no false alarm on a sample of the configuration grid -----------------------------------

SAMPLE = [
    dict(positional_embedding_type="none", attention_dir="bidirectional", normalization_type="RMS"),
    dict(positional_embedding_type="standard", attention_dir="causal", norm_placement="post"),
    dict(positional_embedding_type="sinusoidal", attention_dir="causal", normalization_type="RMS",
         norm_placement="post"),
    dict(positional_embedding_type="rotary", attention_dir="bidirectional", n_key_value_heads=2),
    dict(positional_embedding_type="alibi", attention_dir="causal", gated_mlp=True, init_range=0.2),
]


@pytest.mark.parametrize("kw", SAMPLE, ids=lambda kw: kw["positional_embedding_type"])
def test_no_false_alarm_on_sampled_configs(kw):
    frame = check_model(small(**kw), max_examples=FAST)
    failed = frame[frame.passed == False]  # noqa: E712
    assert failed.empty, failed.to_dict("records")
    assert math.isfinite(frame[frame.applicable].worst.max())
