"""Fuzzed bad input through the `attnlab` CLI (click's CliRunner, in process: milliseconds a case).

Every generated command line is invalid by construction: an option value out of range or of
the wrong type, an unknown choice, a contradiction between options, an unknown option, a path
that is missing, a file, or no run. Each must end as one line on stderr naming the bad value,
exit code 2, no traceback, and nothing written (the folders involved are snapshotted before and
compared after). Cases are counted by :mod:`tests.helpers.fuzz`.

The other path is proved too: an exception that is not bad input (a TypeError, KeyError or plain
ValueError raised inside a stage, as a bug of ours would) is a traceback, exit code 1 and one last
line saying it is a bug and how to report it, never the one-line exit 2 of a user's mistake.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from harness import ModelConfig, TrainConfig, train
from harness.adapters import DTYPE_NAMES
from harness.errors import AttnlabError
from harness.model.config import ACT_FNS, ATTENTION_DIRS, DTYPES, MAX_SEED, NORM_PLACEMENTS, POSITIONAL_TYPES
from harness.training.config import OPTIMIZERS, SCHEDULES
from harness.training.presets import PRESETS
from harness.training.tasks import TASKS
from reports.cli import cli
from tests.helpers.fuzz import cli_error, fuzz_settings, install_summary, snapshot


@pytest.fixture(autouse=True, scope="module")
def _summary(request):
    install_summary(request.config)


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


# A valid tiny configuration: a case that is accidentally valid trains two steps and fails its
# test, rather than training the demo model for minutes.
BASE = ["--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--d-vocab", "16", "--n-ctx", "16", "--attn-only",
        "--task", "induction", "--seq-len", "8", "--batch-size", "4", "--steps", "2", "--eval-every", "1",
        "--warmup", "0", "--checkpoint-every", "none", "--device", "cpu", "--no-progress"]


# --- raw option values that must be refused --------------------------------------------------------------
def _parses(kind, s: str) -> bool:
    try:
        kind(s)
    except (ValueError, OverflowError):
        return False
    return True


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=6)
EDGE = st.sampled_from(["", " ", "1.5", "0x10", "1e3", "nan", "inf", "-inf", "--", "1,2", "True", "√2", "一"])


def non_int():
    return st.one_of(TEXT, EDGE).filter(lambda s: not _parses(int, s) and s.strip().lower() != "none")


def non_float():
    return st.one_of(TEXT, EDGE).filter(lambda s: not _parses(float, s) and s.strip().lower() != "none")


def ints(lo=None, hi=None):
    return st.integers(min_value=lo, max_value=hi).map(str)


def bad_int(minimum: int):
    return st.one_of(ints(hi=minimum - 1), non_int())


def floats_outside(low: float, high: float | None = None, low_ok: bool = False, high_ok: bool = True):
    """Number strings outside the interval, NaN and +-inf, and non-numbers."""
    kinds = [st.floats(max_value=low, exclude_max=low_ok, allow_nan=False).map(repr),
             st.sampled_from(["nan", "inf", "-inf", "1e400"]), non_float()]
    if high is not None:
        kinds.append(st.floats(min_value=high, exclude_min=high_ok, allow_nan=False, allow_infinity=False).map(repr))
    return st.one_of(*kinds)


def bad_choice(choices):
    return st.one_of(TEXT, EDGE, st.sampled_from([c.upper() for c in choices if c.upper() != c] or ["X"])).filter(
        lambda s: s not in choices)


# option -> (field named in the message, strategy of bad raw values)
OPTIONS = {
    **{f"--{n}": (n.replace("-", "_"), bad_int(1)) for n in ("n-layers", "d-model", "n-heads", "d-vocab", "n-ctx",
                                                               "d-head", "d-mlp", "batch-size", "steps",
                                                               "eval-every", "eval-batches", "log-every")},
    "--act-fn": ("act_fn", bad_choice(ACT_FNS)),
    "--normalization-type": ("normalization_type", bad_choice(("LN", "RMS", "none"))),
    "--norm-placement": ("norm_placement", bad_choice(NORM_PLACEMENTS)),
    "--positional-embedding-type": ("positional_embedding_type", bad_choice(POSITIONAL_TYPES)),
    "--attention-dir": ("attention_dir", bad_choice(ATTENTION_DIRS)),
    "--dtype": ("dtype", bad_choice(DTYPES)),
    "--task": ("task", bad_choice(tuple(TASKS))),
    "--optimizer": ("optimizer", bad_choice(OPTIMIZERS)),
    "--schedule": ("schedule", bad_choice(SCHEDULES)),
    "--device": ("device", bad_choice(("auto", "cpu", "cuda"))),
    "--rotary-base": ("rotary_base", floats_outside(1.0)),
    "--eps": ("eps", floats_outside(0.0, 1.0)),
    "--init-range": ("init_range", floats_outside(0.0)),
    "--lr": ("lr", floats_outside(0.0)),
    "--min-lr-ratio": ("min_lr_ratio", floats_outside(0.0, 1.0, low_ok=True)),
    "--weight-decay": ("weight_decay", floats_outside(0.0, low_ok=True)),
    "--momentum": ("momentum", floats_outside(0.0, 1.0, low_ok=True, high_ok=False)),
    "--label-smoothing": ("label_smoothing", floats_outside(0.0, 1.0, low_ok=True, high_ok=False)),
    "--grad-clip": ("grad_clip", floats_outside(0.0)),
    "--model-seed": ("seed", st.one_of(bad_int(0), ints(lo=MAX_SEED + 1))),
    "--seed": ("seed", st.one_of(bad_int(0), ints(lo=MAX_SEED + 1))),
    "--warmup": ("warmup", bad_int(0)),
    "--seq-len": ("seq_len", st.one_of(bad_int(2), ints(17, 10**6))),  # > n_ctx=16 too
    "--n-key-value-heads": ("n_key_value_heads", st.one_of(bad_int(1), ints(3, 50))),  # n_heads=2: no divisor >= 3
    "--checkpoint-every": ("checkpoint_every", bad_int(1)),
    "--temperature": ("temperature", floats_outside(0.0)),
    "--alpha": ("alpha", floats_outside(0.0, 1.0, low_ok=True)),
    "--preset": ("preset", bad_choice(tuple(PRESETS))),
    "--head-mask": ("head_mask", st.sampled_from(["x", "1,1", "[[0,0]]", "[[2,1]]", "[[1],[1]]", "[]", "[[1,1,1]]"])),
    "--distill-from": ("distill_from", st.just("/nonexistent-attnlab/teacher")),
    "--stop-after": ("stop_after", st.one_of(bad_int(1), ints(3, 10**6))),  # steps=2
    "--betas": ("betas", st.one_of(non_float(), st.sampled_from(["0.9", "0.9,0.99,0.9", "0.9,", ",0.9"]),
                                   st.tuples(st.sampled_from(["1.0", "-0.1", "nan", "2"]), st.sampled_from(["0.9"]))
                                   .map(lambda t: ",".join(t)))),
    "--task-option": ("task", st.one_of(TEXT.filter(lambda s: "=" not in s or not s.split("=")[0].strip()),
                                        st.tuples(TEXT.filter(lambda k: k.strip() and "=" not in k
                                                              and k.strip() not in ("min_prefix", "distinct")),
                                                  st.sampled_from(["1", "x"])).map(lambda t: "=".join(t)),
                                        st.sampled_from(["min_prefix=1", "min_prefix=5", "min_prefix=x",
                                                         "min_prefix=1.5", "distinct=1", "distinct=\"no\""]))),
}
TRAIN_OPTIONS = {opt for p in cli.commands["train"].params for opt in (*p.opts, *p.secondary_opts)}
FLAGS = ["--attn-only", "--gated-mlp", "--tie-embeddings", "--compile", "--amp", "--resume", "--overwrite",
         "--progress", "--use-attn-scale"]


@st.composite
def bad_train_args(draw):
    """(extra args, names one of which the message must hold, the value it must spell or None)."""
    kind = draw(st.sampled_from(["option"] * 6 + ["flag", "unknown", "contradiction", "corpus"]))
    if kind == "option":
        option = draw(st.sampled_from(sorted(OPTIONS)))
        field, values = OPTIONS[option]
        raw = draw(values)
        names = (option, f"{field}=", "task", "key=value") if option == "--task-option" else (option, f"{field}=")
        names += ("betas[",) if option == "--betas" else ()
        value = raw.split("=", 1)[0] if option == "--task-option" and "=" in raw else raw
        if option == "--head-mask" and _parses(json.loads, raw):
            value = str(json.loads(raw))  # the message spells the parsed grid: [[0, 0]]
        pair = raw.split(",")
        if option == "--betas" and len(pair) == 2 and all(_parses(float, v) for v in pair):
            value = pair[0]  # a pair of numbers with one out of range: the message names that element, betas[0]
        return [f"{option}={raw}"], names, value
    if kind == "corpus":  # the text task reading a corpus that does not exist
        path = "/nonexistent-attnlab/missing-" + draw(st.text(alphabet="abc-_.", min_size=1, max_size=8))
        return (["--task", "text", "--d-vocab", "256", f"--task-option=paths={json.dumps(path)}"],
                ("neither a file nor a folder",), path)
    if kind == "flag":
        flag = draw(st.sampled_from(FLAGS))
        return [f"{flag}={draw(st.sampled_from(['yes', '1', 'x']))}"], (flag,), None
    if kind == "unknown":
        name = "--" + draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=2, max_size=10)
                           .filter(lambda s: not s.startswith("-") and "--" + s not in TRAIN_OPTIONS))
        return [name], (name.split("=")[0],), None
    which = draw(st.sampled_from(["heads", "noam", "resume", "rotary", "post"]))
    if which == "heads":
        n_heads = draw(st.integers(2, 8))
        d_model = n_heads * draw(st.integers(1, 8)) + draw(st.integers(1, n_heads - 1))
        return ["--d-model", str(d_model), "--n-heads", str(n_heads)], ("d_model=",), str(d_model)
    if which == "noam":
        return ["--schedule", "noam", "--warmup", "0"], ("warmup=",), "0"
    if which == "resume":
        return ["--resume", "--overwrite"], ("resume=True",), "overwrite"
    if which == "rotary":
        d_head = str(2 * draw(st.integers(0, 16)) + 1)
        return ["--positional-embedding-type", "rotary", "--d-head", d_head], ("d_head=",), d_head
    return ["--norm-placement", "post", "--normalization-type", "none"], ("norm_placement=",), "post"


_IDS = itertools.count()


@fuzz_settings(180)
# a key the CLI strips, of a character that repr escapes: the message names it as ['\ud7fc']
@example((["--task-option= \ud7fc=1"], ("--task-option", "task=", "task", "key=value"), " \ud7fc"))
@given(bad_train_args())
def test_train_refuses_bad_options_and_writes_nothing(tmp_path_factory, case):
    extra, names, value = case
    base = tmp_path_factory.getbasetemp() / "fuzz-cli-train"
    base.mkdir(exist_ok=True)
    out = base / f"run{next(_IDS)}"
    result = invoke(["train", "--out", str(out), *BASE, *extra])
    cli_error(result, *names, **({} if value is None else {"value": value}))
    assert not out.exists(), "refused before any work: --out must not be created"


# --- commands that read a run ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real (tiny) trained run, so a refusal is about the bad option, not a missing run."""
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("fuzz-cli-run") / "run"
    train(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=16, n_ctx=16, attn_only=True),
          TrainConfig(seq_len=8, batch_size=4, steps=2, warmup=0, eval_every=1, device="cpu"), path, progress=False)
    return path


def comma_ints_bad(minimum: int):
    """Values of a comma-separated integer option that must be refused."""
    return st.one_of(
        st.sampled_from(["", ",", " , ", "a", "1,a", "1.5", "1;2"]),
        st.lists(st.integers(-10**6, minimum - 1), min_size=1, max_size=3).map(lambda xs: ",".join(map(str, xs))),
        TEXT.filter(lambda s: not all(_parses(int, v) for v in s.split(",") if v.strip()) or not s.strip(", ")),
    )


def fractions_bad():
    """--prune-fraction values that must be refused: not numbers, outside (0, 1), or pruning every head."""
    return st.one_of(st.sampled_from(["", ",", "a", "0", "1", "0.5,1", "-0.25", "nan", "inf", "0.99", "0.9"]),
                     st.floats(min_value=1.0, allow_nan=False, allow_infinity=False).map(repr),
                     st.floats(max_value=0.0, allow_nan=False, allow_infinity=False).map(repr))


def _runs_here(device: str) -> bool:
    try:
        torch.zeros(1, device=torch.device(device))
    except Exception:  # any refusal: not a device this machine runs
        return False
    return True


# where check and probe run the model (reports.options.placement_options): refused before the run is loaded,
# except a kernel, which our Transformer refuses once loaded (it runs sdpa, the one value that is no change)
PLACEMENT_BAD = {"--dtype": bad_choice(DTYPE_NAMES),
                 "--device": st.one_of(TEXT, EDGE, st.just("cuda:7")).filter(lambda s: not _runs_here(s)),
                 "--attn-implementation": st.one_of(TEXT, EDGE, st.just("eager")).filter(lambda s: s != "sdpa")}
RUN_OPTIONS = {
    "check": {"--seed": bad_int(0), "--max-examples": bad_int(1), **PLACEMENT_BAD},
    "probe": {"--sequences": bad_int(1), "--top-k": bad_int(1), "--seeds": comma_ints_bad(0),
              "--tolerance": st.one_of(floats_outside(0.0, 1.0, high_ok=False), st.just("1")), **PLACEMENT_BAD},
    # heal refuses before its first healing run; the run (2 heads) must be untouched
    "heal": {"--steps": bad_int(1), "--seeds": comma_ints_bad(0), "--prune-fraction": fractions_bad(),
             "--temperature": floats_outside(0.0), "--alpha": floats_outside(0.0, 1.0, low_ok=True),
             "--lr": floats_outside(0.0)},
}
# the message names the option, or the field it sets (heal's --prune-fraction is prune_fraction=...)
FIELDS = {"--prune-fraction": "prune_fraction"}


@st.composite
def bad_run_options(draw):
    command = draw(st.sampled_from(sorted(RUN_OPTIONS)))
    option = draw(st.sampled_from(sorted(RUN_OPTIONS[command])))
    raw = draw(RUN_OPTIONS[command][option])
    return command, option, raw


@fuzz_settings(120)
@given(bad_run_options())
def test_check_and_probe_refuse_bad_options_and_write_nothing(run_dir, case):
    command, option, raw = case
    before = snapshot(run_dir)
    # the fuzz run has 2 heads: heal's default fractions include 0.75, which would prune both
    fit = ["--prune-fraction", "0.5"] if command == "heal" and option != "--prune-fraction" else []
    result = invoke([command, str(run_dir), *fit, f"{option}={raw}", "--no-progress"])
    field = FIELDS.get(option, option.lstrip("-").replace("-", "_"))
    value = as_named(raw) if option == "--seeds" else None if option == "--prune-fraction" else raw
    cli_error(result, option, f"{field}=", **({} if value is None else {"value": value}))
    assert snapshot(run_dir) == before


@st.composite
def bad_saturation_args(draw):
    option = draw(st.sampled_from(["--d-heads", "--seeds", "one"]))
    if option == "one":  # one distinct width: no slope to fit
        d = draw(st.integers(1, 64))
        raw = ",".join([str(d)] * draw(st.integers(1, 3)))
        return ["--d-heads", raw], ("d_heads=",), "two distinct"
    raw = draw(comma_ints_bad(1 if option == "--d-heads" else 0))
    return [f"{option}={raw}"], (option, option.lstrip("-").replace("-", "_") + "="), as_named(raw)


def as_named(raw: str):
    """How a message names a comma-separated value: the parsed tuple once it parses, else the raw text."""
    parts = [v for v in raw.split(",") if v.strip()]
    return tuple(int(v) for v in parts) if parts and all(_parses(int, v) for v in parts) else raw


@fuzz_settings(40)
@given(bad_saturation_args())
def test_saturation_refuses_bad_options_and_writes_nothing(tmp_path_factory, case):
    extra, names, value = case
    out = tmp_path_factory.getbasetemp() / f"fuzz-sat{next(_IDS)}"
    cli_error(invoke(["saturation", "--out", str(out), *extra, "--no-progress"]), *names, value=value)
    assert not out.exists()


# --- paths: missing, a file, no run, a damaged run ---------------------------------------------------------
@pytest.fixture(scope="module")
def path_cases(tmp_path_factory, run_dir):
    base = tmp_path_factory.mktemp("fuzz-cli-paths")
    (base / "a-file").write_text("not a run")
    (base / "empty").mkdir()
    dir_config = base / "config-is-a-folder"
    (dir_config / "checkpoint" / "config.json").mkdir(parents=True)
    bad_json = base / "bad-json"
    (bad_json / "checkpoint").mkdir(parents=True)
    (bad_json / "checkpoint" / "config.json").write_text(json.dumps({"model": {"d_model": "x"}}))
    return base


@fuzz_settings(50)
@given(command=st.sampled_from(["check", "probe", "report"]),
       where=st.one_of(st.sampled_from(["a-file", "empty", "config-is-a-folder", "bad-json"]),
                       st.text(alphabet="abcxyz-_. ", min_size=1, max_size=10).map(lambda s: "missing-" + s)))
def test_run_commands_refuse_bad_paths_and_write_nothing(path_cases, command, where):
    before = snapshot(path_cases)
    path = path_cases / where
    expected = {"a-file": ("is a file", "a-file"), "empty": ("config.json",),
                "config-is-a-folder": ("config.json",), "bad-json": ("config.json",)}.get(where, ("does not exist",))
    err = cli_error(invoke([command, str(path)]), *expected)
    assert " ".join(str(path).split()) in err  # the path is named (the one-line message folds whitespace runs)
    assert snapshot(path_cases) == before


@fuzz_settings(30)
@given(st.sampled_from(["a-file", "a-file/sub", "a-file/sub/run"]), st.sampled_from(["train", "demo"]))
def test_train_out_under_a_file_is_refused(path_cases, where, command):
    before = snapshot(path_cases)
    err = cli_error(invoke([command, "--out", str(path_cases / where), *BASE]), "a-file")
    assert "file" in err.lower() or "directory" in err.lower()
    assert snapshot(path_cases) == before


def test_every_option_of_train_is_fuzzed():
    """A new option added to the CLI must get a bad-value strategy here (or be a flag)."""
    command = cli.commands["train"]
    options = {opt for p in command.params for opt in p.opts if opt.startswith("--")}
    covered = set(OPTIONS) | set(FLAGS) | {"--out", "--help", "--progress", "--no-progress"}
    flags = {opt for p in command.params if getattr(p, "is_flag", False) for opt in p.opts + p.secondary_opts}
    assert options - covered - flags == set(), options - covered - flags


# --- export: a file where the folder goes ---------------------------------------------------------------
@fuzz_settings(20)
@given(st.sampled_from(["a-file", "a-file/sub", "a-file/sub/hf"]))
def test_export_out_under_a_file_is_refused(path_cases, run_dir, where):
    before, run_before = snapshot(path_cases), snapshot(run_dir)
    err = cli_error(invoke(["export", str(run_dir), "--out", str(path_cases / where)]), "a-file")
    assert "file" in err.lower() or "directory" in err.lower()
    assert snapshot(path_cases) == before and snapshot(run_dir) == run_before


# --- a bug of ours is not bad input: traceback, exit 1, how to report it -------------------------------------
# command line -> (the module holding the function it calls, that function's name there)
STAGE_CALLS = {
    "train": (["train", "--out", "{tmp}/run", *BASE], "reports.pipeline", "train"),
    "check": (["check", "{run}", "--no-progress"], "reports.pipeline", "check"),
    "probe": (["probe", "{run}", "--no-progress"], "reports.pipeline", "probe"),
    "saturation": (["saturation", "--out", "{tmp}/sat", "--no-progress"], "reports.pipeline", "saturation"),
    "report": (["report", "{run}"], "reports.pipeline", "report"),
    "export": (["export", "{run}", "--out", "{tmp}/hf"], "reports.pipeline", "export"),
    "heal": (["heal", "{run}", "--no-progress"], "reports.cli", "run_heal"),
    "demo": (["demo", "--out", "{tmp}/demo", *BASE], "reports.pipeline", "demo"),
}
BUGS = {"TypeError": TypeError, "KeyError": KeyError, "ValueError": ValueError, "AttributeError": AttributeError,
        "IndexError": IndexError}


@fuzz_settings(40)
@given(command=st.sampled_from(sorted(STAGE_CALLS)), bug=st.sampled_from(sorted(BUGS)),
       detail=st.text(alphabet="abcxyz _'=0123", min_size=1, max_size=12))
def test_an_internal_bug_is_a_traceback_and_exit_1_not_bad_input(run_dir, tmp_path_factory, command, bug, detail):
    args, module, name = STAGE_CALLS[command]
    tmp = tmp_path_factory.getbasetemp() / f"fuzz-bug{next(_IDS)}"
    args = [a.format(tmp=tmp, run=run_dir) for a in args]

    def broken(*_args, **_kwargs):
        raise BUGS[bug](detail)  # a plain built-in exception from inside a stage: never the user's fault

    before = snapshot(run_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(f"{module}.{name}", broken)
        result = invoke(args)
    err = result.stderr.strip()
    assert result.exit_code == 1, (command, bug, result.exit_code, err)
    assert "Traceback (most recent call last)" in err and "in broken\n    raise BUGS[bug](detail)" in err, err
    last = err.splitlines()[-1]
    assert last.startswith(f"attnlab: internal error: {bug}: ") and "this is a bug in attnlab" in last, last
    assert "please report it" in last, last
    assert snapshot(run_dir) == before


def test_bad_input_and_a_bug_with_the_same_message_end_differently(run_dir, monkeypatch):
    """The exit code follows the exception's class, not its wording: AttnlabError is the user's, ValueError ours."""
    def raising(exc):
        def stage(*_args, **_kwargs):
            raise exc("max_examples=0 is invalid: expected an integer >= 1")
        return stage

    monkeypatch.setattr("reports.pipeline.check", raising(AttnlabError))
    cli_error(invoke(["check", str(run_dir)]), "max_examples=0")
    monkeypatch.setattr("reports.pipeline.check", raising(ValueError))
    result = invoke(["check", str(run_dir)])
    assert result.exit_code == 1 and "Traceback" in result.stderr, result.stderr


@fuzz_settings(30)
@given(command=st.sampled_from(["train", "saturation", "demo", "export", "heal", "check-hf"]),
       blank=st.sampled_from(["", " ", "\t", "  \n"]))
def test_an_empty_out_is_refused_not_read_as_the_current_folder(run_dir, tmp_path_factory, command, blank):
    cwd = tmp_path_factory.getbasetemp() / f"fuzz-cwd{next(_IDS)}"
    cwd.mkdir()
    args = {"train": ["train", "--out", blank, *BASE], "saturation": ["saturation", "--out", blank],
            "demo": ["demo", "--out", blank, *BASE], "export": ["export", str(run_dir), "--out", blank],
            "heal": ["heal", str(run_dir), "--out", blank],
            "check-hf": ["check", "--hf", str(run_dir), "--out", blank]}[command]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        cli_error(invoke(args), "--out", "is empty")
    assert snapshot(cwd) == {"./": ""}
