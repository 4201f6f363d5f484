"""Named presets (harness.training.presets): the registry, the demo alias, CLI --preset and its overrides."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from harness import demo_configs
from harness.training.presets import PRESETS, preset
from harness.training.tasks import make_task
from reports import options
from reports.cli import cli


def test_registry_names_the_required_presets_and_each_builds_a_consistent_task():
    assert {"induction", "induction-wide", "text", "text-tiny"} <= set(PRESETS)
    for name in PRESETS:
        model, train = preset(name)
        task = make_task(train.task, model.d_vocab, model.n_ctx, train.seq_len, train.task_options)
        assert task.seq_len <= model.n_ctx, name


def test_preset_shapes_are_the_documented_ones():
    wide, _ = preset("induction-wide")
    assert (wide.n_layers, wide.n_heads) == (4, 8)
    text, text_train = preset("text")
    assert (text.n_layers, text.n_heads, text.d_model, text.n_ctx, text.d_vocab) == (4, 8, 256, 256, 256)
    assert text_train.task == "text" and text.positional_embedding_type in ("standard", "rotary")


def test_demo_configs_is_the_induction_preset():
    assert demo_configs() == preset("induction")
    assert preset("induction") is not preset("induction")  # fresh configs each call


@pytest.mark.parametrize("bad", ["nope", "", None, 3, "Induction"])
def test_unknown_preset_lists_the_known_ones(bad):
    with pytest.raises(ValueError, match="unknown preset") as info:
        preset(bad)
    assert all(name in str(info.value) for name in PRESETS)


def test_explicit_options_override_the_preset(monkeypatch):
    from reports import cli as cli_module

    seen = {}

    def capture(fields, preset_name=None):  # the configs the command would train, without training
        seen["configs"] = options.model_and_train_configs(fields, preset_name)
        raise SystemExit(0)

    monkeypatch.setattr(cli_module, "model_and_train_configs", capture)
    CliRunner().invoke(cli, ["train", "--out", "unused", "--preset", "text", "--steps", "7", "--n-layers", "2"])
    model, train = seen["configs"]
    base_model, base_train = preset("text")
    assert (model.n_layers, train.steps) == (2, 7)
    assert (model.d_model, model.n_heads, train.task, train.seq_len) == (base_model.d_model, base_model.n_heads,
                                                                         base_train.task, base_train.seq_len)


def test_cli_unknown_preset_is_one_line_exit_2(tmp_path):
    result = CliRunner().invoke(cli, ["train", "--out", str(tmp_path / "r"), "--preset", "nope"])
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "preset='nope' is invalid: unknown preset" in err and "induction-wide" in err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_cli_trains_the_ci_text_preset(tmp_path, one_thread):
    result = CliRunner().invoke(cli, ["train", "--out", str(tmp_path / "r"), "--preset", "text-tiny", "--steps", "20",
                                      "--eval-every", "20", "--no-progress"])
    assert result.exit_code == 0, result.output + result.stderr
    import pandas as pd

    metrics = pd.read_csv(tmp_path / "r" / "metrics.csv")
    val = metrics["val_loss"].dropna()
    assert len(val) and float(val.iloc[-1]) < 5.0  # below the uniform byte loss ln 256 = 5.55
