"""Fuzzed bad input to the model and the probes: forward, generate, and every probe option.

Each case must raise ValueError/TypeError naming the value, before any work: a probe's options
are checked before its first forward pass (a hook counts the passes). Cases are counted by
:mod:`tests.helpers.fuzz`; strategies draw only values invalid by construction.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import probes
from harness import ModelConfig, Transformer
from tests.helpers.fuzz import (
    NAN,
    api_error,
    bad_choice,
    bad_float,
    fuzz_settings,
    install_summary,
    not_bool,
    not_int,
    not_number,
)

TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=16, n_ctx=16)


@pytest.fixture(autouse=True, scope="module")
def _summary(request):
    install_summary(request.config)


# --- the forward pass --------------------------------------------------------------------------------
MODEL = Transformer(TINY.replace(n_ctx=8))  # learned positions: a table of 8 rows
V, CTX = MODEL.config.d_vocab, MODEL.config.n_ctx


def int_tensors(shape, low: int = 0, high: int = V):
    return st.lists(st.integers(low, high - 1), min_size=math.prod(shape), max_size=math.prod(shape)).map(
        lambda xs: torch.tensor(xs, dtype=torch.long).reshape(shape))


shapes_2d = st.tuples(st.integers(1, 3), st.integers(1, CTX))


@st.composite
def bad_forward_calls(draw):
    """(tokens, kwargs, names, value): each violates one rule of forward()."""
    kind = draw(st.sampled_from(["type", "dtype", "rank", "empty", "negative", "too_big", "mask_type",
                                 "mask_shape", "mask_dtype", "mask_values", "offset", "past_table", "too_long",
                                 "layer"]))
    shape = draw(shapes_2d)
    good = draw(int_tensors(shape))
    if kind == "type":
        value = draw(st.one_of(st.lists(st.integers(0, V - 1), max_size=4), st.integers(), st.none(), st.text()))
        return value, {}, ("tokens",), type(value).__name__
    if kind == "dtype":
        dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.float64, torch.bool, torch.complex64]))
        return good.to(dtype), {}, ("dtype",), str(dtype)
    if kind == "rank":
        t = draw(st.sampled_from([good.flatten(), good[None], good[..., None], good[0, 0]]))
        return t, {}, ("shape",), tuple(t.shape)
    if kind == "empty":
        t = draw(st.sampled_from([good[:0], good[:, :0]]))
        return t, {}, ("shape",), tuple(t.shape)
    if kind in ("negative", "too_big"):
        bad = draw(st.integers(-10**6, -1) if kind == "negative" else st.integers(V, 10**6))
        i, j = draw(st.integers(0, shape[0] - 1)), draw(st.integers(0, shape[1] - 1))
        t = good.clone()
        t[i, j] = bad
        named = int(t.min()) if int(t.min()) < 0 else int(t.max())
        return t, {}, ("out of range",), named
    if kind == "mask_type":
        value = draw(st.one_of(st.lists(st.integers(0, 1), max_size=4), st.integers(), st.text(max_size=2)))
        return good, {"attention_mask": value}, ("attention_mask",), type(value).__name__
    if kind == "mask_shape":
        mshape = draw(st.one_of(st.tuples(st.integers(0, 4), st.integers(0, 10)), st.tuples(st.integers(1, 4)),
                                st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))).filter(
            lambda s: s != shape))
        return good, {"attention_mask": torch.ones(mshape, dtype=torch.long)}, ("attention_mask",), mshape
    if kind == "mask_dtype":
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.complex64]))
        return good, {"attention_mask": torch.ones(shape, dtype=dtype)}, ("attention_mask",), str(dtype)
    if kind == "mask_values":
        mask = torch.ones(shape, dtype=torch.long)
        mask[draw(st.integers(0, shape[0] - 1)), draw(st.integers(0, shape[1] - 1))] = draw(
            st.one_of(st.integers(-2**62, -1), st.integers(2, 2**62)))
        return good, {"attention_mask": mask}, ("attention_mask", "0 and 1"), "0 and 1"
    if kind == "offset":
        value = draw(st.one_of(st.integers(max_value=-1), not_int()))
        return good, {"position_offset": value}, ("position_offset=",), value
    if kind == "past_table":  # the last position lands at or past n_ctx rows of the learned table
        offset = draw(st.integers(CTX - shape[1] + 1, 10 * CTX))
        return good, {"position_offset": offset}, ("n_ctx",), offset
    if kind == "too_long":
        t = draw(int_tensors((1, draw(st.integers(CTX + 1, 3 * CTX)))))
        return t, {}, ("n_ctx",), CTX
    name = draw(st.sampled_from(["start_at_layer", "stop_at_layer"]))
    value = draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=MODEL.config.n_layers + 1),
                           not_int().filter(lambda v: v is not None)))
    return good, {name: value}, (f"{name}=",), value


@fuzz_settings(120)
@given(bad_forward_calls())
def test_forward_refuses_bad_input(case):
    tokens, kwargs, names, value = case
    api_error(lambda: MODEL(tokens, **kwargs), *names, value=value)


@st.composite
def bad_generate_calls(draw):
    tokens = draw(int_tensors((1, 2)))
    kind = draw(st.sampled_from(["max_new_tokens", "temperature", "top_k", "past_table", "bidirectional"]))
    if kind == "max_new_tokens":
        value = draw(st.one_of(st.integers(max_value=-1), not_int()))
        return MODEL, tokens, {"max_new_tokens": value}, "max_new_tokens=", value
    if kind == "temperature":
        value = draw(st.one_of(st.floats(max_value=0.0, exclude_max=True), st.just(NAN), not_number()))
        return MODEL, tokens, {"max_new_tokens": 1, "temperature": value}, "temperature=", value
    if kind == "top_k":
        value = draw(st.one_of(st.integers(max_value=0), st.integers(min_value=V + 1),
                               not_int().filter(lambda v: v is not None)))
        return MODEL, tokens, {"max_new_tokens": 1, "top_k": value}, "top_k=", value
    if kind == "past_table":
        n = draw(st.integers(CTX, 5 * CTX))
        return MODEL, tokens, {"max_new_tokens": n}, "n_ctx", n
    return BIDIRECTIONAL, tokens, {"max_new_tokens": draw(st.integers(0, 3))}, "attention_dir=", "bidirectional"


BIDIRECTIONAL = Transformer(TINY.replace(attention_dir="bidirectional"))


@fuzz_settings(50)
@given(bad_generate_calls())
def test_generate_refuses_bad_arguments(case):
    model, tokens, kwargs, name, value = case
    api_error(lambda: model.generate(tokens, **kwargs), name, value=value)


# --- probes: options out of range ---------------------------------------------------------------------
PROBE_TOKENS = torch.randint(0, V, (3, 6), generator=torch.Generator().manual_seed(0))


@st.composite
def bad_probe_calls(draw):
    """(probe function, kwargs, names, value)."""
    kind = draw(st.sampled_from(["method", "batch_size", "normalize", "order", "fractions", "seeds", "reestimate",
                                 "tolerance", "metric", "threshold", "loss_mask", "no_target", "model", "tokens"]))
    if kind == "method":
        fn = draw(st.sampled_from([probes.head_importance, probes.prune_curve, probes.redundancy]))
        value = draw(bad_choice(("ablation", "mean_ablation", "gradient")))
        return fn, {"method": value}, ("method=",), value
    if kind == "batch_size":
        fn = draw(st.sampled_from([probes.head_importance, probes.prune_curve, probes.redundancy,
                                   probes.head_similarity, probes.head_roles, probes.attention_entropy]))
        value = draw(st.one_of(st.integers(max_value=0), not_int().filter(lambda v: v is not None)))
        return fn, {"batch_size": value}, ("batch_size=",), value
    if kind in ("normalize", "reestimate"):
        fn = probes.head_importance if kind == "normalize" else draw(st.sampled_from([probes.prune_curve,
                                                                                     probes.redundancy]))
        value = draw(not_bool())
        return fn, {kind: value}, (f"{kind}=",), value
    if kind == "order":
        value = draw(st.one_of(bad_choice(("importance", "random")), st.just(()), st.just([]),
                               st.lists(bad_choice(("importance", "random")), min_size=1, max_size=2)))
        named = value[0] if isinstance(value, (list, tuple)) and value else value
        return probes.prune_curve, {"order": value}, ("order=",), named
    if kind == "fractions":
        bad = draw(st.one_of(st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0, exclude_min=True),
                             st.just(NAN), st.booleans(), st.text(max_size=2).filter(lambda s: len(s) != 1)))
        value = draw(st.sampled_from([[0.0, bad], [bad]])) if not isinstance(bad, str) else bad
        return probes.prune_curve, {"fractions": value}, ("fraction",), bad if not isinstance(bad, str) else value
    if kind == "seeds":
        fn = draw(st.sampled_from([probes.redundancy, probes.prune_curve]))
        value = draw(st.one_of(st.just(()), st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
                               st.text(max_size=3), st.integers(), st.lists(st.booleans(), min_size=1, max_size=2)))
        extra = {"order": "random"} if fn is probes.prune_curve else {}
        return fn, {"seeds": value, **extra}, ("seeds=",), tuple(value) if isinstance(value, list) else value
    if kind == "tolerance":
        value = draw(bad_float(0.0, 1.0).filter(lambda v: not (isinstance(v, float) and v == 1.0))
                     .map(lambda v: 1.0 + abs(v) if isinstance(v, float) and 0 < v < 1 else v))
        return probes.redundancy, {"tolerance": value}, ("tolerance=",), value
    if kind == "metric":
        value = draw(bad_choice(("pattern", "output")))
        return probes.head_similarity, {"metric": value}, ("metric=",), value
    if kind == "threshold":
        value = draw(bad_float(0.0, 1.0))
        return probes.attention_entropy, {"threshold": value}, ("threshold=",), value
    if kind == "loss_mask":
        fn = draw(st.sampled_from([probes.head_importance, probes.prune_curve, probes.redundancy]))
        mask = draw(st.sampled_from([torch.ones(3, 5), torch.ones(3, 6, dtype=torch.float32), torch.ones(6),
                                     torch.full((3, 6), 2)]))
        return fn, {"loss_mask": mask}, ("loss_mask",), "loss_mask"
    if kind == "no_target":  # a mask that selects nothing to predict: every loss would be 0/0
        fn = draw(st.sampled_from([probes.head_importance, probes.prune_curve, probes.redundancy]))
        mask = torch.zeros(3, 6, dtype=torch.bool)
        mask[:, 0] = draw(st.booleans())  # column 0 is never a target
        return fn, {"loss_mask": mask}, ("loss_mask",), "no target"
    if kind == "model":
        fn = draw(st.sampled_from([probes.head_importance, probes.head_similarity, probes.head_roles]))
        value = draw(st.one_of(st.none(), st.just(torch.nn.Linear(2, 2)), st.text(max_size=3)))
        return fn, {"model": value}, ("model",), type(value).__name__
    fn = draw(st.sampled_from([probes.head_importance, probes.head_roles, probes.attention_entropy]))
    bad = PROBE_TOKENS.clone()
    bad[0, draw(st.integers(0, 5))] = draw(st.one_of(st.integers(-2**62, -1), st.integers(V, 2**62)))  # int64
    named = int(bad.min()) if int(bad.min()) < 0 else int(bad.max())
    return fn, {"tokens": bad}, ("out of range",), named


@fuzz_settings(120)
@given(bad_probe_calls())
def test_probes_refuse_bad_options_before_any_forward_pass(case):
    fn, kwargs, names, value = case
    model = kwargs.pop("model", MODEL)
    tokens = kwargs.pop("tokens", PROBE_TOKENS)
    calls = {"n": 0}

    def count(x, hook):
        calls["n"] += 1
        return x

    with MODEL.hooks(fwd_hooks=[(lambda name: name.endswith("hook_embed"), count)]):
        api_error(lambda: fn(model, tokens, **kwargs), *names, value=value)
    assert calls["n"] == 0, "the options must be checked before any forward pass"


