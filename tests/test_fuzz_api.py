"""Fuzzed bad input through the public API (configs, train, tasks, config JSON, run directories): every
case must raise ValueError/TypeError naming the value (forward, generate and probes: test_fuzz_model.py).

Each strategy draws only values that are invalid by construction (out of range, wrong type, or a
contradiction between fields), so a call that does not raise is a bug. Cases are counted by
:mod:`tests.helpers.fuzz` and the total is printed at the end of the session. Errors are raised
before any work (no forward pass, no file written): they cost microseconds, so the ``ci`` budget
below (several hundred cases) runs in a few seconds.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import ModelConfig, TrainConfig, load_run, train
from harness.model.config import ACT_FNS, ATTENTION_DIRS, DTYPES, MAX_SEED, NORM_PLACEMENTS, POSITIONAL_TYPES
from harness.training.config import DEVICES, OPTIMIZERS, SCHEDULES
from harness.training.tasks import TASKS, make_task
from tests.helpers.fuzz import (
    NAN,
    api_error,
    bad_choice,
    bad_float,
    bad_int,
    fuzz_settings,
    install_summary,
    not_bool,
    not_int,
    snapshot,
)


@pytest.fixture(autouse=True, scope="module")
def _summary(request):
    install_summary(request.config)


MODEL_BAD = {
    **{name: bad_int(1) for name in ("n_layers", "d_model", "n_heads", "d_vocab", "n_ctx")},
    "d_head": bad_int(1, none_ok=True),
    "d_mlp": bad_int(1, none_ok=True),
    "act_fn": bad_choice(ACT_FNS),
    "normalization_type": bad_choice(("LN", "RMS"), none_ok=True),
    "norm_placement": bad_choice(NORM_PLACEMENTS),
    "positional_embedding_type": bad_choice(POSITIONAL_TYPES),
    "attention_dir": bad_choice(ATTENTION_DIRS),
    "dtype": bad_choice(DTYPES),
    **{name: not_bool() for name in ("gated_mlp", "attn_only", "use_attn_scale", "use_attn_result",
                                     "tie_embeddings", "attn_bias", "mlp_bias")},
    "rotary_base": bad_float(1.0),
    "eps": bad_float(0.0, 1.0),
    "init_range": bad_float(0.0),
    "seed": st.one_of(bad_int(0), st.integers(min_value=MAX_SEED + 1)),
    "n_key_value_heads": st.one_of(bad_int(1, none_ok=True), st.sampled_from([3, 5, 6, 7, 8, 12])),  # n_heads=4
}

TRAIN_BAD = {
    "seq_len": bad_int(2, none_ok=True),
    **{name: bad_int(1) for name in ("batch_size", "steps", "eval_every", "eval_batches", "log_every")},
    "warmup": bad_int(0),
    "seed": st.one_of(bad_int(0), st.integers(min_value=MAX_SEED + 1)),
    "checkpoint_every": bad_int(1, none_ok=True),
    "lr": bad_float(0.0),
    "optimizer": bad_choice(OPTIMIZERS),
    "schedule": bad_choice(SCHEDULES),
    "device": bad_choice(DEVICES),
    "min_lr_ratio": bad_float(0.0, 1.0, low_inclusive=True),
    "weight_decay": bad_float(0.0, low_inclusive=True),
    "momentum": st.one_of(bad_float(0.0, low_inclusive=True), st.floats(min_value=1.0, allow_nan=False)),
    "label_smoothing": st.one_of(bad_float(0.0, low_inclusive=True), st.floats(min_value=1.0, allow_nan=False)),
    "grad_clip": bad_float(0.0, none_ok=True),
    "compile": not_bool(),
    "amp": not_bool(),
}


@fuzz_settings(150)
@given(st.data())
def test_model_config_refuses_every_bad_field(data):
    name = data.draw(st.sampled_from(sorted(MODEL_BAD)), label="field")
    value = data.draw(MODEL_BAD[name], label="value")
    api_error(lambda: ModelConfig(**{name: value}), f"{name}=", value=value)


@st.composite
def model_contradictions(draw):
    """Fields valid one by one that contradict each other: (kwargs, the field named, its value)."""
    kind = draw(st.sampled_from(["heads", "rotary", "sinusoidal", "post_norm", "kv_heads"]))
    if kind == "heads":  # d_head defaults to d_model / n_heads, which must divide
        n_heads = draw(st.integers(2, 16))
        d_model = n_heads * draw(st.integers(1, 8)) + draw(st.integers(1, n_heads - 1))
        return {"d_model": d_model, "n_heads": n_heads}, "d_model=", d_model
    if kind == "rotary":  # RoPE rotates pairs of dimensions
        d_head = 2 * draw(st.integers(0, 32)) + 1
        return {"positional_embedding_type": "rotary", "d_head": d_head}, "d_head=", d_head
    if kind == "sinusoidal":  # sin/cos pairs
        d_model = 2 * draw(st.integers(0, 64)) + 1
        return {"positional_embedding_type": "sinusoidal", "d_model": d_model, "n_heads": 1}, "d_model=", d_model
    if kind == "post_norm":
        return {"norm_placement": "post", "normalization_type": None}, "norm_placement=", "post"
    n_heads = draw(st.integers(2, 16))
    kv = draw(st.integers(1, 40).filter(lambda k: n_heads % k != 0))
    return {"n_heads": n_heads, "d_model": 8 * n_heads, "n_key_value_heads": kv}, "n_key_value_heads=", kv


@fuzz_settings(40)
@given(model_contradictions())
def test_model_config_refuses_contradictions(case):
    kwargs, name, value = case
    api_error(lambda: ModelConfig(**kwargs), name, value=value)


@st.composite
def bad_betas(draw):
    kind = draw(st.sampled_from(["shape", "element"]))
    if kind == "shape":
        value = draw(st.one_of(st.tuples(), st.tuples(st.floats(0, 0.9)), st.tuples(*[st.floats(0, 0.9)] * 3),
                               st.text(max_size=4), st.none(), st.integers(), st.floats(0, 0.9)))
        return value, value
    bad = draw(st.one_of(st.floats(min_value=1.0, allow_nan=False), st.floats(max_value=0.0, exclude_max=True),
                         st.just(NAN), st.booleans(), st.text(max_size=3), st.none()))
    i = draw(st.integers(0, 1))
    pair = [0.9, 0.99]
    pair[i] = bad
    return tuple(pair), bad


@fuzz_settings(150)
@given(st.data())
def test_train_config_refuses_every_bad_field(data):
    name = data.draw(st.sampled_from(sorted(TRAIN_BAD) + ["betas", "task", "task_options"]), label="field")
    if name == "betas":
        value, named = data.draw(bad_betas(), label="betas")
        api_error(lambda: TrainConfig(betas=value), "betas", value=named)
    elif name == "task":
        value = data.draw(bad_choice(tuple(TASKS)), label="task")
        api_error(lambda: TrainConfig(task=value, task_options={}), "task", value=value)
    elif name == "task_options":
        value = data.draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=3), st.integers(),
                                    st.dictionaries(st.text(max_size=6).filter(lambda k: k not in ("min_prefix",
                                                                                                   "distinct")),
                                                    st.integers(), min_size=1, max_size=2)), label="options")
        named = sorted(value)[0] if isinstance(value, dict) else value
        api_error(lambda: TrainConfig(task="induction", task_options=value), "task", value=named)
    else:
        value = data.draw(TRAIN_BAD[name], label="value")
        api_error(lambda: TrainConfig(**{name: value}), f"{name}=", value=value)


def test_noam_without_warmup_is_a_contradiction():
    api_error(lambda: TrainConfig(schedule="noam", warmup=0), "warmup=", value=0)


# --- train(): arguments and contradictions with the model, nothing written --------------------------
TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=16, n_ctx=16)
TINY_TRAIN = TrainConfig(seq_len=8, batch_size=4, steps=3, warmup=0, device="cpu", task_options={"min_prefix": 2})
_RUN_IDS = itertools.count()


@st.composite
def bad_train_calls(draw):
    """(kwargs for train(), names that must appear, value that must appear, error types)."""
    kind = draw(st.sampled_from(["model", "cfg", "run_dir", "flag", "contradict", "stop_after", "progress",
                                 "seq_len", "vocab", "option", "resume_missing"]))
    if kind == "model":
        value = draw(st.one_of(st.text(max_size=4), st.integers(), st.none(), st.just(TINY.to_dict())))
        return {"model_or_cfg": value}, ("ModelConfig",), type(value).__name__, (TypeError,)
    if kind == "cfg":
        value = draw(st.one_of(st.just(TINY_TRAIN.to_dict()), st.none(), st.text(max_size=3), st.just(TINY)))
        return {"train_cfg": value}, ("train_cfg",), type(value).__name__, (TypeError,)
    if kind == "run_dir":
        value = draw(st.one_of(st.integers(), st.none(), st.just([b"x"]), st.floats(allow_nan=False)))
        return {"run_dir": value}, ("run_dir",), type(value).__name__, (TypeError,)
    if kind == "flag":
        name = draw(st.sampled_from(["resume", "overwrite"]))
        value = draw(not_bool())
        return {name: value}, (f"{name}=",), value, (ValueError,)
    if kind == "contradict":
        return {"resume": True, "overwrite": True}, ("resume=True", "overwrite=True"), "contradict", (ValueError,)
    if kind == "stop_after":
        value = draw(st.one_of(st.integers(max_value=0), st.integers(min_value=TINY_TRAIN.steps + 1), not_bool()
                               .filter(lambda v: v is not None)))
        return {"stop_after": value}, ("stop_after=",), value, (ValueError,)
    if kind == "progress":
        value = draw(not_bool().filter(lambda v: v is not None))
        return {"progress": value}, ("progress=",), value, (ValueError,)
    if kind == "seq_len":  # longer than the learned position table
        seq_len = draw(st.integers(TINY.n_ctx + 1, 4 * TINY.n_ctx))
        return ({"train_cfg": TINY_TRAIN.replace(seq_len=seq_len, task_options={})}, ("seq_len=",), seq_len,
                (ValueError,))
    if kind == "vocab":  # the induction prefix (up to seq_len // 2 = 4 distinct tokens) needs more ids than exist
        d_vocab = draw(st.integers(1, 3))
        return ({"model_or_cfg": TINY.replace(d_vocab=d_vocab), "train_cfg": TINY_TRAIN.replace(task_options={})},
                ("d_vocab",), d_vocab, (ValueError,))
    if kind == "option":
        task, option, value = draw(st.one_of(
            st.tuples(st.just("induction"), st.just("min_prefix"), st.one_of(st.integers(max_value=1),
                                                                             st.integers(min_value=5),
                                                                             not_int(none_ok=True))),
            st.tuples(st.just("induction"), st.just("distinct"), not_bool()),
            st.tuples(st.sampled_from(["copy", "reverse", "sort"]), st.just("n_symbols"),
                      st.one_of(st.integers(max_value=1), st.integers(min_value=16), not_int(none_ok=True))),
            st.tuples(st.just("markov"), st.just("branching"), st.one_of(st.integers(max_value=0), st.integers(17),
                                                                         not_int(none_ok=False))),
            st.tuples(st.just("modular_addition"), st.just("p"), st.one_of(st.integers(max_value=1),
                                                                          st.integers(min_value=16), not_int())),
            st.tuples(st.just("modular_addition"), st.just("train_fraction"), bad_float(0.0, 1.0)),
        ))
        seq_len = {"induction": 8, "markov": 8, "modular_addition": 4}.get(task, 9)
        options = {option: value} | ({"p": 7} if option == "train_fraction" else {})
        # Built inside the call: TrainConfig itself refuses some values (e.g. bytes are not JSON).
        return ({"train_cfg": lambda: TINY_TRAIN.replace(task=task, seq_len=seq_len, task_options=options)},
                (f"{option}=", "task_options="), value, (ValueError,))
    return {"resume": True}, ("config.json",), "missing", (FileNotFoundError,)


@fuzz_settings(80)
@given(bad_train_calls())
def test_train_refuses_bad_arguments_and_writes_nothing(tmp_path_factory, case):
    kwargs, names, value, errors = case
    base = tmp_path_factory.getbasetemp() / "fuzz-train"
    run_dir = base / f"run{next(_RUN_IDS)}"
    args = {"model_or_cfg": TINY, "train_cfg": TINY_TRAIN, "run_dir": run_dir, "progress": False} | kwargs

    def call():
        cfg = args["train_cfg"]
        return train(**args | {"train_cfg": cfg() if callable(cfg) else cfg})

    api_error(call, *names, value=value, errors=errors)
    assert not run_dir.exists(), "refused before any work: the run directory must not be created"


# --- tasks, config JSON, run directories ----------------------------------------------------------------
@st.composite
def bad_tasks(draw):
    kind = draw(st.sampled_from(["name", "seq_len", "even", "option_name", "path"]))
    if kind == "name":
        value = draw(bad_choice(tuple(TASKS)))
        return (value, 16, 16, None, {}), "task", value
    if kind == "path":  # the text task's corpus: a path that does not exist
        path = "/nonexistent-attnlab/missing-" + draw(st.text(alphabet="abc-_.", min_size=1, max_size=8))
        paths = draw(st.sampled_from([path, [path], [path, "/nonexistent-attnlab"]]))
        return ("text", 256, 256, 8, {"paths": paths}), "neither a file nor a folder", path
    if kind == "seq_len":
        value = draw(st.one_of(st.integers(max_value=1), st.integers(17, 1000),
                               not_int().filter(lambda v: v is not None)))
        return ("induction", 16, 16, value, {}), "seq_len=", value
    if kind == "even":  # input, separator, answer: an odd length
        value = 2 * draw(st.integers(1, 8))
        return (draw(st.sampled_from(["copy", "reverse", "sort"])), 16, 16, value, {}), "seq_len=", value
    key = draw(st.text(min_size=1, max_size=6).filter(lambda k: k not in ("min_prefix", "distinct")))
    return ("induction", 16, 16, 8, {key: 1}), "option", key


@fuzz_settings(50)
@given(bad_tasks())
def test_make_task_refuses_bad_tasks(case):
    args, name, value = case
    errors = (FileNotFoundError,) if args[0] == "text" else (ValueError, TypeError)
    api_error(lambda: make_task(*args), name, value=value, errors=errors)


@st.composite
def bad_config_dicts(draw):
    cls = draw(st.sampled_from([ModelConfig, TrainConfig]))
    kind = draw(st.sampled_from(["unknown", "type", "json"]))
    if kind == "unknown":
        key = draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in cls.__dataclass_fields__))
        return lambda: cls.from_dict({key: 1}), "unknown field", key
    if kind == "type":
        value = draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=3), st.integers(), st.none()))
        return lambda: cls.from_dict(value), "from_dict", type(value).__name__
    text = "{" + draw(st.text(max_size=8))  # starts like JSON, so it is parsed as text, not a path
    text = text if not text.rstrip().endswith("}") else text + ","
    return lambda: cls.from_json(text), "invalid JSON", "JSON"


@fuzz_settings(40)
@given(bad_config_dicts())
def test_config_dicts_and_json_refused(case):
    call, name, value = case
    api_error(call, name, value=value)


@fuzz_settings(40)
@given(st.one_of(st.integers(), st.none(), st.just([b"run"]), st.floats(allow_nan=False), st.just({"a": 1}),
                 st.text(alphabet="abcxyz_-.", min_size=1, max_size=12).map(lambda s: "missing-" + s)))
def test_load_run_refuses_bad_paths(tmp_path_factory, value):
    base = tmp_path_factory.getbasetemp() / "fuzz-load"
    base.mkdir(exist_ok=True)
    before = snapshot(base)
    if isinstance(value, str):  # a path that does not exist (the base folder holds nothing)
        path = base / value
        api_error(lambda: load_run(path), "does not exist", value=str(path), errors=(FileNotFoundError,))
    else:
        api_error(lambda: load_run(value), "run_dir", value=type(value).__name__, errors=(TypeError,))
    assert snapshot(base) == before
