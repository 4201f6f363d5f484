"""properties.strategies: what they generate is valid, every option is reachable, bad arguments fail early."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import ModelConfig, Transformer
from properties import strategies as S


@given(S.model_configs())
def test_model_configs_are_valid_and_small(cfg):
    assert isinstance(cfg, ModelConfig)  # __post_init__ validated it
    assert cfg.n_layers <= 2 and cfg.d_model in (16, 32) and cfg.d_vocab == 32
    if cfg.positional_embedding_type == "rotary":
        assert cfg.d_head % 2 == 0


def test_model_configs_reach_every_option():
    seen = set()

    @settings(max_examples=300, derandomize=True, database=None)
    @given(S.model_configs())
    def collect(cfg):
        seen.update({cfg.positional_embedding_type, cfg.attention_dir, cfg.normalization_type, cfg.norm_placement})
        if cfg.n_key_value_heads is not None and cfg.n_key_value_heads < cfg.n_heads:
            seen.add("gqa")

    collect()
    assert seen >= {"none", "standard", "sinusoidal", "rotary", "alibi", "causal", "bidirectional", "LN", "RMS",
                    None, "pre", "post", "gqa"}


@settings(max_examples=10, deadline=None)
@given(S.model_configs(positional_types=("rotary",), normalization_types=(None,)))
def test_restricted_configs_build_a_model(cfg):
    assert cfg.positional_embedding_type == "rotary" and cfg.norm_placement == "pre"  # post needs a norm
    logits = Transformer(cfg)(torch.zeros(1, 3, dtype=torch.long))
    assert logits.shape == (1, 3, cfg.d_vocab) and torch.isfinite(logits).all()


@given(S.token_batches(7, min_batch=2, max_batch=3, min_len=2, max_len=5))
def test_token_batches(x):
    assert x.dtype == torch.long and 2 <= x.shape[0] <= 3 and 2 <= x.shape[1] <= 5
    assert int(x.min()) >= 0 and int(x.max()) < 7


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), S.permutations(n))))
def test_permutations(example):
    n, perm = example
    assert sorted(perm.tolist()) == list(range(n))


@given(S.padded_batches(11, max_batch=3, max_len=4, max_pad=3))
def test_padded_batches_keep_each_row(batch):
    assert batch.tokens.shape == batch.mask.shape and batch.tokens.shape[0] == len(batch.rows)
    assert ((batch.mask == 0) | (batch.mask == 1)).all()
    for r, row in enumerate(batch.rows):
        assert batch.tokens[r, batch.real_positions(r)].tolist() == list(row)
        pads = (batch.mask[r] == 0).nonzero().flatten().tolist()
        assert pads, "every row has at least one pad"
        # pads sit on one side: a contiguous block at the start (left) or the end (right)
        n = batch.tokens.shape[1]
        expected = list(range(len(pads))) if batch.sides[r] == "left" else list(range(n - len(pads), n))
        assert pads == expected


@given(S.position_offsets(9, min_offset=3))
def test_position_offsets(offset):
    assert 3 <= offset <= 9


def test_strategies_shrink_towards_simple_examples():
    from hypothesis import find

    x = find(S.token_batches(5), lambda t: True)
    assert x.tolist() == [[0]]
    perm = find(S.permutations(4), lambda p: True)
    assert perm.tolist() == [0, 1, 2, 3]
    batch = find(S.padded_batches(5), lambda b: True)
    assert batch.tokens.tolist() == [[0, 0]] and batch.mask.tolist() == [[0, 1]]  # one token, one left pad 0


@pytest.mark.parametrize("make, match", [
    (lambda: S.model_configs(positional_types=("learned",)), "positional_types"),
    (lambda: S.model_configs(attention_dirs=()), "attention_dirs"),
    (lambda: S.model_configs(d_models=(12,)), "d_models"),
    (lambda: S.model_configs(max_layers=0), "max_layers"),
    (lambda: S.token_batches(0), "d_vocab"),
    (lambda: S.token_batches(5, min_len=4, max_len=2), "max_len"),
    (lambda: S.token_batches(5, min_batch=3, max_batch=1), "max_batch"),
    (lambda: S.permutations(0), "n="),
    (lambda: S.position_offsets(2, min_offset=5), "max_offset"),
    (lambda: S.position_offsets(-1), "max_offset"),
    (lambda: S.padded_batches(5, sides=("top",)), "sides"),
    (lambda: S.padded_batches(5, max_pad=0), "max_pad"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_profiles():
    current = settings.get_current_profile_name()
    try:
        assert S.load_profile("ci") == "ci"
        assert settings.default.derandomize and settings.default.max_examples == 25
        assert S.load_profile("thorough") == "thorough" and settings.default.max_examples == 500
        with pytest.raises(ValueError, match="unknown"):
            S.load_profile("fast")
    finally:
        settings.load_profile(current)


@given(S.padded_batches(11, max_batch=3, max_len=4, max_pad=3))
def test_a_mirrored_batch_pads_each_row_on_its_other_side(batch):
    mirror = batch.mirrored()
    assert mirror.rows == batch.rows and mirror.tokens.shape == batch.tokens.shape
    assert all({a, b} == {"left", "right"} for a, b in zip(batch.sides, mirror.sides, strict=True))
    for r, row in enumerate(batch.rows):
        assert mirror.tokens[r, mirror.real_positions(r)].tolist() == list(row)
        pads = sorted(batch.tokens[r, batch.mask[r] == 0].tolist())
        assert sorted(mirror.tokens[r, mirror.mask[r] == 0].tolist()) == pads
    assert torch.equal(mirror.mirrored().tokens, batch.tokens) and torch.equal(mirror.mirrored().mask, batch.mask)
