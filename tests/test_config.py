"""ModelConfig validation and JSON round-trip."""

import dataclasses

import pytest

from harness import ModelConfig

BAD = [
    ({"n_layers": 0}, "n_layers=0"),
    ({"n_layers": 2.5}, "n_layers=2.5"),
    ({"d_model": -4}, "d_model=-4"),
    ({"n_heads": True}, "n_heads=True"),
    ({"d_model": 130, "n_heads": 4}, "d_model=130 is not divisible by n_heads=4"),
    ({"d_head": 0}, "d_head=0"),
    ({"d_mlp": 0}, "d_mlp=0"),
    ({"d_vocab": 0}, "d_vocab=0"),
    ({"n_ctx": 0}, "n_ctx=0"),
    ({"act_fn": "swish"}, "act_fn='swish'"),
    ({"normalization_type": "BN"}, "normalization_type='BN'"),
    ({"norm_placement": "sandwich"}, "norm_placement='sandwich'"),
    ({"positional_embedding_type": "learned"}, "positional_embedding_type='learned'"),
    ({"attention_dir": "future"}, "attention_dir='future'"),
    ({"dtype": "float8"}, "dtype='float8'"),
    ({"gated_mlp": "yes"}, "gated_mlp='yes'"),
    ({"rotary_base": 0.5}, "rotary_base=0.5"),
    ({"eps": 0}, "eps=0"),
    ({"eps": float("nan")}, "eps=nan"),
    ({"init_range": -0.1}, "init_range=-0.1"),
    ({"seed": -1}, "seed=-1"),
    ({"n_key_value_heads": 3, "n_heads": 4}, "n_key_value_heads=3"),
    ({"positional_embedding_type": "rotary", "d_model": 12, "n_heads": 4}, "d_head=3"),
    ({"positional_embedding_type": "sinusoidal", "d_model": 15, "n_heads": 3}, "d_model=15"),
    ({"norm_placement": "post", "normalization_type": None}, "norm_placement='post'"),
]


@pytest.mark.parametrize("kwargs, needle", BAD, ids=[str(k) for k, _ in BAD])
def test_invalid_config_names_field_and_value(kwargs, needle):
    with pytest.raises(ValueError) as info:
        ModelConfig(**kwargs)
    assert needle in str(info.value)
    assert "expected" in str(info.value)


def test_defaults_are_derived_not_sentinels():
    cfg = ModelConfig(d_model=96, n_heads=3)
    assert cfg.d_head == 32 and cfg.d_mlp == 384 and cfg.n_kv_heads == 3


def test_json_round_trip(tmp_path):
    cfg = ModelConfig(n_layers=3, positional_embedding_type="rotary", n_key_value_heads=2, gated_mlp=True,
                      act_fn="silu", normalization_type="RMS", dtype="float64")
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    path = tmp_path / "cfg.json"
    cfg.to_json(path)
    assert ModelConfig.from_json(path) == cfg


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['d_modle'\]"):
        ModelConfig.from_dict({"d_modle": 64})


def test_config_is_immutable():
    cfg = ModelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_layers = 3  # type: ignore[misc]
    assert cfg.replace(n_layers=3).n_layers == 3 and cfg.n_layers == 2
