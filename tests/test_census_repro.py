"""The standalone reproductions of the census's findings (reports/census/repro.py), fast tier: what a script may
import, that its literal config is the census's, and the `census --repro` command's bad input. Running every script
is the slow tier's (tests/test_census_repro_slow.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import transformers
from click.testing import CliRunner

from reports.census import repro, shrink
from reports.census.enumerate import by_name
from reports.census.repro_select import live
from reports.cli import cli

ATTNLAB = {"harness", "properties", "probes", "reports", "tests"}
ALLOWED = {"sys", "torch", "transformers"}


def _imports(text: str) -> set[str]:
    """The top-level package of every import in ``text``, wherever it sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


def _config(text: str) -> dict:
    """The script's ``CONFIG = {...}`` literal."""
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "CONFIG")
    return ast.literal_eval(node.value)


def test_the_generator_writes_a_file_for_a_known_type(tmp_path: Path) -> None:
    paths = repro.write_type("bart", tmp_path)
    assert [p.name for p in paths] == ["bart__left_padding_moves_positions.py"]
    text = paths[0].read_text()
    assert _imports(text) == ALLOWED
    assert "modeling_bart.py:" in text and "sys.exit(1 if bug else 0)" in text
    assert transformers.__version__ in text  # the versions it was made with


def test_no_script_imports_attnlab() -> None:
    """Every live finding's script: torch, transformers and sys only, plus transformer_lens where the bug is in it."""
    for r in live():
        allowed = ALLOWED | ({"transformer_lens"} if r.witness in repro.BRIDGE_KINDS else set())
        found = _imports(repro.render(r))
        assert found <= allowed and not found & ATTNLAB, (r.filename, found)


@pytest.mark.parametrize("model_type", ["bart", "deepseek_v4", "moshi", "openai-gpt"])
def test_the_literal_config_is_the_census_config(model_type: str) -> None:
    """The script's CONFIG rebuilds exactly the census's tiny config (a literal, not attnlab's shrink)."""
    mt = by_name()[model_type]
    text = repro.render(next(r for r in live() if r.model_type == model_type))
    rebuilt = getattr(transformers, mt.class_name).config_class(**_config(text))
    assert rebuilt.to_dict() == shrink.tiny_config(mt.name, mt.class_name).to_dict()


def test_a_variant_script_embeds_its_minimal_failing_config() -> None:
    """qwen3_moe's rotary_precision finding failed at hidden_size 96 with 3 heads (docs/census_variants.json)."""
    text = repro.render(next(r for r in live() if r.filename == "qwen3_moe__inv_freq_rounded_by_to.py"))
    config = _config(text)
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (96, 3, 3)


@pytest.mark.parametrize(("args", "names"), [
    (["--repro", "no_such_type"], "'no_such_type' is not a model type"),
    (["--repro", "gpt2"], "'gpt2' has no live finding"),
    (["--repro", "bart", "--bridge"], "not --bridge"),
    (["--repro", "bart", "--only", "bart"], "not --only"),
])
def test_bad_repro_input_is_one_line_and_exit_2(args: list[str], names: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["census", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and names in result.output, result.output
    assert not list(tmp_path.iterdir())  # refused before any work


def test_census_out_must_be_a_file_without_repro(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["census", "--only", "gpt2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder" in result.output, result.output


def test_repro_prints_the_paths_it_wrote(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["census", "--repro", "deepseek_v4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = sorted(tmp_path.iterdir())
    assert [p.name for p in written] == ["deepseek_v4__future_leaks_after_an_offset.py",
                                         "deepseek_v4__left_pad_shifts_compressed_windows.py"]
    assert result.output.split() == [str(p) for p in written]
