"""Untrusted files where a run's files belong: never unpickled, every kind of damage a clear error naming the file.

A run directory may come from anywhere (a download, a colleague, a killed process). A pickle
placed where a checkpoint belongs must be refused without being executed (proved with a pickle
whose ``__reduce__`` would create a marker file, and with every unpickling entry point patched to
fail); a truncated or corrupt safetensors file, a config.json with unknown, missing or mistyped
fields, and a metrics.csv without its columns must each give an error naming the file, through the
API and through `attnlab` (exit 2, one line). Every case is counted (``file`` in the fuzz summary).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pickle
import shutil
import struct

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import ModelConfig, TrainConfig, load_run, train
from harness.training.checkpoint import load_optimizer, read_state
from harness.training.metrics import COLUMNS as ALL_METRICS
from harness.training.optim import make_optimizer
from reports import pipeline, rundata
from reports.cli import cli
from tests.helpers.fuzz import count_file_case, fuzz_settings, install_summary, one_line_error, snapshot

# The run every case damages a copy of; trained through the CLI so `train --resume` with the
# same options finds the same configs.
ARGS = ["--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--d-vocab", "16", "--n-ctx", "16", "--attn-only",
        "--task", "induction", "--seq-len", "8", "--batch-size", "4", "--steps", "3", "--eval-every", "1",
        "--warmup", "0", "--log-every", "1", "--checkpoint-every", "2", "--device", "cpu", "--no-progress"]
MORE = ["--steps", "5"]  # a resume that would have work to do


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.fixture(autouse=True, scope="module")
def _summary(request):
    install_summary(request.config)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("untrusted") / "run"
    result = invoke(["train", "--out", str(path), *ARGS])
    assert result.exit_code == 0, result.stderr
    return path


@pytest.fixture
def copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


def refused_api(call, *needles: str, errors=(ValueError,)) -> str:
    with pytest.raises(errors) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def refused_cli(args: list[str], *needles: str) -> str:
    err = one_line_error(invoke(args), 2)
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# --- pickles: refused, never executed ------------------------------------------------------------------
class _Trap:
    """Unpickling this calls open(marker, "w"): the marker file proves a pickle ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def no_unpickling(monkeypatch):
    """Every way to unpickle fails loudly, as a second proof beside the marker file."""
    def forbidden(*args, **kwargs):
        raise AssertionError("something tried to unpickle a file")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)


def _pickles(marker):
    """(label, bytes): the trap under every pickle protocol and inside a torch.save zip."""
    out = [(f"pickle protocol {p}", pickle.dumps(_Trap(marker), protocol=p))
           for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    buf = io.BytesIO()
    torch.save({"weight": _Trap(marker)}, buf)
    out.append(("torch.save zip", buf.getvalue()))
    return out


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors"])
def test_a_pickle_where_a_checkpoint_belongs_is_refused_and_never_run(copy, tmp_path, name, no_unpickling):
    marker = tmp_path / "pwned"
    target = copy / "checkpoint" / name
    for label, payload in _pickles(marker):
        target.write_bytes(payload)
        before = snapshot(copy)
        # API: loading the model, resuming training; CLI: check and probe (model), train --resume (both).
        calls = [lambda: train(*_configs(copy), copy, resume=True, progress=False)]
        if name == "model.safetensors":
            calls += [lambda: load_run(copy), lambda: pipeline.check(copy, max_examples=1, progress=False),
                      lambda: pipeline.probe(copy, sequences=2, progress=False)]
        for call in calls:
            refused_api(call, name)
        commands = [["train", "--out", str(copy), *ARGS, *MORE, "--resume"]]
        if name == "model.safetensors":
            commands += [["check", str(copy), "--max-examples", "1"], ["probe", str(copy), "--sequences", "2"]]
        for args in commands:
            refused_cli(args, name)
        assert not marker.exists(), f"{label}: the pickle was executed"
        assert snapshot(copy) == before, f"{label}: a refused load changed the run"
        count_file_case(True)


def test_a_pickle_beside_a_missing_checkpoint_is_named_and_refused(copy, tmp_path, no_unpickling):
    marker = tmp_path / "pwned"
    (copy / "checkpoint" / "model.safetensors").unlink()
    for suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"):
        pt = copy / "checkpoint" / f"model{suffix}"
        pt.write_bytes(pickle.dumps(_Trap(marker)))
        refused_api(lambda: load_run(copy), "model.safetensors is missing", f"model{suffix}", "refused",
                    errors=(FileNotFoundError,))
        refused_cli(["check", str(copy), "--max-examples", "1"], f"model{suffix}", "refused")
        pt.unlink()
        assert not marker.exists()
        count_file_case(True)


def test_no_module_can_unpickle():
    """Static half of the guarantee: no code path in the packages calls an unpickler at all."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    calls = ("torch.load(", "pickle.load", "pickle.Unpickler", "weights_only=False", "allow_pickle=True",
             "np.load(", "numpy.load(", "joblib", "dill")
    offenders = [f"{path.relative_to(root)}: {needle}" for pkg in ("harness", "probes", "properties", "reports")
                 for path in (root / pkg).rglob("*.py") for needle in calls if needle in path.read_text()]
    assert offenders == []


def _configs(run_dir):
    from harness.training.checkpoint import read_configs

    model, train_cfg = read_configs(run_dir)
    return model, train_cfg.replace(steps=train_cfg.steps + 2)


# --- truncated and corrupt safetensors -------------------------------------------------------------------
def _load_checked(run_dir, name):
    """The reader of ``name``: load_run for the weights, load_optimizer (after the resume check) for the state."""
    if name == "model.safetensors":
        return load_run(run_dir)
    model = load_run(run_dir)
    model_cfg, train_cfg = _configs(run_dir)
    return load_optimizer(make_optimizer(model, train_cfg), run_dir)


@settings(parent=fuzz_settings(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["model.safetensors", "optimizer.safetensors"]), cut=st.floats(0, 1, exclude_max=True))
def test_truncated_safetensors_are_refused_naming_the_file(copy, run, name, cut):
    original = (run / "checkpoint" / name).read_bytes()
    with damaged(copy / "checkpoint" / name, original[:int(cut * len(original))]):
        refused_api(lambda: train(*_configs(copy), copy, resume=True, progress=False), name, "not a valid safetensors")
        refused_api(lambda: _load_checked(copy, name), name)
    count_file_case(True)


@contextlib.contextmanager
def damaged(path, payload: bytes):
    """``path`` holds ``payload`` inside the block and its own bytes again after (hypothesis runs many
    examples on one copy of the run)."""
    original = path.read_bytes()
    path.write_bytes(payload)
    try:
        yield path
    finally:
        path.write_bytes(original)


def _header(raw: bytes) -> tuple[int, dict]:
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8:8 + n])


def _with_header(raw: bytes, header: dict) -> bytes:
    n, _ = _header(raw)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


def _crafted(raw: bytes, other_model: bytes) -> list[tuple[str, bytes]]:
    """Hand-made damage a byte flip rarely reaches."""
    n, header = _header(raw)
    first = next(k for k in header if k != "__metadata__")
    cases = [
        ("empty file", b""),
        ("header length past the end", struct.pack("<Q", len(raw) * 2) + raw[8:]),
        ("header length 2**64-1", struct.pack("<Q", 2**64 - 1) + raw[8:]),
        ("header not JSON", struct.pack("<Q", 6) + b"{{{{{{" + raw[8 + n:]),
        ("header a JSON list", _with_header(raw, [])),  # type: ignore[arg-type]
        ("unknown dtype", _with_header(raw, {**header, first: {**header[first], "dtype": "X99"}})),
        ("offsets past the data", _with_header(raw, {**header, first: {**header[first],
                                                                         "data_offsets": [0, 10**9]}})),
        ("shape disagrees with offsets", _with_header(raw, {**header, first: {**header[first], "shape": [3, 3, 3]}})),
        ("a tensor missing", _with_header(raw, {k: v for k, v in header.items() if k != first})),
        ("another model's weights", other_model),
    ]
    return cases


def test_crafted_safetensors_damage_is_refused_naming_the_file(copy, run, tmp_path):
    other = tmp_path / "other"
    train(ModelConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=16, n_ctx=16),
          TrainConfig(seq_len=8, batch_size=4, steps=1, warmup=0, device="cpu"), other, progress=False)
    name = "model.safetensors"
    raw = (run / "checkpoint" / name).read_bytes()
    for label, payload in _crafted(raw, (other / "checkpoint" / name).read_bytes()):
        (copy / "checkpoint" / name).write_bytes(payload)
        msg = refused_api(lambda: load_run(copy), name)
        assert "safetensors" in msg or "does not fit the model" in msg, (label, msg)
        refused_cli(["check", str(copy), "--max-examples", "1"], name)
        count_file_case(True)


@settings(parent=fuzz_settings(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["model.safetensors", "optimizer.safetensors"]),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupt_safetensors_headers_give_a_clean_error_or_still_load(copy, run, name, flips):
    """Random bytes in the header: either the file is still a valid safetensors that fits (a flip inside
    a metadata string, say) or the error names the file; nothing else, and never a crash."""
    raw = bytearray((run / "checkpoint" / name).read_bytes())
    n = struct.unpack("<Q", bytes(raw[:8]))[0]
    for where, byte in flips:
        raw[int(where * (8 + n))] = byte
    with damaged(copy / "checkpoint" / name, bytes(raw)):
        try:
            _load_checked(copy, name)
        except (ValueError, FileNotFoundError) as exc:
            assert name in str(exc), str(exc)
            count_file_case(True)
        else:
            count_file_case(False)


# --- config.json: unknown, missing and mistyped fields ------------------------------------------------------
FIELDS = [("model", f.name) for f in dataclasses.fields(ModelConfig)] + \
         [("train", f.name) for f in dataclasses.fields(TrainConfig)]
MISTYPED = ([1, 2], "oops", {"x": 1})  # invalid for every field of either config


def _config_cases():
    for part, field in FIELDS:
        yield f"missing {part}.{field}", lambda c, p=part, f=field: c[p].pop(f), field
        for bad in MISTYPED:
            if field == "distill_from" and isinstance(bad, str):
                bad = ""  # any other string is a valid path (a missing teacher is refused when training starts)
            # an unknown task option is named by its key, under its task
            named = "task" if field == "task_options" and isinstance(bad, dict) else field
            yield f"{part}.{field}={bad!r}", lambda c, p=part, f=field, b=bad: c[p].__setitem__(f, b), named
    for part in ("model", "train"):
        yield f"unknown {part}.bogus", lambda c, p=part: c[p].__setitem__("bogus_field", 1), "bogus_field"
    yield "unknown top-level key", lambda c: c.__setitem__("evil", "<script>"), "evil"
    yield "no model", lambda c: c.pop("model"), "model"
    yield "format 99", lambda c: c.__setitem__("format", 99), "format"
    yield "not an object", lambda c: c.clear() or c.update({"model": [], "train": []}), "dict"


CONFIG_CASES = list(_config_cases())


def test_config_json_with_unknown_missing_or_mistyped_fields_is_refused(copy):
    path = copy / "checkpoint" / "config.json"
    original = json.loads(path.read_text())
    for label, damage, needle in CONFIG_CASES:
        config = json.loads(json.dumps(original))
        damage(config)
        path.write_text(json.dumps(config))
        needles = ("config.json",) + ((needle,) if needle else ())
        for call in (lambda: load_run(copy), lambda: rundata.load(copy), lambda: pipeline.report(copy)):
            try:
                refused_api(call, *needles)
            except AssertionError as exc:
                raise AssertionError(f"{label}: {exc}") from None
        for command in (["report", str(copy)], ["check", str(copy), "--max-examples", "1"]):
            refused_cli(command, *needles)
        count_file_case(True)
    assert not (copy / "report.html").exists() and not (copy / "properties.csv").exists()


def test_config_case_count():
    """Every field of both configs is covered three ways and missing (plus the structural cases)."""
    assert len(CONFIG_CASES) == 4 * len(FIELDS) + 6


# --- metrics.csv ------------------------------------------------------------------------------------------
def test_metrics_without_a_required_column_is_refused_by_the_report(copy):
    path = copy / "metrics.csv"
    original = pd.read_csv(path)
    for column in rundata.COLUMNS[rundata.METRICS_CSV]:
        original.drop(columns=[column]).to_csv(path, index=False)
        for call in (lambda: rundata.load(copy), lambda: pipeline.report(copy)):
            refused_api(call, "metrics.csv", column)
        refused_cli(["report", str(copy)], "metrics.csv", column)
        count_file_case(True)
    assert not (copy / "report.html").exists()


@pytest.mark.parametrize("text, needle", [
    ("step,lr,train_loss,val_loss,val_accuracy\nx,0.1,1,1,1\n", "step"),
    ("step,lr,train_loss,val_loss,val_accuracy\n1,0.1,abc,1,1\n", "train_loss"),
    ("step,lr,train_loss,val_loss,val_accuracy\n", "no rows"),
    ("", "metrics.csv"),
    ("\xff\xfe garbage", "metrics.csv"),
])
def test_metrics_with_garbage_values_is_refused_by_the_report(copy, text, needle):
    (copy / "metrics.csv").write_bytes(text.encode("latin-1"))
    refused_api(lambda: rundata.load(copy), "metrics.csv", needle)
    refused_cli(["report", str(copy)], "metrics.csv", needle)
    assert not (copy / "report.html").exists()
    count_file_case(True)


def test_metrics_without_a_column_is_refused_on_resume(copy):
    """Appending rows under another header would misalign every column: resume refuses it first."""
    path = copy / "metrics.csv"
    original = path.read_text()
    frame = pd.read_csv(path)
    for column in ALL_METRICS:
        frame.drop(columns=[column]).to_csv(path, index=False)
        before = snapshot(copy)
        refused_api(lambda: train(*_configs(copy), copy, resume=True, progress=False), "metrics.csv", column)
        refused_cli(["train", "--out", str(copy), *ARGS, *MORE, "--resume"], "metrics.csv", column)
        assert snapshot(copy) == before
        count_file_case(True)
    path.write_text(original)
    assert read_state(copy)["step"] == 3


# --- state.json -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [("step", "3"), ("step", -1), ("elapsed_s", "x"), ("pending", []),
                                          ("rng", {"torch": "AAAA"}), ("rng", "x"), ("format", 2)])
def test_state_json_with_mistyped_fields_is_refused_on_resume(copy, field, value):
    path = copy / "checkpoint" / "state.json"
    state = json.loads(path.read_text())
    state[field] = value
    path.write_text(json.dumps(state))
    refused_api(lambda: train(*_configs(copy), copy, resume=True, progress=False), "state.json", field)
    refused_cli(["train", "--out", str(copy), *ARGS, *MORE, "--resume"], "state.json", field)
    count_file_case(True)


def test_markup_in_a_run_name_or_task_path_is_escaped_in_the_report(run, tmp_path):
    """Names and config values come from the files; the report shows them as text, never as markup."""
    evil = shutil.copytree(run, tmp_path / "<script>alert(1)")  # a folder name cannot hold '/'
    path = evil / "checkpoint" / "config.json"
    config = json.loads(path.read_text())
    config["train"]["task_options"] = {"paths": ["<script>alert(2)</script>", "<img src=x onerror=alert(3)>"]}
    config["train"]["task"] = "text"
    path.write_text(json.dumps(config))
    result = invoke(["report", str(evil)])
    assert result.exit_code == 0, result.stderr
    html = (evil / "report.html").read_text(encoding="utf-8")
    md = (evil / "report.md").read_text(encoding="utf-8")
    for text in (html, md):
        assert "<script" not in text and "<img src=x" not in text  # (the figures are <img src="data:...">)
        assert "&lt;script&gt;alert(1)" in text and "&lt;script&gt;alert(2)&lt;/script&gt;" in text
        assert "&lt;img src=x onerror=alert(3)&gt;" in text
