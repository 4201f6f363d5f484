"""The `attnlab` commands and the functions behind them share every default (reports/defaults.py).

Each click option's default, converted by its own type as click converts it, must equal the default
of the parameter it is passed to (read with inspect.signature); an option with a default but no
such parameter must be listed with the reports.defaults name it reads. A new option therefore
either gets its default from the function it calls, or is added here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import click
import pytest

from reports import defaults, kernels_command, pipeline
from reports.census import command as census_command
from reports.census import variants_command
from reports.cli import cli
from reports.heal import heal

# command -> (the function it calls, {click parameter name: that function's parameter name} where they differ)
TARGETS: dict[str, tuple[Callable, dict[str, str]]] = {
    "check": (pipeline.check, {}),
    "probe": (pipeline.probe, {}),
    "saturation": (pipeline.saturation, {}),
    "demo": (pipeline.demo, {}),
    "heal": (heal, {"out_dir": "out"}),
    "census": (census_command.run, {"timeout": "timeout_s"}),
    "kernels": (kernels_command.run, {}),
}
# defaults of options that no pipeline parameter takes (the function has the argument without a default)
CLI_ONLY = {
    ("saturation", "out_dir"): defaults.SATURATION_OUT,
    ("demo", "out_dir"): defaults.DEMO_OUT,
    ("probe", "seed"): defaults.SEED,  # read by reports.external (--hf random weights, --task batch)
    ("bench", "device"): defaults.BENCH_DEVICE,
    # census's --variants options, taken by the variants run rather than the census function the table names
    ("census", "seed"): inspect.signature(variants_command.run).parameters["seed"].default,
    ("census", "dtypes"): inspect.signature(variants_command.run).parameters["dtypes"].default,
}


def _has_default(param: click.Option) -> bool:
    """None and an unset default (click 8.2's UNSET sentinel, not a value) leave nothing to drift; so do flags."""
    return not param.is_flag and isinstance(param.default, (str, int, float, tuple))


def _options_with_defaults():
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and _has_default(param):
                yield name, command, param


def _converted(command: click.Command, param: click.Option):
    with click.Context(command) as ctx:
        return param.type_cast_value(ctx, param.default)


CASES = [pytest.param(name, param.name, id=f"{name} {param.opts[0]}") for name, _, param in _options_with_defaults()]


@pytest.mark.parametrize(("command", "param_name"), CASES)
def test_each_click_default_equals_the_default_of_what_it_calls(command, param_name):
    cmd = cli.commands[command]
    param = next(p for p in cmd.params if p.name == param_name)
    value = _converted(cmd, param)
    if (command, param_name) in CLI_ONLY:
        assert value == CLI_ONLY[command, param_name]
        return
    assert command in TARGETS, f"attnlab {command} {param.opts[0]} has a default: list it in TARGETS or CLI_ONLY"
    function, renames = TARGETS[command]
    target = inspect.signature(function).parameters[renames.get(param_name, param_name)]
    assert target.default is not inspect.Parameter.empty, (command, param_name)
    expected = tuple(target.default) if isinstance(target.default, (list, tuple)) else target.default
    assert value == expected, f"attnlab {command} {param.opts[0]}: click {value!r}, {function.__name__} {expected!r}"


def test_the_comparison_sees_every_command_that_has_defaults():
    seen = {name for name, _, _ in _options_with_defaults()}
    assert seen == {"check", "probe", "saturation", "demo", "heal", "bench", "census", "kernels"}, seen
    assert len(CASES) >= 20  # the tuple-valued ones (--seeds, --d-heads, --prune-fraction) included


def test_a_drifted_default_is_caught(monkeypatch):
    """The comparison is not vacuous: a pipeline default that moves away from the option's fails it."""
    def check(run_dir, *, seed=0, max_examples=defaults.MAX_EXAMPLES + 1, progress=None, model=None):
        return None

    monkeypatch.setitem(TARGETS, "check", (check, {}))
    with pytest.raises(AssertionError, match="max-examples"):
        test_each_click_default_equals_the_default_of_what_it_calls("check", "max_examples")


def test_one_meaning_per_option():
    """--max-examples (never --check-examples); --hf is an input model wherever it appears (export writes --out)."""
    names = {name: {opt for p in cmd.params for opt in p.opts} for name, cmd in cli.commands.items()}
    assert "--max-examples" in names["check"] and "--max-examples" in names["demo"]
    assert not any("--check-examples" in opts for opts in names.values())
    assert "--out" in names["export"] and "--hf" not in names["export"]
    for name in ("check", "probe"):
        hf = next(p for p in cli.commands[name].params if "--hf" in p.opts)
        assert "save_pretrained folder" in (hf.help or "")  # the model to read
