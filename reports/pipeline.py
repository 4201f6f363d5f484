"""The stages behind the ``attnlab`` commands: train, check, probe, saturation, report, export, demo.

Each stage reads and writes plain files in a run directory (see :mod:`reports.rundata`), so
any stage can be re-run alone, from the command line or from Python::

    from reports import pipeline
    pipeline.check("runs/induction")      # -> properties.csv
    pipeline.probe("runs/induction")      # -> probes/*.csv
    pipeline.report("runs/induction")     # -> report.html, report.md, figures/*.png
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch
from tqdm.auto import tqdm

import harness
import properties
from harness._checks import check_int, check_ints, check_number, check_positive_int
from harness.adapters.placement import check_placement, placed
from harness.adapters.protocol import model_device
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.convert import check_exportable
from harness.run_dir import RunDir, atomic_write, atomic_write_json
from harness.training.checkpoint import prepare_run_dir, read_configs
from harness.training.tasks import make_task
from reports import figures, rundata
from reports.defaults import (
    ATTN_IMPLEMENTATION,
    BUDGET,
    DEVICE,
    DTYPE,
    MAX_EXAMPLES,
    PROBE_BUDGET,
    PROBE_EXACT_TOP,
    PROBE_RUN_METHODS,
    PROBE_SEQUENCES,
    SATURATION_D_HEADS,
    SEED,
    SEEDS,
    TOLERANCE,
    TOP_K_PATTERNS,
)
from reports.export import export_hf
from reports.probe_run import manifest, plan, replanning, steps
from reports.probe_run.progress import BudgetSpent, Progress, release_memory
from reports.render import ReportPaths, render

PROBE_DATA_SEED = 1234  # the probes' validation batch: fixed, so re-running a probe gives the same numbers
# The importance methods `attnlab probe` runs (names from probes.importance.METHODS, which the report
# reads back): those its plan knows; a method that trains (l0_gates) is for notebooks and is not run here.
PROBE_METHODS = tuple(m for m in rundata.IMPORTANCE_METHODS if f"importance_{m}" in plan.METHODS)


def _write_csv(df: pd.DataFrame, path: Path, **kw: Any) -> Path:
    """Write atomically, so a killed stage never leaves half a CSV."""
    return atomic_write(path, lambda f: df.to_csv(f, **kw))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


# --- train ---------------------------------------------------------------------------------------
def train(model_cfg: Any, train_cfg: Any, run_dir: str | os.PathLike, *, resume: bool = False,
          overwrite: bool = False, stop_after: Optional[int] = None, progress: Optional[bool] = None) -> pd.DataFrame:
    """Train a model into ``run_dir`` (checkpoint + metrics.csv); see :func:`harness.train`."""
    return harness.train(model_cfg, train_cfg, run_dir, resume=resume, overwrite=overwrite,
                         stop_after=stop_after, progress=progress)


def _load(run_dir: str | os.PathLike):
    path = rundata.require_run_dir(run_dir)
    model_cfg, train_cfg = read_configs(path)
    prepare_run_dir(path)  # check and probe write into the run: a read-only or full disk fails before the work
    return path, harness.load_run(path), model_cfg, train_cfg


# --- check ---------------------------------------------------------------------------------------
def check(run_dir: str | os.PathLike, *, seed: int = SEED, max_examples: int = MAX_EXAMPLES,
          progress: Optional[bool] = None, model: Any = None, dtype: Optional[str] = DTYPE,
          device: Optional[str] = DEVICE, attn_implementation: Optional[str] = ATTN_IMPLEMENTATION,
          budget: bool = BUDGET) -> pd.DataFrame:
    """Run the property suite on the run's model; writes ``properties.csv`` and returns the table.

    ``model`` (one from outside attnlab, behind the protocol: :func:`reports.external.open_model`)
    is checked instead of a trained run's, its results written into ``run_dir``. ``dtype``,
    ``device`` and ``attn_implementation`` say where it runs (:func:`_placed`); ``table.attrs``
    records what ran. ``budget``: ``max_examples`` is a cap that a large model's pass budget lowers row by row
    (``properties.check_model(budget=True)``; the row's reason says how many ran), else an exact count.
    """
    check_positive_int("max_examples", max_examples)
    check_int("seed", seed, 0)
    check_placement(dtype, device)  # before the run is loaded
    if model is None:
        path, model, _, _ = _load(run_dir)
    else:
        path = Path(run_dir)
    model = _placed(model, dtype, device, attn_implementation)
    names = list(properties.PROPERTIES)
    rows = []
    for name in tqdm(names, desc="properties", unit="property", disable=_quiet(progress)):
        rows.append(properties.check_model(model, seed=seed, max_examples=max_examples, properties=[name],
                                           budget=budget))
    table = pd.concat(rows, ignore_index=True)
    table.attrs.update({k: rows[0].attrs.get(k) for k in ("adapter", "dtype", "device", "attn_implementation")})
    _write_csv(table, RunDir(path).properties_csv, index=False)
    return table


def _placed(model: Any, dtype: Optional[str], device: Optional[str], attn_implementation: Optional[str]) -> Any:
    """The model where it runs, placed once for a whole stage (the suite and the probes then find nothing
    to change): :func:`harness.adapters.placed`, a copy when anything changes; an --hf model is already
    loaded there (:func:`reports.external.load_hf`), so it is not copied."""
    return placed(model, dtype=dtype, device=device, attn_implementation=attn_implementation)


def _quiet(progress: Optional[bool]) -> Optional[bool]:
    """tqdm's ``disable``: None lets tqdm show the bar only on a terminal."""
    return None if progress is None else not progress


# --- probe ---------------------------------------------------------------------------------------
def probe_data(model_cfg: Any, train_cfg: Any, sequences: int = PROBE_SEQUENCES):
    """A fixed validation batch of the run's own task: ``(tokens, loss_mask)``."""
    task = make_task(train_cfg.task, model_cfg.d_vocab, model_cfg.n_ctx, train_cfg.seq_len, train_cfg.task_options)
    return task.batch(sequences, torch.Generator().manual_seed(PROBE_DATA_SEED), "val")


def probe(run_dir: str | os.PathLike, *, sequences: int = PROBE_SEQUENCES, seeds: Sequence[int] = SEEDS,
          tolerance: float = TOLERANCE, top_k: int = TOP_K_PATTERNS,
          progress: Optional[bool] = None, model: Any = None, data: Any = None, dtype: Optional[str] = DTYPE,
          device: Optional[str] = DEVICE, attn_implementation: Optional[str] = ATTN_IMPLEMENTATION,
          methods: Optional[Sequence[str]] = PROBE_RUN_METHODS, budget: Optional[float] = PROBE_BUDGET,
          resume: bool = False, exact_top: int = PROBE_EXACT_TOP, source: Optional[dict[str, Any]] = None
          ) -> dict[str, Any]:
    """Run the head probes on the run's model over a fixed validation batch; writes ``probes/*``.

    ``model`` with ``data = (tokens, loss_mask or None)`` probes a model from outside attnlab
    (:mod:`reports.external`) instead of a trained run's, writing into ``run_dir``. ``dtype``,
    ``device`` and ``attn_implementation`` say where it runs, as for :func:`check`.

    ``methods`` (None: all of :data:`reports.probe_run.plan.METHODS`) are planned before any runs:
    one pass is timed and the plan (each method, its variant, passes and estimate) printed to stderr;
    ``budget`` (minutes, None: none) keeps the plan within it by cheaper variants, each named in the
    plan (:func:`reports.probe_run.plan.make_plan`). Each method's file is written as it finishes,
    and ``probes/manifest.json`` records the model, data, options and finished methods; ``resume``
    continues a stopped run, skipping those, and refuses one made from another model or options.
    ``progress=False`` prints nothing; otherwise progress lines go to stderr, terminal or not.

    ``source``: an encoder-decoder's source keywords (``source_tokens``, ``source_mask``) for ``data``'s rows
    (:func:`reports.external.seq2seq_tokens`); every method then covers its encoder self-attention, decoder
    self-attention and cross-attention heads, each per-head file with a ``kind`` column.
    """
    check_positive_int("sequences", sequences)
    check_positive_int("top_k", top_k)
    check_positive_int("exact_top", exact_top)
    seeds = check_ints("seeds", seeds, 0)
    check_number("tolerance", tolerance, 0, 1, high_inclusive=False, expected="a number in (0, 1)")
    if budget is not None:
        check_number("budget", budget, 0.0, expected="minutes > 0")
    chosen = plan.check_methods(methods)
    check_placement(dtype, device)  # before the run is loaded
    if model is None:
        path, model, model_cfg, train_cfg = _load(run_dir)
        tokens, loss_mask = probe_data(model_cfg, train_cfg, sequences)
    else:
        path, (tokens, loss_mask) = Path(run_dir), data
    model = _placed(model, dtype, device, attn_implementation)
    where = model_device(model)  # the probes move their inputs themselves; top_patterns' cache run does not
    tokens = tokens.to(where)
    loss_mask = None if loss_mask is None else loss_mask.to(where)
    src = {name: t.to(where) for name, t in (source or {}).items()}
    layout = RunDir(path)
    layout.probes.mkdir(exist_ok=True)
    manifest_path = layout.probe_file(rundata.PROBE_FILES["manifest"])
    ident = manifest.identity(model, tokens, loss_mask, src)
    options = {"sequences": int(tokens.shape[0]), "seeds": list(seeds), "tolerance": float(tolerance),
               "top_k": top_k, "exact_top": exact_top, "dtype": dtype, "device": device,
               "attn_implementation": attn_implementation}
    if resume:
        record = manifest.check_resume(manifest_path, ident, options)
    else:
        record = manifest.new(ident, options)
        for stale in (*[steps.output(layout, m) for m in plan.METHODS], manifest_path):
            stale.unlink(missing_ok=True)  # a fresh run: no file of an older run stays beside its own
    for partial in layout.probes.glob(".*.tmp*"):  # the temp file of a write a kill cut short (harness.run_dir)
        partial.unlink(missing_ok=True)
    say = Progress(model.cfg.n_layers, int(tokens.shape[0]), enabled=progress is not False)
    # what loading and tokenizing freed goes back before the first pass (Gemma-3's 262k-token tokenizer leaves
    # ~0.5 GB of freed Python objects in malloc's arenas, under every later peak)
    gc.collect()
    release_memory()
    began = time.perf_counter()  # the budget holds the timed first pass and every method
    if budget is not None:  # no pass of a method starts after the budget's end (Progress's clock)
        say.deadline = say.clock() + budget * 60

    def left() -> Optional[float]:  # the budget left, on the clock of the deadline the pass counter keeps
        return None if say.deadline is None else say.deadline - say.clock()

    seconds, shape = steps.first_pass(model, tokens, loss_mask, exact_top, len(seeds),
                                      backward="importance_gradient" not in record["finished"], source=src)
    say.tail = shape.tail
    release_memory()
    the_plan = plan.make_plan(chosen, shape, seconds, None if budget is None else budget * 60,
                              finished={m: d["variant"] for m, d in record["finished"].items()},
                              spent_s=time.perf_counter() - began)
    for line in the_plan.lines():
        say.say(line)
    record["plan"] = [{"method": s.method, "variant": s.variant.name} for s in the_plan.steps]
    record["notes"] = the_plan.notes
    atomic_write_json(manifest_path, record, indent=1)
    example = pd.DataFrame({"position": range(tokens.shape[1]), "token": tokens[0].tolist()})
    _write_csv(example, layout.probe_file(rundata.PROBE_FILES["example"]), index=False)
    source_file = layout.probe_file(rundata.PROBE_FILES["example_source"])
    source_file.unlink(missing_ok=True)
    if src:  # the example's source: the keys of its encoder and cross-attention patterns
        _write_csv(steps.example_source(src), source_file, index=False)
    ctx = steps.Context(model, tokens, loss_mask, tuple(seeds), float(tolerance), top_k, layout, src)
    for method, done in record["finished"].items():  # --resume: what later methods read, from the files
        ctx.results[method] = steps.read(layout, method)
        ctx.costs[method] = (done["seconds"], done.get("forward", float("nan")), done.get("backward", float("nan")))
        if done.get("baseline_loss") is not None:
            ctx.results[method].attrs["baseline_loss"] = done["baseline_loss"]
    rate = seconds  # seconds per pass: the first pass's, then the latest method's, measured
    i = 0
    while i < len(the_plan.steps):
        step = the_plan.steps[i]
        i += 1
        if step.method in record["finished"]:  # by a stopped run this one resumes
            say.say(f"[{i}/{len(the_plan.steps)}] {step.method}: finished before, kept "
                    f"({steps.output(layout, step.method)})")
            continue
        if step.method == "redundancy" and "prune_curve" in ctx.results:
            later = sum(s.seconds for s in the_plan.steps[i:] if s.method not in record["finished"])
            room = left()
            revised, note = replanning.redundancy(step, shape, rate, ctx.results["prune_curve"], float(tolerance),
                                       len(seeds), None if room is None else room - later)
            say.say(f"  {note}")
            record["notes"].append(note)
            if revised is None:  # out of the plan, so the steps' numbering and the manifest's plan stay true
                i -= 1
                the_plan.steps = [s for s in the_plan.steps if s is not step]
                record["plan"] = [s for s in record["plan"] if s["method"] != step.method]
                atomic_write_json(manifest_path, record, indent=1)
                continue
            atomic_write_json(manifest_path, record, indent=1)
            step = revised
        start = time.perf_counter()
        try:
            with say.step(i, len(the_plan.steps), step, model):
                ctx.results[step.method] = steps.RUNNERS[step.method](ctx, step.variant)
        except BudgetSpent as spent_out:
            _out_of_budget(spent_out, the_plan, i, record, say)
            record["elapsed_s"] = round(time.perf_counter() - began, 3)
            atomic_write_json(manifest_path, record, indent=1)
            break
        spent = time.perf_counter() - start
        ctx.costs[step.method] = (spent, say.forward, 1.0 if "bwd" in step.variant.name else 0.0)
        steps.write(layout, step.method, ctx.results[step.method])
        baseline = getattr(ctx.results[step.method], "attrs", {}).get("baseline_loss")
        rate, shape = replanning.measured(rate, shape, step, say.span, say.done, ctx)
        the_plan, i = replanning.rest(the_plan, chosen, step, shape, rate, left(), record, say)
        # one manifest write a method (its plan and notes updated above): a stop can fall only between whole files
        record["elapsed_s"] = round(time.perf_counter() - began, 3)
        manifest.finish(manifest_path, record, step.method, step.variant.name, spent, baseline_loss=baseline,
                        forward=ctx.costs[step.method][1], backward=ctx.costs[step.method][2],
                        peak_rss_gb=say.peak_gb)
    return ctx.results


def _out_of_budget(stop: BudgetSpent, the_plan: Any, i: int, record: dict[str, Any], say: Progress) -> None:
    """The run's end when the budget ran out inside a method: that method is not saved (it stays in the plan, so
    the report marks the run partial and ``--resume`` runs it), and the methods after it are dropped; each is
    said and noted."""
    notes = [f"{stop.method}: stopped when the budget ran out, after {stop.done:.1f} of {stop.planned:.1f} "
             "passes; not saved (--resume runs it)"]
    later = [s.method for s in the_plan.steps[i:] if s.method not in record["finished"]]
    notes += [f"{m}: dropped, the budget ran out before it started" for m in later]
    for note in notes:
        say.say(note)
    record["notes"].extend(notes)
    record["plan"] = [s for s in record["plan"] if s["method"] not in later]


# --- saturation ----------------------------------------------------------------------------------
def saturation(out_dir: str | os.PathLike, *, d_heads: Sequence[int] = SATURATION_D_HEADS,
               seeds: Sequence[int] = SEEDS, progress: Optional[bool] = None) -> pd.DataFrame:
    """Softmax saturation against d_head, scaled and unscaled; writes ``saturation.csv`` and its figure."""
    d_heads = check_ints("d_heads", d_heads, 1)
    seeds = check_ints("seeds", seeds, 0)
    if len(set(d_heads)) < 2:
        raise AttnlabError(f"d_heads={d_heads!r} is invalid: a log-log slope needs at least two distinct values")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise AttnlabTypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise AttnlabError(f"--out {out} is a file: expected a folder")
    out.mkdir(parents=True, exist_ok=True)
    parts = [properties.saturation_sweep(d_heads=(d,), seeds=seeds)
             for d in tqdm(d_heads, desc="saturation", unit="d_head", disable=_quiet(progress))]
    table = pd.concat(parts, ignore_index=True).sort_values(["scaled", "d_head", "seed"], ignore_index=True)
    layout = RunDir(out)
    _write_csv(table, layout.saturation_csv, index=False)
    layout.figures.mkdir(exist_ok=True)
    figures.save_png(figures.saturation(table), layout.figure("saturation"))
    return table


# --- report and demo -----------------------------------------------------------------------------
def report(run_dir: str | os.PathLike) -> ReportPaths:
    """Render ``report.html`` and ``report.md`` (and ``figures/``) from what the run directory holds."""
    return render(run_dir)


def export(run_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Any:
    """The run's model as Hugging Face ``save_pretrained`` output in ``out_dir`` (:func:`reports.export.export_hf`)."""
    return export_hf(run_dir, out_dir)


@dataclass
class DemoResult:
    run_dir: Path
    report: ReportPaths
    timings: dict[str, float] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)
    export: Optional[Path] = None  # the Hugging Face export (RUN_DIR/hf), or None when the design has none
    export_refused: Optional[str] = None  # why not: the config field to_hf names


def _export_refusal(model_cfg: Any) -> Optional[str]:
    """None when the model exports to Hugging Face exactly, else to_hf's reason (the field it names)."""
    try:
        check_exportable(model_cfg)
    except AttnlabError as exc:
        return str(exc)
    return None


def demo(out_dir: str | os.PathLike, model_cfg: Any = None, train_cfg: Any = None, *, overwrite: bool = False,
         max_examples: int = MAX_EXAMPLES, sequences: int = PROBE_SEQUENCES,
         d_heads: Sequence[int] = SATURATION_D_HEADS, seeds: Sequence[int] = SEEDS,
         progress: Optional[bool] = None, on_stage: Optional[Callable[[str, float], None]] = None) -> DemoResult:
    """Train the default induction model (``harness.demo_configs()`` unless configs are given), check it,
    probe it, run the saturation sweep, export it as a Hugging Face model (``RUN_DIR/hf``; skipped, with
    the reason in the result, for a design Hugging Face cannot reproduce) and render the report, timing
    each stage.

    ``on_stage(name, seconds)`` is called as each stage finishes (the CLI prints it).
    """
    if not isinstance(out_dir, (str, os.PathLike)):
        raise AttnlabTypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    out = Path(out_dir)
    if not overwrite and (RunDir(out).checkpoint.exists() or RunDir(out).metrics_csv.exists()):
        raise AttnlabError(f"{out} already holds a run: pass overwrite=True (attnlab demo --overwrite) to replace it, "
                           "or choose another folder (--out)")
    if model_cfg is None or train_cfg is None:
        default_model, default_train = harness.demo_configs()
        model_cfg = default_model if model_cfg is None else model_cfg
        train_cfg = default_train if train_cfg is None else train_cfg
    refusal = _export_refusal(model_cfg)  # from the config, before the training
    hf_dir = RunDir(out).hf_export
    timings: dict[str, float] = {}
    stages: list[tuple[str, Callable[[], Any]]] = [
        ("train", lambda: train(model_cfg, train_cfg, out_dir, overwrite=overwrite, progress=progress)),
        ("check", lambda: check(out_dir, max_examples=max_examples, progress=progress)),
        ("probe", lambda: probe(out_dir, sequences=sequences, seeds=seeds, progress=progress)),
        ("saturation", lambda: saturation(out_dir, d_heads=d_heads, seeds=seeds, progress=progress)),
        *([] if refusal else [("export", lambda: export(out_dir, hf_dir))]),
        ("report", lambda: report(out_dir)),
    ]
    results = {}
    for name, run in stages:
        start = time.perf_counter()
        results[name] = run()
        timings[name] = time.perf_counter() - start
        if on_stage is not None:
            on_stage(name, timings[name])
    headline = rundata.headline(rundata.load(out_dir))
    return DemoResult(Path(out_dir), results["report"], timings, headline, None if refusal else hf_dir, refusal)
