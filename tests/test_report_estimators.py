"""The estimator comparison through the pipeline: `attnlab probe` writes probes/estimators.csv (columns
owned by probes.ESTIMATOR_COLUMNS), the report shows its table and figure."""

from __future__ import annotations

import pandas as pd
import pytest

from probes import ESTIMATOR_COLUMNS
from probes.compare import ESTIMATORS
from reports import figures, rundata


def test_probe_stage_writes_the_estimator_table(tiny_run):
    path = tiny_run.run_dir / rundata.PROBES_DIR / rundata.PROBE_FILES["estimators"]
    df = pd.read_csv(path)
    assert tuple(df.columns) == ESTIMATOR_COLUMNS
    assert list(df["method"].unique()) == list(ESTIMATORS)
    exact = df[df["method"] == "ablation"]
    assert (exact["spearman"] == 1).all() and (exact["kendall"] == 1).all()
    assert df["prunable_fraction"].between(0, 1).all() and (df["forward_passes"] > 0).any()


def test_report_shows_the_estimator_section(tiny_run):
    md = (tiny_run.run_dir / "report.md").read_text(encoding="utf-8")
    html = (tiny_run.run_dir / "report.html").read_text(encoding="utf-8")
    assert "## Importance estimators against the exact answer" in md and "| l0_gates |" in md
    assert 'id="estimators"' in html
    assert (tiny_run.run_dir / rundata.FIGURES_DIR / "estimators.png").stat().st_size > 1000
    assert rundata.load(tiny_run.run_dir).estimators is not None


def test_estimator_figure_refuses_a_table_without_its_columns():
    with pytest.raises(ValueError, match="missing column"):
        figures.estimators(pd.DataFrame({"method": ["ablation"], "spearman": [1.0]}))
