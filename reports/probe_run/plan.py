"""The plan of `attnlab probe`: which methods run, in which variant, at what cost, before any of them runs.

Cost is counted in passes: one forward pass of the whole probe batch through the whole model (a
backward pass counts as two: it does about twice a forward's matrix products, Kaplan et al. 2020,
§2.1). A pass is timed once on the model itself (:func:`reports.probe_run.steps.first_pass`) and every
estimate is passes x that time.

Exact leave-one-out costs a masked pass per head. When the whole plan does not fit the time budget,
methods fall back, in :data:`PRIORITY` order, to variants that do, and the plan says so: the
importances become "exact for the top candidates" of attribution patching (Nanda 2023, "Attribution
patching"; Syed, Rager & Conmy 2023: a first-order estimate of every head's ablation effect from one
forward and one backward pass), the prune curve keeps fewer points and one random order, redundancy
keeps its headline, the estimator comparison drops L0 gates; a method with no variant that fits is
dropped, never silently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from harness.errors import AttnlabError
from probes.compare import ESTIMATORS

# Every method `attnlab probe` runs, in the order it runs them (a later one reads an earlier one's result).
METHODS = ("importance_gradient", "importance_attribution", "importance_ablation", "importance_mean_ablation",
           "prune_curve", "redundancy", "similarity", "head_roles", "attention_entropy", "patterns", "estimators")
# Who gets the budget first: the cheap rankings, the exact answer, the pattern views, then the curves.
PRIORITY = ("importance_gradient", "importance_attribution", "importance_ablation", "patterns", "attention_entropy",
            "head_roles", "similarity", "prune_curve", "redundancy", "importance_mean_ablation", "estimators")
BACKWARD = 2.0  # a backward pass in forward passes (Kaplan et al. 2020)
PATTERN = 1.5  # a pass that reads hook_pattern takes the explicit attention path instead of SDPA
REDUCED_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the prune curve's points when the full one does not fit
# probes.head_similarity's Jensen-Shannon divergence of every pair of heads over every query and key:
# N^2 / 2 x n x pos^2 elements at a rate the first pass times (steps.jsd_rate); this one where it has not
# (6.0e9 took 113 s on SmolLM2-135M, 2 shared cores at load 6; 12 s at load 1)
JSD_ELEMENTS_PER_S = 5e7
L0_STEPS, L0_ROWS = 100, 16  # probes.L0Options: steps, rows per step (each a forward and a backward pass)


@dataclass(frozen=True)
class Shape:
    """What the cost of a method depends on."""

    n_layers: int
    n_heads: int
    sequences: int
    seeds: int
    prefix_reuse: bool  # the model starts mid-stack (probes.gates): a mask first off at layer l costs (L - l) / L
    masks_per_pass: int  # probes.gates.rows_per_pass // sequences: masks riding in one pass
    exact_top: int  # heads whose exact answer a "top candidates" variant computes
    grad_passes: float = 0.0  # one forward + backward over the data, timed, in passes (0: 1 + BACKWARD)
    pos: int = 0  # tokens per sequence (the pattern similarity's pairwise cost grows with pos^2)
    # the share of a pass spent after the last layer (final norm, unembedding, loss), timed in the first pass: a
    # pass starting mid-stack still pays it whole (SmolLM2-135M: ~0.2, its 49k x 576 unembedding is 8 layers' work)
    tail: float = 0.0
    # per importance method, the mean share of the stack its top candidates' passes run (the heads are known once
    # the attribution pass has ranked them: a re-plan sets it); absent: the mean over all heads
    top_depth: tuple[tuple[str, float], ...] = ()
    jsd_per_s: float = JSD_ELEMENTS_PER_S  # the similarity's divergence elements per second, timed
    # heads an estimator's curve prunes before the model breaks, read from this run's prune curve once it has run
    # (a re-plan sets it: :func:`longest_walk`); None: about half the heads
    walk: Optional[int] = None

    @property
    def heads(self) -> int:
        return self.n_layers * self.n_heads

    def masked(self, k: float, depth: float = 1.0) -> float:
        """Passes for ``k`` masks over the data, each running ``depth`` of the stack on average (and the tail whole),
        plus, with prefix reuse, the one pass through the stack that computes the prefix residuals. A pass is one
        mask over the data (the first pass times one inside a call carrying ``masks_per_pass``); a last call with
        fewer masks still costs a whole call."""
        calls = math.ceil(k / self.masks_per_pass) * self.masks_per_pass
        if not self.prefix_reuse:
            return float(calls)
        stack = 1.0 - self.tail
        return calls * (self.tail + stack * depth) + stack

    def depth_of_top(self, method: str) -> float:
        """The mean share of the stack a top candidate's pass of ``method`` runs."""
        known = dict(self.top_depth)
        return known.get(method, (self.n_layers + 1) / (2 * self.n_layers))


@dataclass(frozen=True)
class Variant:
    name: str  # "exact", "top 8 of 270", ...
    passes: float
    note: str = ""  # what this variant leaves out, said in the plan
    shared: float = 0.0  # passes of the one attribution pass (probes.attribution) within ``passes``: paid once a run
    extra_s: float = 0.0  # seconds of work outside the model's passes (the similarity's pairwise divergences)

    def cost(self, paid: bool) -> float:
        """Passes this variant adds to a plan that has (``paid``) or has not run the attribution pass yet."""
        return self.passes - self.shared if paid else self.passes

    def seconds(self, paid: bool, seconds_per_pass: float) -> float:
        return self.cost(paid) * seconds_per_pass + self.extra_s


@dataclass
class Step:
    method: str
    variant: Variant
    seconds: float
    passes: float = 0.0  # what it adds to the plan (a pass shared with an earlier method is not counted twice)


@dataclass
class Plan:
    steps: list[Step]
    notes: list[str] = field(default_factory=list)  # what was replaced or dropped, and why
    seconds_per_pass: float = 0.0
    budget_s: Optional[float] = None

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def lines(self) -> list[str]:
        """The plan as `attnlab probe` prints it, one line per method."""
        out = [f"plan: {len(self.steps)} methods, ~{fmt_seconds(self.seconds)} at {self.seconds_per_pass:.3g} s per "
               f"pass (timed)" + ("" if self.budget_s is None else f", budget {fmt_seconds(self.budget_s)}")]
        out += [f"  {s.method:<26} {s.variant.name:<22} {s.passes:8.1f} passes  ~{fmt_seconds(s.seconds)}"
                for s in self.steps]
        out += [f"  note: {n}" for n in self.notes]
        return out


def fmt_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def variants(method: str, shape: Shape) -> list[Variant]:
    """The ways to run ``method``, best first, with their passes."""
    L, N, S = shape.n_layers, shape.heads, shape.seeds
    top = min(shape.exact_top, N)
    depth = (L + 1) / (2 * L)  # a head of layer l starts its pass at l: the mean share of the model run
    # the one attribution pass every ranking shares (probes.attribution)
    grad: float = shape.grad_passes or 1 + BACKWARD
    if method in ("importance_gradient", "importance_attribution"):
        return [Variant("one fwd+bwd", grad, shared=grad)]
    if method in ("importance_ablation", "importance_mean_ablation"):
        # the head means: one pass through the stack (probes._head_stats.head_means stops before the tail)
        extra = 1.0 - shape.tail if method == "importance_mean_ablation" else 0.0
        out = [Variant("exact", extra + shape.masked(N + 1, depth))]
        if top < N:
            top_passes = grad + extra + shape.masked(top + 1, shape.depth_of_top(method))
            out.append(Variant(f"exact top {top} of {N}", top_passes,
                               f"{method}: exact for the top {top} of {N} heads by attribution patching, the rest "
                               f"its first-order estimate (column exact)", shared=grad))
        return out
    if method == "prune_curve":
        full = Variant("11 points", shape.masked(9 * (1 + S) + 2))
        reduced = Variant("5 points, 1 seed", shape.masked(3 * 2 + 2),
                          f"prune_curve: {len(REDUCED_FRACTIONS)} points and one random order instead of 11 and {S}")
        return [full, reduced] if S > 1 else [full]
    if method == "redundancy":
        # each walk stops at its order's first broken mask, which the prune curve (run first) bounds by its first
        # broken sampled point; before any curve, assume its first point past none (a tenth of the heads): a
        # trained SmolLM2-135M walked 27 of 270 by its re-plan, 109 passes where 2 a walk were once assumed
        curves = (1 + S) * math.ceil(N / 10)
        per_layer = L * 2 + shape.masked(N + 1)
        return [Variant("full", 1 + shape.masked(curves) + per_layer),
                Variant("headline only", 1 + shape.masked(curves),
                        "redundancy: headline only (no per-layer heads_needed / one_head rows)")]
    if method == "similarity":
        pairs = N * (N + 1) / 2 * shape.sequences * shape.pos ** 2
        return [Variant("one pattern pass", PATTERN, extra_s=pairs / shape.jsd_per_s)]
    if method in ("head_roles", "attention_entropy"):
        return [Variant("one pattern pass", PATTERN)]
    if method == "patterns":
        return [Variant("one sequence", PATTERN / shape.sequences)]
    if method == "estimators":
        # one curve per estimator (probes.compare.ESTIMATORS, l0_gates only where its training fits), each
        # stopping at its first mask past the largest budget: as far as the prune curve walked before breaking (an
        # untrained model may never break: every mask), or before that curve has run, about half the masks
        curve = shape.masked(N + 1) / 2 if shape.walk is None else shape.masked(shape.walk + 1)
        l0 = L0_STEPS * min(L0_ROWS, shape.sequences) / shape.sequences * grad
        return [Variant("with l0_gates", len(ESTIMATORS) * curve + l0),
                Variant("without l0_gates", (len(ESTIMATORS) - 1) * curve,
                        "estimators: without l0_gates (its training does not fit)")]
    raise AttnlabError(f"unknown probe method {method!r}: expected one of {', '.join(METHODS)}")


def check_methods(methods: Optional[Sequence[str]]) -> tuple[str, ...]:
    """The methods to run, in run order; an unknown name is one error listing the valid ones."""
    if methods is None:
        return METHODS
    items = [methods] if isinstance(methods, str) else list(methods)
    unknown = [m for m in items if m not in METHODS]
    if unknown or not items:
        raise AttnlabError(f"--methods {','.join(map(str, items))}: unknown method(s) {unknown or 'none given'}; "
                           f"expected a comma-separated list of {','.join(METHODS)}")
    return tuple(m for m in METHODS if m in items)


def make_plan(methods: Sequence[str], shape: Shape, seconds_per_pass: float, budget_s: Optional[float],
              finished: Optional[dict[str, str]] = None, spent_s: float = 0.0) -> Plan:
    """The best variant of each method that keeps the whole plan within ``budget_s`` (None: no budget), of which
    ``spent_s`` went on timing the first pass.

    ``finished`` (method -> variant, from a stopped run's manifest) costs nothing: those are kept, and
    the attribution pass they ran is read back from their files, not run again.

    Methods claim the budget in :data:`PRIORITY` order, each its best variant that still fits; what
    does not fit at all is dropped, with a note. A budget below even the cheapest plan of the first
    method is an error naming that plan's estimate.
    """
    chosen: dict[str, Variant] = {}
    notes: list[str] = []
    left = math.inf if budget_s is None else budget_s - spent_s
    finished = finished or {}
    # the attribution pass, which the cheap rankings share (probes.attribution), is in the plan or its files
    read_back = any(m in finished for m in ("importance_gradient", "importance_attribution"))
    paid = read_back
    for method in sorted(methods, key=PRIORITY.index):
        if method in finished:
            chosen[method] = Variant(f"{finished[method]}, kept", 0.0)
            continue
        options = variants(method, shape)
        fit = next((v for v in options if v.seconds(paid, seconds_per_pass) <= left), None)
        if fit is None:
            if not chosen:
                cheapest = options[-1].seconds(paid, seconds_per_pass)
                timing = f"the timed first pass took {fmt_seconds(spent_s)} and " if spent_s else ""
                raise AttnlabError(f"--budget {(budget_s or 0.0) / 60:.3g} min is too small: {timing}the cheapest "
                                   f"plan ({method}, {options[-1].name}) needs ~{fmt_seconds(cheapest)}; expected "
                                   f"a budget of at least {math.ceil((cheapest + spent_s) / 60 * 10) / 10:g} min")
            notes.append(f"{method}: dropped, its cheapest variant needs ~"
                         f"{fmt_seconds(options[-1].seconds(paid, seconds_per_pass))} and {fmt_seconds(left)} is left")
            continue
        if fit is not options[0]:
            full = fmt_seconds(options[0].seconds(paid, seconds_per_pass))
            notes.append(f"{fit.note} ({options[0].name} would need ~{full})")
        chosen[method] = fit
        left -= fit.seconds(paid, seconds_per_pass)
        paid = paid or fit.shared > 0
    # in run order, the shared pass is charged to the first method that runs it (none, when a finished one ran it)
    steps, paid = [], read_back
    for m in (m for m in METHODS if m in chosen):
        v = chosen[m]
        steps.append(Step(m, v, v.seconds(paid, seconds_per_pass), v.cost(paid)))
        paid = paid or v.shared > 0
    return Plan(steps, notes, seconds_per_pass, budget_s)


def redundancy_after_curve(shape: Shape, curve: Any, tolerance: float, seeds: int, full: bool) -> float:
    """Passes of redundancy, re-planned from the prune curve of the same run (same orders, same baseline).

    Redundancy walks each order (importance, then ``seeds`` random ones: probes.pruning._random_order, as the
    prune curve's) mask by mask up to the first that breaks the model (loss above baseline * (1 + tolerance)).
    The prune curve sampled those orders: its first broken point bounds where each walk stops (the walk may stop
    earlier, never later). A random order the curve did not sample walks as far as the longest it did. The plan
    made before any pass assumed about two passes a walk; SmolLM2-135M walked about ten (4.9 min against ~71 s).
    """
    walks = _walks(curve, tolerance, shape.heads)
    importance = walks["importance"] or [shape.heads]
    random = (walks["random"] + [max(walks["random"] or [shape.heads])] * seeds)[:seeds]
    passes = 1 + sum(shape.masked(w) for w in [*importance, *random])
    if full:
        passes += shape.n_layers * 2 + shape.masked(shape.heads + 1)
    return passes


def longest_walk(curve: Any, tolerance: float, heads: int) -> int:
    """Heads pruned before the model breaks (loss above baseline * (1 + ``tolerance``)) along the longest walk of
    this run's prune curve, at its sampled points (``heads`` where an order never breaks). It plans the estimator
    comparison's curves, which prune in other orders (each estimator's ranking) up to the same kind of break: an
    order the curve did not sample is taken to walk as far as the longest it did."""
    return max(w for walks in _walks(curve, tolerance, heads).values() for w in walks)


def _walks(curve: Any, tolerance: float, heads: int) -> dict[str, list[int]]:
    """Per order of a prune curve (importance, random), each sampled walk's first broken point (``heads``: none)."""
    base = float(curve.loc[curve.n_pruned == 0, "loss"].iloc[0])
    walks: dict[str, list[int]] = {"importance": [], "random": []}
    for (order, _), g in curve.groupby(["order", "seed"], dropna=False, sort=False):
        broken = g[g.loss > base * (1 + tolerance)].sort_values("n_pruned")
        walks[str(order)].append(int(broken.n_pruned.iloc[0]) if len(broken) else heads)
    return walks


def replan(current: Plan, methods: Sequence[str], shape: Shape, seconds_per_pass: float, left_s: Optional[float],
           finished: dict[str, str], after: str) -> tuple[Plan, list[str]]:
    """``methods`` (the run's choice) planned again at a measured rate within the budget left: the ``finished``
    ones kept (costing nothing), the others those after ``after`` (the method that just ran) in run order
    (:data:`METHODS`).

    A run re-plans after each method (:func:`reports.pipeline.probe`): the machine may have slowed (a shared
    machine's load), or a method cost other than planned; the methods left then fall back, or come back, as the
    time left allows. Returns the new plan and what changed against ``current``, one line each: a variant
    replaced, a method dropped (with the new plan's reason) or back.
    """
    candidates = [m for m in methods if m in finished or METHODS.index(m) > METHODS.index(after)]
    new = make_plan(candidates, shape, seconds_per_pass, left_s, finished=finished)
    was = {s.method: s.variant.name for s in current.steps}
    now = {s.method: s.variant.name for s in new.steps}
    changes = []
    for method in candidates:
        if method in finished or now.get(method) == was.get(method):
            continue
        if method not in now:
            changes.append(next((n for n in new.notes if n.startswith(f"{method}: dropped")), f"{method}: dropped"))
        elif method not in was:
            changes.append(f"{method}: back, {now[method]}")
        else:
            why = next((n for n in new.notes if n.startswith(f"{method}:")), "")
            changes.append(f"{method}: {was[method]} -> {now[method]}" + (f" ({why})" if why else ""))
    return new, changes
