"""How a running `attnlab probe` re-plans: after each method, at the rate it measured, within the budget left.

The plan made before any work (:mod:`reports.probe_run.plan`) rests on one timed pass. A shared machine's load
moves the rate, and some costs are known only once earlier methods have run (the top candidates' layers, the
walks of redundancy and the estimators' curves, which the prune curve bounds), so the methods left are planned
again as each one finishes: they fall back, are dropped or come back as the time left allows, and the run says
what changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import pandas as pd

from probes.compare import BUDGETS
from reports.probe_run.plan import Plan, Shape, Step, fmt_seconds, longest_walk, redundancy_after_curve, replan
from reports.probe_run.progress import Progress
from reports.probe_run.steps import Context, top_depth

MIN_SPAN_S = 1.0  # a method's passes must take this long for their rate to re-plan the rest


def measured(rate: float, shape: Shape, step: Step, span: float, ran: float, ctx: Context) -> tuple[float, Shape]:
    """The seconds per pass the next re-plan uses: this method's, when it planned and ran (``ran``: forward
    passes counted, in the plan's units) a pass or more (a shared machine's load moves it; the first pass's rate
    would keep a slowed run over its budget); and, once the attribution pass has ranked the heads, the share of
    the stack the top candidates' exact passes run.

    ``span`` is the seconds from the method's first pass start to its last pass end (Progress.span): a method's
    setup and its analysis after the passes do not grow with passes, and on a small model they outweigh them
    (head_roles' one pass and its role scores read as 0.04 s a pass against 0.0002, which planned the estimators'
    15k passes at 10 min and dropped their l0 gates, a 4-second job). Passes that took under :data:`MIN_SPAN_S`
    measured per-call overhead more than the passes (a tiny model's masked call costs ~6 ms of Python against a
    0.03 ms pass, and methods group their calls differently), so they leave the rate as it was; a budget is kept
    by the deadline in any case (Progress.deadline), the rate only chooses the variants."""
    # forward passes as counted (a walk may stop before the passes planned "up to"). Nothing is measured by a
    # method that reused an earlier one's passes, one whose time is mostly other work, or one with a backward
    # (its passes are the first pass's estimate of a backward, not a count)
    if step.passes >= 1 and ran >= 0.5 and span >= MIN_SPAN_S and step.variant.extra_s == 0 \
            and "bwd" not in step.variant.name:
        rate = span / ran
    if not shape.top_depth and ctx.has_estimates():
        shape = dataclasses.replace(shape, top_depth=top_depth(
            shape, {m: ctx.estimate(m) for m in ("ablation", "mean_ablation")}))
    if shape.walk is None and "prune_curve" in ctx.results:  # how far the estimators' curves walk
        shape = dataclasses.replace(shape, walk=longest_walk(ctx.results["prune_curve"], max(BUDGETS), shape.heads))
    return rate, shape


def rest(the_plan: Plan, chosen: Sequence[str], just: Step, shape: Shape, rate: float, left: Optional[float],
         record: dict[str, Any], say: Progress) -> tuple[Plan, int]:
    """The plan of the methods after ``just`` (the step that has just finished), re-made at the measured ``rate``
    within the budget ``left`` (:func:`reports.probe_run.plan.replan`); what changed is printed and goes in the
    manifest's plan and notes (``record``, written by the caller). Returns the plan and the index of the step after
    ``just``."""
    finished = {m: d["variant"] for m, d in record["finished"].items()} | {just.method: just.variant.name}
    if all(m in finished for m in chosen):
        return the_plan, len(the_plan.steps)
    new, changes = replan(the_plan, chosen, shape, rate, left, finished, after=just.method)
    left_steps = [s for s in new.steps if s.method not in finished]
    was = sum(s.seconds for s in the_plan.steps if s.method not in finished)
    now = sum(s.seconds for s in left_steps)
    if changes or abs(now - was) > max(0.25 * was, 10.0):  # said when the plan or its estimate moved
        budget = "" if left is None else f", {fmt_seconds(max(left, 0.0))} of the budget left"
        say.say(f"re-planned at {rate:.3g} s per pass (measured; planned {the_plan.seconds_per_pass:.3g}): "
                f"{len(left_steps)} method(s), ~{fmt_seconds(now)}{budget}")
        for change in changes:
            say.say(f"  {change}")
        record["notes"].extend(changes)
    record["plan"] = [{"method": s.method, "variant": s.variant.name.removesuffix(", kept")} for s in new.steps]
    return new, [s.method for s in new.steps].index(just.method) + 1


def redundancy(step: Step, shape: Shape, seconds: float, curve: pd.DataFrame, tolerance: float,
               seeds: int, left: Optional[float]) -> tuple[Optional[Step], str]:
    """Redundancy re-planned from this run's prune curve (:func:`reports.probe_run.plan.redundancy_after_curve`): the
    step with its revised passes, or None (dropped, said) when the budget left cannot hold it."""
    passes = redundancy_after_curve(shape, curve, tolerance, seeds, full=step.variant.name == "full")
    need = passes * seconds
    if left is not None and need > left:
        return None, (f"redundancy: dropped after prune_curve: its walks need up to ~{fmt_seconds(need)} "
                      f"({passes:.0f} passes) and {fmt_seconds(max(left, 0.0))} of the budget is left")
    variant = dataclasses.replace(step.variant, passes=passes)
    return (dataclasses.replace(step, variant=variant, seconds=need, passes=passes),
            f"redundancy: re-planned from prune_curve: up to {passes:.0f} passes, ~{fmt_seconds(need)} "
            f"(planned {step.variant.passes:.0f})")
