"""`attnlab probe` at scale: the plan and its budget, the manifest and --resume, one-line refusals.

The plan is a pure function of the model's shape and a timed pass (reports.probe_run.plan), tested
on made-up shapes; the CLI tests run the tiny shared run (tests/conftest.py ``tiny_run``) with
``--methods`` subsets so each stays a few seconds. Stopping a run (SIGTERM, SIGKILL) is in
tests/test_probe_plan_interrupts.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.errors import AttnlabError
from reports import pipeline, render, rundata
from reports.cli import cli
from reports.probe_run import plan
from tests.helpers.cli_run import assert_one_line_error, copy_run

pytestmark = pytest.mark.usefixtures("one_thread")

# SmolLM2-135M's shape on 2 cores: 30 x 9 heads, 10 sequences, one mask per pass, 14 s per pass (measured)
SMOL = plan.Shape(n_layers=30, n_heads=9, sequences=10, seeds=3, prefix_reuse=False, masks_per_pass=1, exact_top=8,
                  pos=128)
TINY = plan.Shape(n_layers=2, n_heads=4, sequences=8, seeds=2, prefix_reuse=True, masks_per_pass=8, exact_top=8)
FAST = ["--seeds", "0,1", "--no-progress"]


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def variant_of(p: plan.Plan, method: str) -> str:
    return next(s.variant.name for s in p.steps if s.method == method)


def test_no_budget_runs_everything_exact():
    p = plan.make_plan(plan.METHODS, SMOL, 14.0, None)
    assert [s.method for s in p.steps] == list(plan.METHODS)
    assert variant_of(p, "importance_ablation") == "exact" and variant_of(p, "estimators") == "with l0_gates"
    assert not p.notes


def test_a_budget_replaces_the_exact_answer_by_top_candidates_and_says_so():
    p = plan.make_plan(plan.METHODS, SMOL, 14.0, 10 * 60)
    assert p.seconds <= 10 * 60, p.lines()
    assert variant_of(p, "importance_ablation") == "exact top 8 of 270"
    assert variant_of(p, "importance_gradient") == "one fwd+bwd"
    said = " ".join(p.notes)
    assert "importance_ablation: exact for the top 8 of 270 heads" in said
    dropped = set(plan.METHODS) - {s.method for s in p.steps}
    assert dropped and all(f"{m}: dropped" in said for m in dropped), (dropped, said)
    text = "\n".join(p.lines())
    assert "passes" in text and "budget 10.0 min" in text


def test_the_attribution_pass_is_paid_once_and_finished_methods_cost_nothing():
    p = plan.make_plan(["importance_gradient", "importance_attribution"], SMOL, 14.0, None)
    assert [s.passes for s in p.steps] == [3.0, 0.0]  # one forward + backward gives both
    fresh = plan.make_plan(plan.METHODS, SMOL, 14.0, 10 * 60)
    resumed = plan.make_plan(plan.METHODS, SMOL, 14.0, 10 * 60, finished={"importance_gradient": "one fwd+bwd"})
    assert variant_of(resumed, "importance_gradient") == "one fwd+bwd, kept"
    kept = next(s for s in resumed.steps if s.method == "importance_gradient")
    assert kept.seconds == 0 and resumed.seconds <= 10 * 60
    assert len(resumed.steps) >= len(fresh.steps)  # the budget it no longer spends goes to what is left


def test_a_small_model_keeps_everything_exact_within_the_default_budget():
    p = plan.make_plan(plan.METHODS, TINY, 0.01, 10 * 60)
    assert [s.method for s in p.steps] == list(plan.METHODS) and not p.notes
    assert variant_of(p, "importance_ablation") == "exact"


def test_a_budget_below_the_cheapest_plan_names_its_estimate():
    with pytest.raises(AttnlabError, match=r"too small: the cheapest plan \(importance_gradient.*needs ~42 s"):
        plan.make_plan(plan.METHODS, SMOL, 14.0, 10.0)


def test_unknown_methods_list_the_valid_ones():
    with pytest.raises(AttnlabError, match="unknown method.*'nope'.*importance_gradient,importance_attribution"):
        plan.check_methods(["importance_gradient", "nope"])
    assert plan.check_methods(["redundancy", "importance_gradient"]) == ("importance_gradient", "redundancy")


def test_cli_refuses_unknown_methods_before_loading_anything(tmp_path):
    # the run directory does not exist: the --methods error comes first, so nothing was loaded
    err = assert_one_line_error(invoke(["probe", str(tmp_path / "absent"), "--methods", "ablation"]), 2,
                                "unknown method", "importance_ablation")
    assert "absent" not in err


def test_cli_refuses_a_budget_too_small_for_any_plan(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    assert_one_line_error(invoke(["probe", str(run), *FAST, "--budget", "0.000001"]), 2, "cheapest plan", "needs ~")


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run / "probes").iterdir())}


def test_resume_skips_finished_methods_and_keeps_their_files(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    first = invoke(["probe", str(run), *FAST, "--methods", "importance_gradient,importance_ablation"])
    assert first.exit_code == 0, first.output
    names = set(_files(run))
    assert {"importance_gradient.csv", "importance_ablation.csv", "manifest.json"} <= names
    assert "redundancy.json" not in names  # a fresh run removed the older run's other files
    kept = (run / "probes" / "importance_ablation.csv").read_bytes()
    again = CliRunner().invoke(cli, ["probe", str(run), "--seeds", "0,1", "--resume",
                                     "--methods", "importance_ablation,importance_gradient,redundancy"])
    assert again.exit_code == 0, again.output
    assert "importance_ablation: finished before, kept" in again.stderr
    assert (run / "probes" / "importance_ablation.csv").read_bytes() == kept
    manifest = json.loads((run / "probes" / "manifest.json").read_text())
    assert set(manifest["finished"]) == {"importance_gradient", "importance_ablation", "redundancy"}
    assert "prunable within" in again.stdout


@pytest.mark.parametrize(("change", "named"), [(["--tolerance", "0.05"], "tolerance: was 0.01, now 0.05"),
                                               (["--seeds", "0,2"], "seeds: was [0, 1], now [0, 2]")])
def test_resume_refuses_other_options_and_overwrites_nothing(tiny_run, tmp_path, change, named):
    run = copy_run(tiny_run, tmp_path / "run")
    assert invoke(["probe", str(run), *FAST, "--methods", "importance_gradient"]).exit_code == 0
    before = _files(run)
    args = ["probe", str(run), "--seeds", "0,1", "--no-progress", "--resume", "--methods", "importance_gradient"]
    args += change
    assert_one_line_error(invoke(args), 2, "--resume", named, "nothing was overwritten")
    assert _files(run) == before


def test_resume_refuses_another_model(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    other = tmp_path / "other"
    trained = invoke(["train", "--out", str(other), "--n-layers", "2", "--d-model", "32", "--n-heads", "4",
                      "--d-vocab", "32", "--n-ctx", "32", "--attn-only", "--task", "induction", "--seq-len", "16",
                      "--batch-size", "16", "--steps", "3", "--seed", "7", "--checkpoint-every", "none",
                      "--device", "cpu", "--no-progress"])
    assert trained.exit_code == 0, trained.output
    assert invoke(["probe", str(run), *FAST, "--methods", "importance_gradient"]).exit_code == 0
    (other / "probes").mkdir()
    (other / "probes" / "manifest.json").write_bytes((run / "probes" / "manifest.json").read_bytes())
    before = _files(other)
    err = assert_one_line_error(invoke(["probe", str(other), *FAST, "--resume", "--methods", "importance_gradient"]),
                                2, "model weights: was")
    assert "tolerance" not in err and _files(other) == before


def test_resume_without_a_manifest_is_refused(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    (run / "probes" / "manifest.json").unlink(missing_ok=True)
    assert_one_line_error(invoke(["probe", str(run), *FAST, "--resume"]), 2, "no probe run to continue")


def test_the_report_marks_a_partial_run(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    pipeline.probe(run, seeds=(0, 1), sequences=8, progress=False,
                   methods=["importance_gradient", "importance_ablation", "head_roles"])
    record = json.loads((run / "probes" / "manifest.json").read_text())
    del record["finished"]["head_roles"]  # as a run stopped before its last method leaves it
    (run / "probes" / "head_roles.csv").unlink()
    (run / "probes" / "manifest.json").write_text(json.dumps(record))
    assert rundata.probe_status(rundata.load(run)) == {"missing": ["head_roles"], "notes": []}
    paths = render.render(run)
    md = paths.markdown.read_text()
    assert "**Partial probe run**: not finished: head_roles" in md and "--resume" in md
    html = paths.html.read_text()
    assert "Partial probe run" in html
    frame = pd.read_csv(run / "probes" / "importance_ablation.csv")
    assert bool(frame["exact"].all()) and len(frame) == 8


def _curve(breaks: dict) -> pd.DataFrame:
    """A prune curve (probes.prune_curve's columns) whose order (seed None: importance) first breaks at ``n``."""
    rows = []
    for seed, first_broken in breaks.items():
        for n in (0, 27, 54, 81, 270):
            rows.append({"order": "importance" if seed is None else "random", "seed": seed, "n_pruned": n,
                         "fraction_pruned": n / 270, "loss": 2.0 if n < first_broken else 3.0, "accuracy": 0.5})
    return pd.DataFrame(rows)


def test_redundancy_is_replanned_from_the_prune_curve():
    """Its walks stop at each order's first broken mask, which the prune curve's sampled points bound: the
    importance order breaks by 27 heads, seed 0 by 54, seed 1 by 27; seed 2 (not sampled) as far as the longest."""
    curve = _curve({None: 27, 0: 54, 1: 27})
    passes = plan.redundancy_after_curve(SMOL, curve, 0.01, seeds=3, full=False)
    assert passes == 1 + 27 + 54 + 27 + 54  # one mask a pass on SmolLM2, no prefix reuse
    full = plan.redundancy_after_curve(SMOL, curve, 0.01, seeds=3, full=True)
    assert full == passes + 30 * 2 + SMOL.masked(271)
    unbroken = plan.redundancy_after_curve(SMOL, _curve({None: 999}), 0.01, seeds=1, full=False)
    assert unbroken == 1 + 270 + 270  # nothing broke: every mask of each order


def test_the_replanned_redundancy_is_dropped_and_said_when_the_budget_left_cannot_hold_it():
    step = plan.Step("redundancy", plan.Variant("headline only", 9.0), 63.0, 9.0)
    curve = _curve({None: 27, 0: 27, 1: 27, 2: 27})
    kept, note = pipeline._replanned(step, SMOL, 7.0, curve, 0.01, 3, left=20 * 60.0)
    assert kept is not None and kept.variant.passes == 109 and kept.seconds == pytest.approx(109 * 7.0)
    assert note == "redundancy: re-planned from prune_curve: up to 109 passes, ~12.7 min (planned 9)"
    dropped, note = pipeline._replanned(step, SMOL, 7.0, curve, 0.01, 3, left=4 * 60.0)
    assert dropped is None and note.startswith("redundancy: dropped after prune_curve: its walks need up to ~12.7 min")
    assert pipeline._replanned(step, SMOL, 7.0, curve, 0.01, 3, left=None)[0] is not None  # no budget: runs
