"""The `attnlab` command. Thin: options map onto the config dataclasses; errors are one line.

Every failure a user can cause (a missing or corrupt run directory, a bad option value, an
unknown task, an invalid config) ends as one line on stderr and exit code 2; Ctrl-C ends with
130. Only :class:`harness.errors.AttnlabError` and ``OSError`` count as bad input; anything else is a bug
of ours: the traceback, exit code 1 and a line saying how to report it.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import click
import matplotlib

from harness.adapters.placement import check_placement
from harness.errors import AttnlabError
from harness.training.tasks import TASKS
from reports import defaults, external, figures, kernels_command, pipeline
from reports.census import command as census_command
from reports.census import executor as census_executor
from reports.census import repro as census_repro
from reports.census import variants_command, variants_run
from reports.defaults import comma
from reports.heal import heal as run_heal
from reports.options import (
    BENCH_MODES,
    OutDir,
    comma_floats,
    comma_ints,
    model_and_train_configs,
    model_options,
    placement_options,
    preset_option,
    seeds_option,
    sequences_option,
    train_options,
)
from reports.probe_run import plan as probe_plan
from reports.render import attnlab_version, pct

EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_BUG = 2, 130, 1


class CliError(click.ClickException):
    """A failure the user can fix: printed as one line."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, exit_code: Optional[int] = None):
        super().__init__(" ".join(str(message).split()) or "failed")  # one line, whatever the message held
        if exit_code is not None:
            # click declares exit_code a ClassVar; a per-instance code is what CliError adds
            self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"attnlab: {self.format_message()}", err=True)


# Bad input: the project's one exception family (raised by every validator) and a file that cannot be
# read or written. A diverged run is an AttnlabError too (the learning rate is the user's). Anything
# else, a TypeError or ValueError from our own code included, is a bug: traceback and exit 1.
USER_ERRORS: tuple[type[BaseException], ...] = (AttnlabError, OSError)


class AttnlabGroup(click.Group):
    """Turns every exception into one line and an exit code, under CliRunner as under the console script."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # the order of a session: train, check, probe, ..., demo

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt as exc:
            detail = f": {exc}" if str(exc) else ""
            raise CliError(f"interrupted{detail}", EXIT_INTERRUPTED) from None
        except USER_ERRORS as exc:
            raise CliError(f"error: {exc}") from None
        except Exception as exc:
            # a bug of ours, not bad input: the traceback, then one line saying so and how to report it
            click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
            raise CliError(f"internal error: {type(exc).__name__}: {exc} -- this is a bug in attnlab, not in your "
                           f"input: please report it with the traceback above and the command you ran "
                           f"(attnlab {attnlab_version()})", EXIT_BUG) from None

    def main(self, args: Any = None, prog_name: Optional[str] = None, complete_var: Optional[str] = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name or "attnlab", complete_var, False, **extra)
        except click.exceptions.Abort:
            click.echo("attnlab: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except CliError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:  # bad option or argument: click's message, on one line
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"attnlab: error: {' '.join(exc.format_message().split())}{where}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except click.ClickException as exc:
            click.echo(f"attnlab: error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(name="attnlab", cls=AttnlabGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(attnlab_version(), prog_name="attnlab")
def cli() -> None:
    """attnlab: train, check, probe and report on small Transformers.

    Start with `attnlab demo`: it trains the default induction model, checks it, probes its heads,
    runs the softmax-saturation sweep and writes an HTML report, printing each stage's time.
    """
    matplotlib.use("Agg")  # headless: figures are only ever written to files


def _run_dir_arg(f):
    return click.argument("run_dir", type=click.Path(file_okay=False, path_type=str))(f)


def _external_opts(f):
    """--hf / --model / --out: another model than a trained run (see reports.external.resolve for the rule)."""
    f = click.option("--out", "out", default=None, type=OutDir(file_okay=False),
                     help="Run directory for --hf/--model results (not one holding a trained run).")(f)
    f = click.option("--model", "factory", default=None, metavar="MODULE:CALLABLE",
                     help="Your own factory (imported from the current folder) returning a protocol model, a "
                          "PreTrainedModel, a TransformerBridge or (nn.Module, cfg).")(f)
    f = click.option("--hf", "hf", default=None, type=click.Path(path_type=str),
                     help="A local save_pretrained folder, or a config.json for random weights (seeded by --seed).")(f)
    return click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=str))(f)


def _placement(dtype: str, device: Optional[str], attn_implementation: Optional[str],
               hf: Optional[str]) -> dict[str, Any]:
    """--dtype/--device/--attn-implementation, refused (one line, exit 2) before any model is loaded."""
    check_placement(dtype, device)
    if hf is not None:
        external.check_kernel(attn_implementation)
    return {"dtype": dtype, "device": device, "attn_implementation": attn_implementation}


def _progress_opt(f):
    return click.option("--progress/--no-progress", default=None,
                        help="Progress bars (default: only when stderr is a terminal).")(f)


@cli.command(short_help="Train a model into a run directory.")
@click.option("--out", "run_dir", required=True, type=OutDir(),
              help="Run directory to create (checkpoint/, metrics.csv).")
@preset_option
@model_options
@train_options
@click.option("--resume", is_flag=True, help="Continue the run in --out up to --steps.")
@click.option("--overwrite", is_flag=True, help="Delete the run already in --out and start over.")
@click.option("--stop-after", type=click.IntRange(min=1), default=None,
              help="Stop after this step, as an interruption would (resume later with --resume).")
@_progress_opt
def train(run_dir: str, preset_name: Optional[str], resume: bool, overwrite: bool, stop_after: Optional[int],
          progress: Optional[bool], **fields: Any) -> None:
    """Train a model into a run directory (checkpoint/, metrics.csv).

    Every model and training option defaults to the preset's value (--preset, default induction:
    the demo configuration, harness.demo_configs()), so `attnlab train --out run` trains the demo
    model and `attnlab train --out run --preset text` the byte-level text model.
    """
    model_cfg, train_cfg = model_and_train_configs(fields, preset_name)
    metrics = pipeline.train(model_cfg, train_cfg, run_dir, resume=resume, overwrite=overwrite,
                             stop_after=stop_after, progress=progress)
    last = metrics.dropna(subset=["val_accuracy"]).tail(1)
    acc = f", validation accuracy {float(last['val_accuracy'].iloc[0]):.3f}" if len(last) else ""
    click.echo(f"trained {run_dir}: step {int(metrics['step'].max())}{acc}")


@cli.command(short_help="Property suite -> RUN_DIR/properties.csv.")
@_external_opts
@click.option("--seed", type=click.IntRange(min=0), default=defaults.SEED, show_default=True,
              help="Seed of the searches (and of --hf config.json random weights).")
@click.option("--max-examples", type=click.IntRange(min=1), default=defaults.MAX_EXAMPLES, show_default=True,
              help="Hypothesis examples per property (at most, under --budget).")
@click.option("--budget/--no-budget", default=defaults.BUDGET, show_default=True,
              help="A model over ~1.8M parameters runs fewer examples, within each property's pass budget (the "
                   "row's reason says how many); --no-budget runs exactly --max-examples.")
@placement_options
@_progress_opt
def check(run_dir: Optional[str], hf: Optional[str], factory: Optional[str], out: Optional[str], seed: int,
          max_examples: int, budget: bool, dtype: str, device: Optional[str], attn_implementation: Optional[str],
          progress: Optional[bool]) -> None:
    """Run the property suite on a trained run -> RUN_DIR/properties.csv, and print the table.

    With --hf PATH or --model MODULE:CALLABLE it checks that model instead and writes
    properties.csv and model.json into --out RUN_DIR (`attnlab report RUN_DIR` renders it).
    --dtype/--device/--attn-implementation say where the model runs (default: as the checkpoint ships).
    """
    where = _placement(dtype, device, attn_implementation, hf)
    run_dir, ext = external.resolve(run_dir, out, hf, factory, seed, **where)
    if ext is not None:
        external.save(run_dir, ext)
        click.echo(f"checking {ext.card['arch']} through {ext.card['adapter']} in {ext.card['dtype']} on "
                   f"{ext.card['device']} ({ext.card['attn_implementation']})")
    table = pipeline.check(run_dir, seed=seed, max_examples=max_examples, progress=progress,
                           model=None if ext is None else ext.model, budget=budget, **where)
    shown = table.assign(result=[str(s).upper() if s == "fail" else s for s in table["status"]] if "status" in table
                         else [("pass" if p else "FAIL") if a else "n/a"
                               for a, p in zip(table["applicable"], table["passed"], strict=True)])
    click.echo(verdict_table(shown).to_string(index=False))
    status = shown["result"].str.lower()
    silent = list(table["property"][status == "unobservable"])  # not checked: never counted as failed
    unobservable = f" ({len(silent)} unobservable: {', '.join(silent)})" if silent else ""
    click.echo(f"{int((status == 'pass').sum())} / {int(status.isin(['pass', 'fail']).sum())} applicable properties "
               f"passed{unobservable}; wrote {os.path.join(run_dir, 'properties.csv')}")


@cli.command(short_help="Head probes -> RUN_DIR/probes/.")
@_external_opts
@click.option("--task", "task", type=click.Choice(sorted(TASKS)), default=None,
              help="--hf/--model: probe on this harness task's tokens, at the model's vocab and n_ctx (an "
                   "encoder-decoder: reverse or sort, from a padded source).")
@click.option("--text", "text_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="--hf: probe on this text file, tokenized by the tokenizer saved in PATH.")
@click.option("--seed", type=click.IntRange(min=0), default=defaults.SEED, show_default=True,
              help="Seed of --hf config.json random weights and of the --task batch.")
@sequences_option("Validation sequences of the run's task to probe with.")
@seeds_option("Seeds of the random prune orders.")
@click.option("--tolerance", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=defaults.TOLERANCE,
              show_default=True, help="Relative loss rise allowed when counting prunable heads.")
@click.option("--top-k", type=click.IntRange(min=1), default=defaults.TOP_K_PATTERNS, show_default=True,
              help="Most important heads whose attention patterns are saved.")
@click.option("--methods", "methods", default=defaults.PROBE_RUN_METHODS, metavar="A,B,...",
              help=f"Probe methods to run (default: all): {','.join(probe_plan.METHODS)}.")
@click.option("--budget", type=click.FloatRange(0, min_open=True), default=defaults.PROBE_BUDGET, show_default=True,
              metavar="MINUTES", help="Time budget: cheaper variants (named in the printed plan) where exact ones "
                                      "do not fit.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue a stopped probe run in this folder, skipping its finished methods.")
@placement_options
@_progress_opt
def probe(run_dir: Optional[str], hf: Optional[str], factory: Optional[str], out: Optional[str],
          task: Optional[str], text_file: Optional[str], seed: int, sequences: int, seeds: tuple[int, ...],
          tolerance: float, top_k: int, methods: Optional[str], budget: float, resume: bool, dtype: str,
          device: Optional[str], attn_implementation: Optional[str], progress: Optional[bool]) -> None:
    """Run every head probe on a trained run -> RUN_DIR/probes/*.csv.

    With --hf PATH or --model MODULE:CALLABLE it probes that model instead, on --task NAME tokens
    or (--hf with a saved tokenizer) --text FILE, writing into --out RUN_DIR. An encoder-decoder (BART, T5,
    Marian, attnlab's EncoderDecoder) is probed on --task reverse or sort, a padded source and its target, and
    every probe covers its encoder self-attention, decoder self-attention and cross-attention heads.
    """
    if (hf is None and factory is None) and (task is not None or text_file is not None):
        raise CliError("error: --task/--text are for --hf/--model; a trained run is probed on its own task")
    if (hf is not None or factory is not None) and (task is None) == (text_file is None):
        raise CliError("error: --hf/--model need exactly one of --task NAME and --text FILE: the tokens to probe on")
    chosen = None if methods is None else probe_plan.check_methods([m.strip() for m in methods.split(",")])
    where = _placement(dtype, device, attn_implementation, hf)
    run_dir, ext = external.resolve(run_dir, out, hf, factory, seed, **where)
    data, source = None, None
    if ext is not None:
        data, source = external.probe_tokens(ext, task, text_file, sequences, seed)
        external.save(run_dir, ext)
        given = "" if source is None else f" given a {tuple(source['source_tokens'].shape)} source"
        click.echo(f"probing {ext.card['arch']} through {ext.card['adapter']} on {tuple(data[0].shape)} tokens{given}")
    result = pipeline.probe(run_dir, sequences=sequences, seeds=seeds, tolerance=tolerance, top_k=top_k,
                            progress=progress, model=None if ext is None else ext.model, data=data, source=source,
                            methods=chosen, budget=budget, resume=resume, **where)
    red = result.get("redundancy")
    found = "" if red is None else (f"prunable within {tolerance:.1%} loss: {red['prunable_fraction']:.1%} of heads "
                                    f"(random order: {red['random_prunable_fraction']:.1%}); ")
    click.echo(f"{found}wrote {len(result)} probe result(s) to {os.path.join(run_dir, 'probes')}")


def verdict_table(shown: Any) -> Any:
    """The printed rows: each figure to 3 significant digits, so every verdict reads off its own numbers (pandas
    prints a column of mixed magnitudes in fixed point, where a worst deviation of 3e-08 reads 0.000000)."""
    cols = [c for c in ("property", "result", "worst", "allowance", "ratio", "counterexample") if c in shown]
    table = shown[cols].copy()
    for col in ("worst", "allowance", "ratio"):
        if col in table:
            table[col] = ["" if v != v else f"{v:.3g}" for v in table[col].astype(float)]
    return table


@cli.command(short_help="Softmax-saturation sweep -> CSV + figure.")
@click.option("--out", "out_dir", default=defaults.SATURATION_OUT, show_default=True, type=OutDir(),
              help="Folder for saturation.csv and figures/saturation.png (a run directory puts it in its report).")
@click.option("--d-heads", type=comma_ints, default=comma(defaults.SATURATION_D_HEADS), show_default=True,
              help="Head widths to sweep.")
@click.option("--seeds", type=comma_ints, default=comma(defaults.SEEDS), show_default=True, help="Seeds per width.")
@_progress_opt
def saturation(out_dir: str, d_heads: tuple[int, ...], seeds: tuple[int, ...], progress: Optional[bool]) -> None:
    """Softmax saturation against d_head, scaled vs unscaled (Vaswani et al. 2017, section 3.2.1)."""
    table = pipeline.saturation(out_dir, d_heads=d_heads, seeds=seeds, progress=progress)
    for scaled in (True, False):
        sub = table[table["scaled"] == scaled]
        click.echo(f"{'scaled' if scaled else 'unscaled':>8}: log-log slope of score variance "
                   f"{figures.loglog_slope_or_nan(sub, 'score_var'):+.2f}, of attention entropy "
                   f"{figures.loglog_slope_or_nan(sub, 'entropy'):+.2f}")
    click.echo(f"wrote {os.path.join(out_dir, 'saturation.csv')} and {os.path.join(out_dir, 'figures')}")


@cli.command(short_help="HTML + Markdown report of a run.")
@_run_dir_arg
def report(run_dir: str) -> None:
    """Render RUN_DIR/report.html (self-contained), RUN_DIR/report.md and RUN_DIR/figures/*.png."""
    paths = pipeline.report(run_dir)
    click.echo(f"wrote {paths.html} and {paths.markdown} ({len(paths.figures)} figures)")


@cli.command(short_help="Train, check, probe, sweep, report: the whole tour.")
@click.option("--out", "out_dir", default=defaults.DEMO_OUT, show_default=True, type=OutDir(),
              help="Run directory for the demo.")
@preset_option
@model_options
@train_options
@click.option("--overwrite", is_flag=True, help="Replace a run already in --out.")
@click.option("--max-examples", type=click.IntRange(min=1), default=defaults.MAX_EXAMPLES, show_default=True,
              help="Hypothesis examples per property.")
@sequences_option("Validation sequences to probe with.")
@click.option("--d-heads", type=comma_ints, default=comma(defaults.SATURATION_D_HEADS), show_default=True,
              help="Head widths of the saturation sweep.")
@seeds_option("Seeds of the random prune orders and of the saturation sweep.")
@_progress_opt
def demo(out_dir: str, preset_name: Optional[str], overwrite: bool, max_examples: int, sequences: int,
         d_heads: tuple[int, ...], seeds: tuple[int, ...], progress: Optional[bool], **fields: Any) -> None:
    """Train the default induction model, check it, probe it, sweep saturation and write the report.

    --preset picks another starting point (induction-wide, text, ...); model and training options
    override the preset's values (default: the demo configuration, harness.demo_configs()), for a
    quicker or a bigger run.
    """
    model_cfg, train_cfg = model_and_train_configs(fields, preset_name)
    click.echo(f"attnlab demo -> {out_dir}: {model_cfg.n_layers} layers x {model_cfg.n_heads} heads, "
               f"d_model {model_cfg.d_model}, task {train_cfg.task}, {train_cfg.steps} steps")
    result = pipeline.demo(out_dir, model_cfg, train_cfg, overwrite=overwrite, max_examples=max_examples,
                           sequences=sequences, d_heads=d_heads, seeds=seeds, progress=progress,
                           on_stage=lambda name, s: click.echo(f"  {name:<11}{s:7.1f} s"))
    h = result.headline
    click.echo(f"  {'total':<11}{sum(result.timings.values()):7.1f} s")
    heads = h["induction_heads"]
    failed = f" (failed: {', '.join(h['properties_failed'])})" if h["properties_failed"] else ""
    rows = [
        ("final validation accuracy", pct(h["final_accuracy"])),
        ("properties passed / applicable", f"{h['properties_passed']} / {h['properties_applicable']}{failed}"),
        (f"heads prunable within {pct(h['tolerance'])} loss",
         f"{pct(h['prunable_fraction'])} (random order: {pct(h['random_prunable_fraction'])})"),
        (f"heads prunable within {h['accuracy_drop_label']}",
         f"{pct(h['prunable_by_accuracy'])} (random order: {pct(h['random_prunable_by_accuracy'])})"),
        ("induction heads found", f"{len(heads)}" + (f": {', '.join(heads)}" if heads else "")),
    ]
    click.echo("headline:")
    width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        click.echo(f"  {label:<{width}}{value}")
    click.echo(f"report: {result.report.html}")
    click.echo(f"        {result.report.markdown}")
    click.echo(f"hf:     {result.export} (transformers.AutoModelForCausalLM.from_pretrained loads it)"
               if result.export is not None else f"hf:     not exported: {result.export_refused}")


@cli.command(short_help="Prune heads, then heal by fine-tuning and distillation.")
@_run_dir_arg
@click.option("--prune-fraction", "fractions", type=comma_floats, default=comma(defaults.HEAL_FRACTIONS),
              show_default=True, help="Fractions of the heads to prune, least important first (comma-separated).")
@click.option("--steps", type=click.IntRange(min=1), default=defaults.HEAL_STEPS, show_default=True,
              help="Healing steps per run.")
@click.option("--temperature", type=float, default=defaults.HEAL_TEMPERATURE, show_default=True,
              help="Distillation temperature T.")
@click.option("--alpha", type=float, default=defaults.HEAL_ALPHA, show_default=True,
              help="Weight of the distillation loss (1 = pure distillation, 0 = the labels alone).")
@click.option("--lr", type=float, default=None, help="Healing peak lr (default: the run's lr x 0.3).")
@click.option("--seeds", type=comma_ints, default=comma(defaults.HEAL_SEEDS), show_default=True,
              help="Seeds of the random prune orders healed as the baseline.")
@click.option("--out", "out_dir", default=None, type=OutDir(file_okay=False),
              help=f"Folder for the healed runs (default RUN_DIR/{defaults.HEAL_DIR}).")
@_progress_opt
def heal(run_dir: str, fractions: tuple[float, ...], steps: int, temperature: float, alpha: float,
         lr: Optional[float], seeds: tuple[int, ...], out_dir: Optional[str], progress: Optional[bool]) -> None:
    """Prune heads of a run by its importance order (and random orders), fine-tune and distill each
    pruned model from the run -> healed runs and RUN_DIR/probes/heal.csv (the report's heal section)."""
    table = run_heal(run_dir, fractions=fractions, steps=steps, temperature=temperature, alpha=alpha, lr=lr,
                     seeds=seeds, out=out_dir, progress=progress)
    shown = table[table["order"] == "importance"].pivot(index="fraction_pruned", columns="stage",
                                                       values=["loss", "accuracy"])
    click.echo(shown.to_string(float_format=lambda v: f"{v:.4f}"))
    click.echo(f"wrote {os.path.join(run_dir, 'probes', 'heal.csv')} and the healed runs in "
               f"{out_dir or os.path.join(run_dir, defaults.HEAL_DIR)}")


@cli.command(short_help="Export a run as a Hugging Face model.")
@_run_dir_arg
@click.option("--out", "out_dir", required=True, type=OutDir(),
              help="Folder for the save_pretrained output (config.json, model.safetensors).")
def export(run_dir: str, out_dir: str) -> None:
    """Write the run's model as GPT2LMHeadModel or LlamaForCausalLM save_pretrained output (safetensors).

    Learned, sinusoidal or no positions export as GPT-2, attention-only models with zero MLPs, and
    the export computes the run's logits to the bit; rotary exports as Llama.
    """
    hf = pipeline.export(run_dir, out_dir)
    click.echo(f"wrote {type(hf).__name__} to {out_dir} (transformers.AutoModelForCausalLM.from_pretrained loads it)")


@cli.command(short_help="Census of every model type transformers ships -> one result each.")
@click.option("--only", multiple=True, metavar="TYPE", help="Only these model types (repeatable); an unknown one lists "
              "the close matches.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes of the local executor (one model type each).")
@click.option("--executor", type=click.Choice(census_executor.KINDS), default="local", show_default=True,
              help="Where the model types (or drawn configs) run: local worker processes, or one Ray task each "
              "(pip install 'attnlab[ray]'; a local Ray instance unless --address).")
@click.option("--address", default=None, metavar="ADDR", help="With --executor ray: the running Ray cluster to use "
              "(HOST:PORT as `ray start --head` prints it, or auto).")
@click.option("--timeout", type=click.IntRange(min=1), default=census_command.TIMEOUT_S, show_default=True,
              help="Seconds per model type before it is recorded as timed out.")
@click.option("--no-cache", is_flag=True, help="Recompute every result (the cache is keyed by transformers version "
              "and the code that decides a result).")
@click.option("--out", type=click.Path(path_type=Path), help="Write the results as CSV here (with --repro: the folder "
              "for the scripts, default the current directory).")
@click.option("--write-docs", "write_docs", is_flag=True, help="Rewrite the census section of docs/models.md and its "
              "heatmap (with --bridge: the bridge section and docs/census_bridge.json).")
@click.option("--bridge", is_flag=True, help="Check each model through TransformerLens's bridge instead of HFAdapter "
              "and compare with the raw census (a conformance table).")
@click.option("--variants", type=click.IntRange(min=1), default=None, metavar="N",
              help="Draw N configs per model type from its config class's own fields and check each (default types: "
              "the most used decoders and the encoder-decoders; with --write-docs: the variants section and "
              "docs/census_variants.json).")
@click.option("--seed", type=int, default=variants_command.DEFAULT_SEED, show_default=True,
              help="With --variants: the seed of the draws (the same seed draws the same configs).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(variants_run.DTYPES), default=("float32",),
              show_default=True, help="With --variants: check each drawn config at this dtype (repeatable).")
@click.option("--dtype-variants", type=click.IntRange(min=0), default=None, metavar="K",
              help="With --variants: only the first K drawn configs of each type run at the dtypes after the first "
              "(default: all N).")
@click.option("--repro", metavar="TYPE", default=None, help="Write one standalone Python file per live finding of "
              "TYPE (torch and transformers only; exit 1 while the bug is present) into --out, and print the paths.")
@click.pass_context
def census(ctx: click.Context, only: tuple[str, ...], workers: int, executor: str, address: Optional[str],
           timeout: int, no_cache: bool, out: Optional[Path], write_docs: bool, bridge: bool, variants: Optional[int],
           seed: int, dtypes: tuple[str, ...], dtype_variants: Optional[int], repro: Optional[str]) -> None:
    """Build every causal/masked/seq2seq LM model type tiny and random, check it, and give it one result."""
    if repro is not None:
        given = [f"--{name.replace('_', '-')}" for name in ctx.params if name not in ("repro", "out")
                 and ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise CliError(f"error: --repro writes one type's reproductions and takes only --out, not "
                           f"{' '.join(given)}")
        for path in census_repro.write_type(repro, out if out is not None else Path.cwd()):
            click.echo(str(path))
        return
    if out is not None and out.is_dir():
        raise CliError(f"error: --out {out} is a folder: expected the CSV file to write (a folder only with --repro)")
    if variants is not None:
        if bridge or out is not None:
            raise CliError("error: --variants takes neither --bridge nor --out (its rows go to "
                           "docs/census_variants.json with --write-docs)")
        variants_command.run(variants, only, seed=seed, dtypes=dtypes, dtype_variants=dtype_variants,
                             workers=workers, timeout_s=timeout, executor=executor, address=address,
                             use_cache=not no_cache, write_docs=census_command.DOC if write_docs else None,
                             echo=click.echo)
        return
    if seed != variants_command.DEFAULT_SEED or dtypes != ("float32",) or dtype_variants is not None:
        raise CliError("error: --seed, --dtype and --dtype-variants choose the drawn configs of --variants N: add "
                       "--variants")
    census_command.run(only, workers=workers, timeout_s=timeout, use_cache=not no_cache, out=out,
                       write_docs=census_command.DOC if write_docs else None, echo=click.echo, bridge=bridge,
                       executor=executor, address=address)


@cli.command(short_help="Attention-kernel conformance table (docs/kernels.md).")
@click.option("--kernel", "specs", multiple=True, metavar="MODULE:FN", help="A kernel with transformers' attention "
              "signature fn(module, query, key, value, attention_mask, **kw) (repeatable).")
@click.option("--builtin", "names", multiple=True, metavar="NAME", help="A built-in kernel (repeatable; default: "
              "all of them when no --kernel is given).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(kernels_command.DOC_DTYPES), default=("float32",),
              show_default=True, help="Check at this dtype (repeatable).")
@click.option("--max-examples", type=click.IntRange(min=1), default=None, help="Examples per row and dtype "
              "(default: properties.kernels.DEFAULT_EXAMPLES).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the searches.")
@click.option("--write-docs", is_flag=True, help="Rewrite docs/kernels.md from every built-in at three dtypes.")
def kernels(specs: tuple[str, ...], names: tuple[str, ...], dtypes: tuple[str, ...], max_examples: Optional[int],
            seed: int, write_docs: bool) -> None:
    """Check attention kernels against a float64 reference, one row per attention feature."""
    kernels_command.run(specs, names, dtypes, max_examples, seed, write_docs, echo=click.echo)


@cli.command(short_help="Benchmark table for this machine.")
@click.option("--full", is_flag=True, help="The full sizes (minutes) instead of the short CI sizes.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=defaults.BENCH_DEVICE, show_default=True,
              help="auto: CUDA when available, else CPU.")
def bench(full: bool, device: str) -> None:
    """Print the side-by-side benchmark table (ratios measured in one run) for this machine."""
    # imported here, not at the top: a development tool (its peers want the test extra) that only `attnlab bench`
    # should pay for, and whose absence must not break the other commands
    try:
        from reports.bench.suite import format_table, run_suite
    except ImportError as exc:
        raise CliError(f"error: the benchmark suite is not available in this install ({exc})") from None
    click.echo(format_table(run_suite(BENCH_MODES[full], None if device == "auto" else device)))


def main() -> None:
    """Console-script entry: bad input becomes one line on stderr and exit code 2, never a traceback."""
    cli.main(prog_name="attnlab")


if __name__ == "__main__":
    main()
