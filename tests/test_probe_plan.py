"""`attnlab probe` at scale: the plan and its budget, the manifest and --resume, one-line refusals.

The plan is a pure function of the model's shape and a timed pass (reports.probe_run.plan), tested
on made-up shapes; the CLI tests run the tiny shared run (tests/conftest.py ``tiny_run``) with
``--methods`` subsets so each stays a few seconds. Stopping a run (SIGTERM, SIGKILL) is in
tests/test_probe_plan_interrupts.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness.errors import AttnlabError
from reports import pipeline, render, rundata
from reports.cli import cli
from reports.probe_run import plan, replanning
from reports.probe_run.progress import Progress
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
    # the attribution pass the kept method ran is not charged again to the one that reads it
    assert next(s for s in resumed.steps if s.method == "importance_attribution").passes == 0
    assert len(resumed.steps) >= len(fresh.steps)  # the budget it no longer spends goes to what is left


def test_a_small_model_keeps_everything_exact_within_the_default_budget():
    p = plan.make_plan(plan.METHODS, TINY, 0.01, 10 * 60)
    assert [s.method for s in p.steps] == list(plan.METHODS) and not p.notes
    assert variant_of(p, "importance_ablation") == "exact"


def test_a_budget_below_the_cheapest_plan_names_its_estimate():
    with pytest.raises(AttnlabError, match=r"too small: the cheapest plan \(importance_gradient.*needs ~42 s"):
        plan.make_plan(plan.METHODS, SMOL, 14.0, 10.0)
    # the budget holds the timed first pass: the message names the caller's budget and what the timing took
    with pytest.raises(AttnlabError, match=r"--budget 0.75 min is too small: the timed first pass took 9 s and the "
                                           r"cheapest plan \(importance_gradient.*needs ~42 s; expected a budget of "
                                           r"at least 0.9 min"):
        plan.make_plan(plan.METHODS, SMOL, 14.0, 45.0, spent_s=9.0)
    assert plan.make_plan(plan.METHODS, SMOL, 14.0, 60.0, spent_s=9.0).seconds <= 51.0


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
    kept, note = replanning.redundancy(step, SMOL, 7.0, curve, 0.01, 3, left=20 * 60.0)
    assert kept is not None and kept.variant.passes == 109 and kept.seconds == pytest.approx(109 * 7.0)
    assert note == "redundancy: re-planned from prune_curve: up to 109 passes, ~12.7 min (planned 9)"
    dropped, note = replanning.redundancy(step, SMOL, 7.0, curve, 0.01, 3, left=4 * 60.0)
    assert dropped is None and note.startswith("redundancy: dropped after prune_curve: its walks need up to ~12.7 min")
    assert replanning.redundancy(step, SMOL, 7.0, curve, 0.01, 3, left=None)[0] is not None  # no budget: runs


def test_the_estimators_curves_are_replanned_from_how_far_the_prune_curve_walked():
    """Each estimator's curve stops at its first mask past the largest budget (10%): before the prune curve has
    run, about half the masks; after it, as far as its longest sampled walk. An untrained model that never
    breaks runs every mask of every curve (a slowed 6-layer Llama planned 106 passes of estimators, ran 163 and
    was stopped at the deadline, unsaved). Four curves without L0 gates, five with them."""
    before = {v.name: v.passes for v in plan.variants("estimators", SMOL)}
    l0 = before["with l0_gates"] - 5 * 271 / 2
    assert before["without l0_gates"] == 4 * 271 / 2 and l0 == pytest.approx(plan.L0_STEPS * 10 / 10 * 3)
    assert plan.longest_walk(_curve({None: 27, 0: 54, 1: 27}), 0.1, 270) == 54
    assert plan.longest_walk(_curve({None: 999, 0: 27}), 0.1, 270) == 270  # the importance order never broke
    assert plan.longest_walk(_curve({None: 27, 0: 54}), 0.6, 270) == 270  # 3.0 is not past 2.0 x 1.6
    after = {v.name: v.passes for v in plan.variants("estimators", dataclasses.replace(SMOL, walk=54))}
    assert after == {"without l0_gates": 4 * 55, "with l0_gates": 5 * 55 + l0}
    unbroken = {v.name: v.passes for v in plan.variants("estimators", dataclasses.replace(SMOL, walk=270))}
    assert unbroken["without l0_gates"] == 4 * 271
    # the re-plan after the prune curve reads it (at the estimators' largest budget, not the run's tolerance)
    ctx = type("Ctx", (), {"has_estimates": lambda self: False, "results": {"prune_curve": _curve({None: 999})}})()
    step = plan.Step("prune_curve", plan.Variant("11 points", 40.0), 60.0, 40.0)
    assert replanning.measured(1.5, SMOL, step, 60.0, 40.0, ctx)[1].walk == 270
    ctx.results["prune_curve"] = _curve({None: 27, 0: 54})
    assert replanning.measured(1.5, SMOL, step, 60.0, 40.0, ctx)[1].walk == 54


# SmolLM2-135M through HFAdapter (prefix reuse): the unembedding and loss are ~a fifth of a pass (measured tail)
SMOL_REUSE = plan.Shape(n_layers=30, n_heads=9, sequences=10, seeds=3, prefix_reuse=True, masks_per_pass=1,
                        exact_top=8, pos=128, tail=0.2)


def test_a_pass_starting_mid_stack_still_pays_the_whole_tail():
    """k masks at mean depth d cost k x (tail + (1 - tail) x d) passes, plus one pass through the stack (no tail)
    for the prefix residuals; without prefix reuse every mask is a whole pass."""
    assert SMOL_REUSE.masked(9, 0.5) == pytest.approx(9 * (0.2 + 0.8 * 0.5) + 0.8)
    assert dataclasses.replace(SMOL_REUSE, tail=0.0).masked(9, 0.5) == pytest.approx(9 * 0.5 + 1)
    assert SMOL.masked(9, 0.5) == 9


def test_top_candidates_cost_what_their_layers_cost_and_mean_ablation_pays_its_means():
    top = "exact top 8 of 270"
    before = {v.name: v.passes for v in plan.variants("importance_mean_ablation", SMOL_REUSE)}
    early = dataclasses.replace(SMOL_REUSE, top_depth=(("importance_mean_ablation", 1.0),))
    after = {v.name: v.passes for v in plan.variants("importance_mean_ablation", early)}
    grad = 1 + plan.BACKWARD
    # the head means: one pass through the stack; 9 masks (8 heads and the base) through the whole model
    assert after[top] == pytest.approx(grad + 0.8 + 9 * 1.0 + 0.8)
    assert before[top] == pytest.approx(grad + 0.8 + 9 * (0.2 + 0.8 * 31 / 60) + 0.8)
    ablation = {v.name: v.passes for v in plan.variants("importance_ablation", early)}
    assert ablation[top] == pytest.approx(grad + 9 * (0.2 + 0.8 * 31 / 60) + 0.8)  # its own heads: not set


def test_top_depth_reads_the_layers_of_the_top_candidates():
    from reports.probe_run.steps import top_depth

    shape = dataclasses.replace(SMOL_REUSE, exact_top=2)
    estimate = torch.zeros(30, 9)
    estimate[0, 3], estimate[15, 0] = 5.0, 4.0  # layers 0 and 15: they run 30 and 15 of 30 layers
    assert top_depth(shape, {"ablation": estimate}) == (("importance_ablation", pytest.approx(0.75)),)


def test_replan_at_a_slower_rate_falls_back_and_says_what_changed():
    LEFT = 10 * 60 - 15  # noqa: N806 - the budget left after the attribution pass
    p = plan.make_plan(plan.METHODS, SMOL_REUSE, 4.8, 10 * 60)
    finished = {"importance_gradient": "one fwd+bwd", "importance_attribution": "one fwd+bwd"}
    same, changes = plan.replan(p, plan.METHODS, SMOL_REUSE, 4.8, LEFT, finished, after="importance_attribution")
    assert changes == [] and [s.method for s in same.steps] == [s.method for s in p.steps]
    assert all(s.seconds == 0 for s in same.steps if s.method in finished)
    slow, changes = plan.replan(p, plan.METHODS, SMOL_REUSE, 9.6, LEFT, finished, after="importance_attribution")
    assert slow.seconds <= LEFT and changes, slow.lines()
    assert any(c.startswith("prune_curve: 11 points -> 5 points, 1 seed") or "dropped" in c for c in changes), changes
    faster, changes = plan.replan(slow, plan.METHODS, SMOL_REUSE, 1.0, LEFT, finished, after="importance_attribution")
    assert variant_of(faster, "prune_curve") == "11 points"  # a quicker machine gets the full answers back
    gone = {m for m in plan.METHODS if m not in {s.method for s in slow.steps}}
    assert gone and all(f"{m}: back, " in " ".join(changes) for m in gone if m in {s.method for s in faster.steps})
    # only methods still ahead of the run come back: one before the method that just ran never will
    late, _ = plan.replan(slow, plan.METHODS, SMOL_REUSE, 1.0, LEFT, {**finished, "similarity": "one pattern pass"},
                          after="similarity")
    assert {s.method for s in late.steps} <= set(plan.METHODS[plan.METHODS.index("similarity"):]) | set(finished)


def test_a_run_that_slows_down_is_replanned_within_its_budget(tiny_run, tmp_path, monkeypatch, capsys):
    """A method's passes take far longer than the timed pass predicts (as when a shared machine's load rises): the run
    re-plans at the measured rate, falls back or drops what no longer fits, says so, and ends within its budget."""
    import time as clock

    from reports.probe_run import steps

    run = copy_run(tiny_run, tmp_path / "run")
    slow = steps.RUNNERS["importance_ablation"]

    def slowed(ctx, variant):  # its passes slow down, as under load: the first two calls take 2 s more each
        calls = []

        def lag(module, args):
            calls.append(1)
            if len(calls) <= 2:
                clock.sleep(2.0)

        handle = ctx.model.register_forward_pre_hook(lag)
        try:
            return slow(ctx, variant)
        finally:
            handle.remove()

    monkeypatch.setitem(steps.RUNNERS, "importance_ablation", slowed)
    began = clock.perf_counter()
    pipeline.probe(run, seeds=(0, 1), sequences=8, budget=0.15,
                   methods=["importance_gradient", "importance_ablation", "prune_curve", "redundancy", "estimators"])
    took = clock.perf_counter() - began
    err = capsys.readouterr().err
    assert "re-planned at" in err and "(measured; planned" in err, err
    record = json.loads((run / "probes" / "manifest.json").read_text())
    fell_back = [n for n in record["notes"] if " -> " in n or ": dropped, its cheapest variant needs" in n]
    assert fell_back and all(n.split(":")[0] in err for n in fell_back), (record["notes"], err)
    assert {s["method"] for s in record["plan"]} == set(record["finished"])  # the plan kept is what ran
    assert took <= 0.15 * 60 + 3, (took, err)  # the budget, and the model's loading
    assert all(f["peak_rss_gb"] > 0 for f in record["finished"].values()) or not Path("/proc/self/status").exists()


def test_the_budget_running_out_inside_a_method_stops_it_at_its_next_pass(tiny_run, tmp_path, monkeypatch, capsys):
    """The re-plan between methods cannot help a method that is running when the budget ends: its next pass
    stops it. The method is not saved but stays in the manifest's plan (the run is partial, --resume runs it);
    the methods after it are dropped; each is said and noted; the elapsed time is recorded."""
    import time as clock

    from reports.probe_run import steps

    run = copy_run(tiny_run, tmp_path / "run")
    ablation = steps.RUNNERS["importance_ablation"]
    budget = 0.05  # minutes

    def late(ctx, variant):  # the budget ends before this method's first pass
        clock.sleep(budget * 60 + 0.5)
        return ablation(ctx, variant)

    monkeypatch.setitem(steps.RUNNERS, "importance_ablation", late)
    chosen = ["importance_gradient", "importance_ablation", "prune_curve"]
    pipeline.probe(run, seeds=(0, 1), sequences=8, budget=budget, methods=chosen)
    err = capsys.readouterr().err
    record = json.loads((run / "probes" / "manifest.json").read_text())
    assert set(record["finished"]) == {"importance_gradient"}, record
    assert [s["method"] for s in record["plan"]] == ["importance_gradient", "importance_ablation"]
    stopped = [n for n in record["notes"] if n.startswith("importance_ablation: stopped when the budget ran out")]
    assert stopped and stopped[0] in err, (record["notes"], err)
    assert "prune_curve: dropped, the budget ran out before it started" in record["notes"]
    assert not (run / "probes" / "importance_ablation.csv").exists()
    assert budget * 60 < record["elapsed_s"] < budget * 60 + 5
    monkeypatch.setitem(steps.RUNNERS, "importance_ablation", ablation)
    pipeline.probe(run, seeds=(0, 1), sequences=8, budget=None, methods=chosen[:2], resume=True)
    record = json.loads((run / "probes" / "manifest.json").read_text())
    assert set(record["finished"]) == set(chosen[:2]) and (run / "probes" / "importance_ablation.csv").exists()


def test_a_method_that_ran_no_pass_measures_no_rate():
    """importance_attribution reads the gradient method's attribution pass: its 0 s must not make the next re-plan
    think passes are free (a SmolLM2 run re-planned at 0.0003 s per pass and put back 13 min of estimators)."""
    step = plan.Step("importance_attribution", plan.Variant("one fwd+bwd", 3.0, shared=3.0), 4.0, 2.6)
    ctx = type("Ctx", (), {"has_estimates": lambda self: False, "results": {}})()
    assert replanning.measured(1.5, SMOL_REUSE, step, 0.01, 0.0, ctx)[0] == 1.5
    # nor does a forward + backward: its passes are the first pass's estimate of the backward (a run whose timed
    # backward chunk paid one-off costs re-planned at 0.64 s per pass, then ran leave-one-out at 1.5)
    gradient = plan.Step("importance_gradient", plan.Variant("one fwd+bwd", 18.2, shared=18.2), 30.0, 18.2)
    assert replanning.measured(1.5, SMOL_REUSE, gradient, 12.0, 1.0, ctx)[0] == 1.5
    ablation = plan.Step("importance_ablation", plan.Variant("exact", 171.0), 110.0, 171.0)
    assert replanning.measured(0.64, SMOL_REUSE, ablation, 258.0, 172.0, ctx)[0] == pytest.approx(1.5)
    # nor do passes that took under a second: on a tiny model they time per-call overhead, not passes
    assert replanning.measured(3e-5, SMOL_REUSE, ablation, 0.9, 172.0, ctx)[0] == 3e-5


def test_the_rate_is_timed_over_the_passes_not_the_methods_setup(tiny_run):
    """Progress.span runs from a method's first pass start to its last pass end: the setup before and the analysis
    after (head_roles' scores on a tiny model: 40 ms against a 0.03 ms pass) are not passes."""
    import time as clock

    from harness import load_run

    model = load_run(tiny_run.run_dir)
    say = Progress(model.cfg.n_layers, 2, enabled=False)
    step = plan.Step("head_roles", plan.Variant("one pattern pass", 1.0), 1.0, 1.0)
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with say.step(1, 1, step, model):
        clock.sleep(0.3)
        started = clock.monotonic()
        model(tokens)
        model(tokens)
        ended = clock.monotonic()
        clock.sleep(0.3)
    assert say.done == pytest.approx(2.0) and 0 < say.span <= ended - started


def test_progress_counts_passes_in_the_plans_units():
    """A call through the whole stack and the tail is one pass; a prefix step (stop_at_layer) counts its layers'
    share of the stack only; a pass from layer l counts the rest of the stack and the whole tail. ``forward``
    keeps the plain layers x rows count (no timing in it), which estimators.csv records."""
    import io

    from reports.probe_run.progress import Progress

    class Model(torch.nn.Module):
        def forward(self, x, start_at_layer=None, stop_at_layer=None):
            return x

    out = io.StringIO()
    say = Progress(n_layers=4, sequences=2, stream=out, every=0.0)
    say.tail = 0.2
    step = plan.Step("importance_ablation", plan.Variant("exact", 3.0), 1.0, 3.0)
    model, x = Model(), torch.zeros(2, 3)
    with say.step(1, 1, step, model):
        model(x)  # a whole pass
        model(x, stop_at_layer=0)
        model(x, start_at_layer=0, stop_at_layer=1)  # a prefix step: a quarter of the stack
        model(torch.zeros(4, 3), start_at_layer=2)  # two masks from layer 2: half the stack, the tail, twice
    assert say.done == pytest.approx(1.0 + 0.8 * 0.25 + 2 * (0.8 * 0.5 + 0.2))
    assert say.forward == pytest.approx(1.0 + 0.25 + 2 * 0.5)
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("probe: [1/1] importance_ablation: done in") and "(planned ~1 s)" in lines[-1]
    if Path("/proc/self/status").exists():
        assert say.peak_gb is not None and say.peak_gb > 0 and "peak RSS so far" in lines[-1]
