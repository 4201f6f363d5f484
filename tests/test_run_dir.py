"""The run directory: one layout (RunDir), one atomic writer, and every file read back by its reader.

Each file is written by the stage that owns it and read back through reports.rundata, which
must find exactly the columns the writer declares (harness.training.metrics.COLUMNS,
properties.suite.COLUMNS, properties.saturation.COLUMNS, probes.roles.ROLES, probes METHODS):
a writer and a reader that drifted apart fail here.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from harness.run_dir import RunDir, atomic_write, atomic_write_json, atomic_write_text, read_json
from harness.training import metrics
from harness.training.checkpoint import CHECKPOINT, OLD, TMP
from probes.importance import METHODS
from probes.roles import ROLES
from properties import saturation, suite
from reports import pipeline, rundata


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_layout_names_every_file_once(tmp_path):
    layout = RunDir(tmp_path)
    paths = [layout.checkpoint, layout.checkpoint_tmp, layout.checkpoint_old, layout.metrics_csv,
             layout.properties_csv, layout.saturation_csv, layout.probes, layout.redundancy_json, layout.figures,
             layout.figure("saturation"), layout.report_html, layout.report_md, layout.probe_file("x.csv")]
    assert len(set(paths)) == len(paths) and all(p.is_relative_to(tmp_path) for p in paths)
    assert (layout.checkpoint.name, layout.checkpoint_tmp.name, layout.checkpoint_old.name) == (CHECKPOINT, TMP, OLD)
    assert layout.redundancy_json.parent == layout.probes and layout.figure("a").parent == layout.figures
    with pytest.raises(TypeError, match="run_dir must be a path, got int"):
        RunDir(3)


def test_atomic_write_replaces_the_whole_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "one\n")
    atomic_write_text(path, "two\n")
    assert path.read_text() == "two\n" and _leftovers(tmp_path) == []
    atomic_write_json(tmp_path / "b.json", {"x": 1}, indent=1)
    assert read_json(tmp_path / "b.json") == {"x": 1}


def test_a_writer_that_fails_midway_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "old")

    def half(f):
        f.write("new, half of it")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_write(path, half)
    assert path.read_text() == "old" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("text, error, needle", [
    (None, FileNotFoundError, "is missing"),
    ("{not json", ValueError, "is corrupt: invalid JSON"),
    ("[1, 2]", ValueError, "is corrupt: expected a JSON object, got list"),
    (b"\xff\xfe", ValueError, "is corrupt: invalid JSON"),
])
def test_read_json_names_the_file_and_the_damage(tmp_path, text, error, needle):
    path = tmp_path / "x.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(error, match=needle) as info:
        read_json(path)
    assert str(path) in str(info.value)


def test_metrics_csv_written_by_its_log_is_read_back_by_the_report(tmp_path):
    layout = RunDir(tmp_path)
    log = metrics.MetricsLog(layout.metrics_csv)
    for step in (1, 2):
        log.write(metrics.new_row(step) | {"lr": 1e-3, "train_loss": 2.5 / step, "grad_norm": 0.5})
    log.close()
    frame = rundata.read_csv(layout.metrics_csv, rundata.COLUMNS[rundata.METRICS_CSV])
    assert list(frame.columns) == list(metrics.COLUMNS)
    assert frame["step"].tolist() == [1, 2] and frame["train_loss"].tolist() == [2.5, 1.25]
    assert math.isnan(frame["val_loss"].iloc[0])
    assert set(rundata.COLUMNS[rundata.METRICS_CSV]) <= set(metrics.COLUMNS)


def test_every_stage_file_is_read_back_with_the_columns_its_writer_declares(tiny_run):
    """train -> check -> probe -> saturation -> report (the shared tiny run), then rundata.load."""
    layout = RunDir(tiny_run.run_dir)
    for path in (layout.checkpoint, layout.metrics_csv, layout.properties_csv, layout.saturation_csv,
                 layout.redundancy_json, layout.report_html, layout.report_md, layout.figure("saturation")):
        assert path.exists(), path
    data = rundata.load(layout.path)
    assert list(data.metrics.columns) == list(metrics.COLUMNS)
    assert list(data.properties.columns) == list(suite.COLUMNS)
    assert list(data.saturation.columns) == list(saturation.COLUMNS)
    assert set(ROLES) <= set(data.head_roles.columns)
    assert set(data.importance) == set(pipeline.PROBE_METHODS) and set(pipeline.PROBE_METHODS) <= set(METHODS)
    for method, frame in data.importance.items():
        assert set(rundata.COLUMNS["importance"]) <= set(frame.columns), method
    assert data.redundancy == json.loads(layout.redundancy_json.read_text())
    assert data.example_tokens is not None and data.similarity is not None
    for key in ("prune_curve", "attention_entropy", "patterns"):
        frame = getattr(data, key)
        assert isinstance(frame, pd.DataFrame) and set(rundata.COLUMNS[key]) <= set(frame.columns), key
    # every figure the report embeds is a file under figures/ named by RunDir
    figures = sorted(p.name for p in layout.figures.iterdir())
    assert figures and all(layout.figure(name.removesuffix(".png")).exists() for name in figures)
    assert _leftovers(layout.path) == [] and _leftovers(layout.probes) == []
