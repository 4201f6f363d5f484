"""The `attnlab` command end to end (click's CliRunner) on a tiny configuration, and every error path.

Every failure a user can cause must be one line on stderr with exit code 2 (130 for Ctrl-C),
never a traceback; both CliRunner (which calls `cli`) and the console script (`main`, tested in a
subprocess) go through the same handling.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from harness import load_run
from reports import options
from reports.cli import cli, verdict_table
from tests.helpers.cli_run import TINY, assert_one_line_error, copy_run, invoke

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "check", "probe", "saturation", "report", "demo", "bench")


@pytest.fixture(scope="module")
def run(tiny_run):
    return tiny_run


# --- help and option mapping ---------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: attnlab {command} [OPTIONS]"), result.output
    assert "--help" in result.output


def test_top_level_help_lists_commands_in_session_order():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    positions = [result.output.index(f"  {c} ") for c in COMMANDS]
    assert positions == sorted(positions), result.output


def test_every_config_field_has_exactly_one_option():
    from harness import ModelConfig
    from harness.training.config import TrainConfig

    for fields, cls in ((options.MODEL_FIELDS, ModelConfig), (options.TRAIN_FIELDS, TrainConfig)):
        mapped = [f for _, f, _, _ in fields]
        assert sorted(mapped) == sorted(f.name for f in dataclasses.fields(cls)), cls.__name__


def _parse(args: list[str]):
    """The configs that `attnlab train` would build from ``args`` (through click's own parsing)."""
    captured = {}

    def fake_train(model_cfg, train_cfg, run_dir, **kw):
        captured.update(model=model_cfg, train=train_cfg, run_dir=run_dir, **kw)
        return pd.DataFrame({"step": [1], "val_accuracy": [0.5]})

    from reports import pipeline

    original = pipeline.train
    pipeline.train = fake_train
    try:
        result = CliRunner().invoke(cli, ["train", "--out", "unused", *args])
    finally:
        pipeline.train = original
    return result, captured


def test_options_map_onto_config_fields_and_unset_ones_keep_the_demo_values():
    import harness

    demo_model, demo_train = harness.demo_configs()
    result, got = _parse(["--n-layers", "3", "--normalization-type", "none", "--no-attn-bias", "--lr", "0.002",
                          "--grad-clip", "none", "--betas", "0.9,0.98", "--model-seed", "7", "--seed", "5"])
    assert result.exit_code == 0, result.output + result.stderr
    assert got["model"] == demo_model.replace(n_layers=3, normalization_type=None, attn_bias=False, seed=7)
    assert got["train"] == demo_train.replace(lr=0.002, grad_clip=None, betas=(0.9, 0.98), seed=5)


def test_changing_d_model_rederives_d_head_and_a_new_task_drops_the_demo_task_options():
    result, got = _parse(["--d-model", "64", "--n-heads", "2", "--task", "copy"])
    assert result.exit_code == 0, result.output + result.stderr
    assert (got["model"].d_head, got["model"].d_mlp) == (32, 256)
    assert got["train"].task == "copy" and got["train"].task_options == {} and got["train"].seq_len is None


def test_resume_overwrite_and_stop_after_reach_train():
    result, got = _parse(["--resume", "--stop-after", "10", "--no-progress"])
    assert result.exit_code == 0, result.output + result.stderr
    assert (got["resume"], got["overwrite"], got["stop_after"], got["progress"]) == (True, False, 10, False)
    result, got = _parse(["--overwrite"])
    assert (got["resume"], got["overwrite"], got["stop_after"], got["progress"]) == (False, True, None, None)


def test_task_option_values_parse_as_json():
    result, got = _parse(["--task", "modular_addition", "--task-option", "p=7", "--d-vocab", "16"])
    assert result.exit_code == 0, result.output + result.stderr
    assert got["train"].task_options == {"p": 7}


# --- the commands on the tiny run ----------------------------------------------------------------
def test_train_writes_checkpoint_and_metrics(run):
    out = run.results["train"].stdout
    assert "trained" in out and "step 20" in out
    assert (run.run_dir / "checkpoint" / "model.safetensors").is_file()
    metrics = pd.read_csv(run.run_dir / "metrics.csv")
    assert metrics["step"].max() == 20


def test_check_prints_the_table_it_writes(run):
    out = run.results["check"].stdout
    table = pd.read_csv(run.run_dir / "properties.csv")
    assert list(table.columns) == ["property", "applicable", "passed", "worst", "tolerance", "noise_floor",
                                   "allowance", "ratio", "counterexample", "status", "reason", "model_passes",
                                   "twin_passes", "seconds"]
    for name in table["property"]:
        assert name in out
    applicable = table[table["applicable"]]
    # Our own Transformer must pass every property that applies to it.
    assert applicable["passed"].astype(bool).all(), table
    assert f"{len(applicable)} / {len(applicable)} applicable properties passed" in out


def test_probe_writes_every_probe(run):
    folder = run.run_dir / "probes"
    for name in ("importance_ablation.csv", "importance_mean_ablation.csv", "importance_gradient.csv",
                 "prune_curve.csv", "redundancy.json", "similarity_pattern.csv", "head_roles.csv",
                 "attention_entropy.csv", "patterns.csv", "example_tokens.csv"):
        assert (folder / name).is_file(), name
    imp = pd.read_csv(folder / "importance_ablation.csv")
    assert len(imp) == 2 * 4 and set(imp.columns) >= {"layer", "head", "importance", "loss_delta"}
    assert "prunable within" in run.results["probe"].stdout


def test_saturation_prints_slopes_and_writes_csv_and_figure(run):
    out = run.results["saturation"].stdout
    assert "scaled" in out and "unscaled" in out and "slope" in out
    table = pd.read_csv(run.run_dir / "saturation.csv")
    assert sorted(table["d_head"].unique()) == [8, 16, 32]
    assert (run.run_dir / "figures" / "saturation.png").stat().st_size > 10_000


def test_report_writes_html_markdown_and_figures(run):
    assert "report.html" in run.results["report"].stdout
    assert (run.run_dir / "report.html").stat().st_size > 100_000  # eight PNGs embedded
    assert (run.run_dir / "report.md").stat().st_size > 2_000


DEMO_FAST = ["--steps", "10", "--max-examples", "1", "--sequences", "4", "--d-heads", "8,16", "--seeds", "0",
             "--no-progress"]


@pytest.mark.slow  # a second whole pipeline (train -> report) beside the shared tiny run
def test_demo_prints_stage_times_and_headline_and_exports(tmp_path):
    out_dir = tmp_path / "demo"
    result = invoke(["demo", "--out", str(out_dir), *TINY, *DEMO_FAST])
    assert result.exit_code == 0, result.stdout + result.stderr
    print(result.stdout)
    lines = result.stdout.splitlines()
    for stage in ("train", "check", "probe", "saturation", "export", "report", "total"):
        assert any(line.split()[:1] == [stage] and line.rstrip().endswith(" s") for line in lines), (stage, lines)
    for headline in ("final validation accuracy", "properties passed / applicable", "heads prunable within",
                     "induction heads found"):
        assert headline in result.stdout
    assert (out_dir / "report.html").is_file() and str(out_dir / "report.html") in result.stdout
    # the attention-only demo model is a GPT-2 with zero MLPs: exported, and the export gives its logits
    hf = AutoModelForCausalLM.from_pretrained(out_dir / "hf").eval()
    assert f"hf:     {out_dir / 'hf'}" in result.stdout
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, load_run(out_dir)(tokens))


@pytest.mark.slow
def test_demo_of_a_design_hf_cannot_reproduce_says_why_and_still_finishes(tmp_path):
    out_dir = tmp_path / "demo"
    result = invoke(["demo", "--out", str(out_dir), *TINY, "--positional-embedding-type", "alibi", *DEMO_FAST])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert not any(line.split()[:1] == ["export"] for line in result.stdout.splitlines())
    assert "hf:     not exported: to_hf: positional_embedding_type='alibi' has no" in result.stdout
    assert not (out_dir / "hf").exists() and (out_dir / "report.html").is_file()


def test_demo_has_no_check_examples_option(tmp_path):
    """One name per meaning: check and demo both say --max-examples; the old spelling is click's usual error."""
    result = invoke(["demo", "--out", str(tmp_path / "d"), "--check-examples", "1"])
    assert_one_line_error(result, 2, "No such option '--check-examples'", "Did you mean '--max-examples'")
    assert not (tmp_path / "d").exists()


# --- error paths: one line, exit 2 ---------------------------------------------------------------
def test_missing_run_dir(tmp_path):
    for command in ("check", "probe", "report"):
        assert_one_line_error(invoke([command, str(tmp_path / "nope")]), 2, "does not exist")


def test_run_dir_without_checkpoint(tmp_path):
    assert_one_line_error(invoke(["check", str(tmp_path)]), 2, "config.json")


def test_corrupt_checkpoint_is_named(run, tmp_path):
    bad = copy_run(run, tmp_path / "bad")
    (bad / "checkpoint" / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    assert_one_line_error(invoke(["check", str(bad)]), 2, "model.safetensors")


def test_pickle_in_place_of_safetensors_is_refused(run, tmp_path):
    import torch

    bad = copy_run(run, tmp_path / "pickled")
    torch.save({"w": torch.zeros(2)}, bad / "checkpoint" / "model.safetensors")
    assert_one_line_error(invoke(["probe", str(bad)]), 2, "pickle")


def test_corrupt_config_json(run, tmp_path):
    bad = copy_run(run, tmp_path / "badcfg")
    (bad / "checkpoint" / "config.json").write_text("{not json")
    assert_one_line_error(invoke(["report", str(bad)]), 2, "config.json")


def test_metrics_with_missing_columns(run, tmp_path):
    bad = copy_run(run, tmp_path / "badmetrics")
    pd.read_csv(bad / "metrics.csv").drop(columns=["val_accuracy"]).to_csv(bad / "metrics.csv", index=False)
    assert_one_line_error(invoke(["report", str(bad)]), 2, "metrics.csv", "val_accuracy")


@pytest.mark.parametrize("args, needle", [
    (["--n-layers", "0"], "--n-layers"),            # click's own range check
    (["--lr", "-1"], "lr=-1"),                       # TrainConfig's validation
    (["--d-model", "30", "--n-heads", "4"], "d_head"),  # a contradiction ModelConfig refuses
    (["--task", "nope"], "--task"),                  # unknown task
    (["--bogus"], "--bogus"),                        # unknown option
    (["--task-option", "novalue"], "key=value"),
    (["--task-option", "nosuchoption=1"], "nosuchoption"),
])
def test_bad_train_options(tmp_path, args, needle):
    result = invoke(["train", "--out", str(tmp_path / "r"), *args])
    assert_one_line_error(result, 2, needle)
    assert not (tmp_path / "r").exists()  # refused before any work


def test_existing_run_is_not_overwritten_silently(run):
    result = invoke(["train", "--out", str(run.run_dir), *TINY, "--steps", "30"])
    assert_one_line_error(result, 2, "already holds")
    assert_one_line_error(invoke(["demo", "--out", str(run.run_dir)]), 2, "already holds", "--overwrite")


@pytest.mark.parametrize("args, needle", [
    (["--d-heads", "8"], "two distinct"),
    (["--d-heads", "a,b"], "--d-heads"),
    (["--seeds", ""], "--seeds"),
])
def test_bad_saturation_options(tmp_path, args, needle):
    assert_one_line_error(invoke(["saturation", "--out", str(tmp_path / "s"), *args]), 2, needle)


def test_missing_argument_and_unknown_command():
    assert_one_line_error(invoke(["check"]), 2, "RUN_DIR")
    assert_one_line_error(invoke(["nosuchcommand"]), 2, "nosuchcommand")


def test_interrupt_exits_130(monkeypatch, tmp_path):
    from reports import pipeline

    def interrupted(*a, **k):
        raise KeyboardInterrupt("training interrupted after step 3; checkpoint saved")

    monkeypatch.setattr(pipeline, "report", interrupted)
    assert_one_line_error(invoke(["report", str(tmp_path)]), 130, "interrupted after step 3")


@pytest.mark.parametrize("bug", [ZeroDivisionError("boom"), TypeError("boom"), ValueError("boom")])
def test_a_bug_of_ours_is_a_traceback_and_exit_1(monkeypatch, tmp_path, bug):
    """Only AttnlabError and OSError are bad input: a plain TypeError/ValueError from our code is a bug."""
    from reports import pipeline

    def broken(*a, **k):
        raise bug

    monkeypatch.setattr(pipeline, "report", broken)
    result = invoke(["report", str(tmp_path)])
    assert result.exit_code == 1, (result.exit_code, result.stderr)
    err = result.stderr.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):" and f"{type(bug).__name__}: boom" in err[-2]
    assert err[-1].startswith("attnlab: internal error:") and "please report it" in err[-1]


def test_bad_input_is_one_line_exit_2(monkeypatch, tmp_path):
    from harness.errors import AttnlabError, AttnlabTypeError
    from reports import pipeline

    for exc in (AttnlabError("x=1 is invalid: expected y"), AttnlabTypeError("run_dir must be a path"),
                FileNotFoundError("no such file")):
        def broken(*a, exc=exc, **k):
            raise exc

        monkeypatch.setattr(pipeline, "report", broken)
        assert_one_line_error(invoke(["report", str(tmp_path)]), 2, str(exc))


def test_bench_calls_the_suite(monkeypatch):
    bench = pytest.importorskip("reports.bench.suite", reason="reports/bench.py (the benchmark suite) has not landed")
    calls = []
    monkeypatch.setattr(bench, "run_suite", lambda mode, device: calls.append((mode, device)) or pd.DataFrame())
    monkeypatch.setattr(bench, "format_table", lambda df: "TABLE")
    result = invoke(["bench", "--full", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert invoke(["bench"]).exit_code == 0
    assert calls == [("full", "cpu"), ("short", None)] and "TABLE" in result.stdout


# --- the console script itself (main), in a subprocess --------------------------------------------
def _main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from reports.cli import main; main()", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_console_script_errors_are_one_line(tmp_path):
    proc = _main("report", str(tmp_path / "missing"))
    assert proc.returncode == 2, proc
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    version = invoke(["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("attnlab, version")


def test_the_printed_table_shows_each_figure_that_decides_a_verdict():
    # a column of mixed magnitudes prints in fixed point under pandas (3e-08 as 0.000000): every figure to 3 digits
    shown = pd.DataFrame({"property": ["pattern_distribution", "causal_pattern", "alibi_slopes"],
                          "result": ["FAIL", "pass", "n/a"], "worst": [2.98e-08, 0.0, float("nan")],
                          "allowance": [3.64e-12, 0.0, float("nan")], "ratio": [8192.0, 0.0, float("nan")],
                          "counterexample": ["tokens=[[0, 0, 0]]", "", ""]})
    text = verdict_table(shown).to_string(index=False)
    assert "2.98e-08" in text and "3.64e-12" in text and "8.19e+03" in text
    assert "0.000000" not in text and "nan" not in text
