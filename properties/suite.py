"""``check_model``: every model-level property, one row each, in one table."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Optional, cast

import pandas as pd
import torch
from torch import nn
from transformer_lens import HookedRootModule

from harness._checks import check_positive_int
from harness.adapters.entry import adapt, describe
from harness.adapters.function import FunctionModel
from harness.adapters.placement import placed, placement_of
from harness.adapters.protocol import AnyModel, ProtocolModel, check_protocol, observed_hooks
from harness.errors import AttnlabError, AttnlabTypeError
from properties import checks as checks  # imported for its effect: every property registers itself
from properties.budget import capping
from properties.cost import COST_COLUMNS, counting
from properties.precision import fingerprint
from properties.registry import SUITE, Check
from properties.search import check_search_args
from properties.threads import wide_linears

# Model-level properties in report order: a live view of the registry (properties/registry.py), in
# each property's ``order``. The component-level formulas (rotary_formula, sinusoidal_formula) check
# harness.model.positions rather than a model, so they are registered but are not rows here.
PROPERTIES: Mapping[str, Check] = SUITE
# the precision columns (properties/precision.py); a properties.csv written before them reads them as NaN
PRECISION_COLUMNS = ["noise_floor", "allowance", "ratio"]
COLUMNS = ["property", "applicable", "passed", "worst", "tolerance", *PRECISION_COLUMNS, "counterexample", "status",
           "reason", *COST_COLUMNS]
# columns a properties.csv written before them lacks: its readers fill them with NaN (reports/rundata.py)
ADDED_COLUMNS = [*PRECISION_COLUMNS, *COST_COLUMNS]
# Every pass of a property search is a few sequences of <= 24 tokens: too small for an op to gain from a second
# CPU thread, and on a shared machine each op's parallel region waits for a descheduled one. GPT-2 small's shape,
# causal_outputs + pattern_distribution at 8 examples, 2 cores at load 8: 291 s on 2 threads, 54 s on 1 (the same
# 25 + 25 passes; the 2-thread profile spent 47 s in 1250 layer_norm calls on [2, 8, 768] tensors). The few large
# matrix products (a large vocabulary's unembedding, the layers of a long row) run on the caller's threads
# (properties/threads.py).
THREADS = 1
# the hook points that fire on a model, while its weights are unchanged (precision.fingerprint): a caller that checks
# one property per call (reports/pipeline.py, for its progress bar) must not pay a smoke pass per property
_OBSERVED: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], set[str]]] = weakref.WeakKeyDictionary()


def _state(model: Any) -> tuple[Any, ...]:
    """What the observed hooks depend on: the weights (and buffers) and the hook points."""
    return (*fingerprint(model), *getattr(model, "hook_dict", {}))


def check_model(model: AnyModel, *, seed: int = 0, max_examples: Optional[int] = None,
                properties: Optional[list[str]] = None, cfg: Any = None, dtype: Optional[str] = None,
                device: Any = None, attn_implementation: Optional[str] = None,
                threads: Optional[int] = THREADS, budget: bool = False) -> pd.DataFrame:
    """Run the property checks on a model that follows the protocol; one row per property.

    Columns: :data:`COLUMNS` (``property, applicable, passed, worst, tolerance, noise_floor, allowance,
    ratio, counterexample, status, reason, model_passes, twin_passes, seconds``; the precision columns:
    properties/precision.py; the cost columns, what the row took: properties/cost.py).
    ``status`` is pass / fail / n/a / unobservable (a hook the property needs does not exist or
    never fires on this model: ``reason`` names it; never a failure). ``worst`` is the largest
    deviation seen, ``counterexample`` the shrunk input that broke the property ("" when it
    held); ``passed`` is None where the property does not apply or cannot be observed.
    ``seed`` makes the searches reproducible; ``max_examples`` is each search's count, run exactly;
    None (the default) runs the loaded hypothesis profile's, within a budget of forward passes per
    row that scales with the model's size (properties/budget.py: a small model runs them all, a big
    one the first few; the row's reason then says how many ran). ``properties`` selects a subset by
    name. A plain ``nn.Module`` or function ``f(tokens, attention_mask=None, position_offset=0) ->
    logits`` is checked when given with ``cfg`` (a mapping or object with the protocol's cfg fields;
    see :class:`harness.adapters.function.FunctionModel`): its output-level properties run, the
    hook-level ones are unobservable. A transformers ``PreTrainedModel`` or a TransformerLens
    ``TransformerBridge`` is put behind its adapter (:func:`harness.adapters.adapt`);
    ``frame.attrs["adapter"]`` says which ("HFAdapter(llama, attention_interface)",
    "BridgeAdapter", "FunctionModel", "protocol model"). A model that does not follow the protocol's forward/cfg
    part raises TypeError listing what is missing. ``dtype`` ("auto"/None: the model's own, "float32",
    "bfloat16", "float16", "float64"), ``device`` and ``attn_implementation`` run a copy of the model
    there (:func:`harness.adapters.placed`; the caller's model is never cast); ``frame.attrs`` records
    what ran (``dtype``, ``device``, ``attn_implementation``). ``threads``: torch's CPU threads while it
    runs (restored after; None keeps the caller's setting), default :data:`THREADS`; a linear op of at least
    :data:`properties.threads.WIDE_FLOPS` (the unembedding of a large vocabulary, a layer on a long row) runs on
    the caller's setting when that is more (properties/threads.py). ``budget``: an explicit
    ``max_examples`` is a cap that each row's pass budget may lower on a large model, as a default one is
    (properties/budget.py; `attnlab check` runs so), not an exact count.
    """
    check_search_args(seed, max_examples)
    check_positive_int("threads", threads, none_ok=True)
    if not isinstance(budget, bool):
        raise AttnlabTypeError(f"budget={budget!r} is invalid: expected True or False")
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with capping(budget), wide_linears(threads or before, before):
            return _check(model, seed=seed, max_examples=max_examples, properties=properties, cfg=cfg, dtype=dtype,
                          device=device, attn_implementation=attn_implementation)
    finally:
        torch.set_num_threads(before)


def _check(model: AnyModel, *, seed: int, max_examples: Optional[int], properties: Optional[list[str]], cfg: Any,
           dtype: Optional[str], device: Any, attn_implementation: Optional[str]) -> pd.DataFrame:
    names = list(PROPERTIES) if properties is None else list(properties)
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown or not names:
        raise AttnlabError(f"properties={properties!r} is invalid: expected names from {list(PROPERTIES)}")
    if cfg is not None:
        if isinstance(model, HookedRootModule):
            raise AttnlabError("cfg=... is for a plain nn.Module or function: this model is a HookedRootModule "
                               "and carries its own cfg")
        model = FunctionModel(model, cfg)
    else:
        model = adapt(model)  # a PreTrainedModel or TransformerBridge goes behind its adapter
    model = placed(model, dtype=dtype, device=device, attn_implementation=attn_implementation)
    known = _OBSERVED.get(model) if isinstance(model, nn.Module) else None
    fresh = known is None or known[0] != _state(model)
    check_protocol(model, hooks=False, forward=fresh)  # the smoke pass once per model, not once per call
    model = cast(ProtocolModel, model)  # check_protocol checked it
    was_training = getattr(model, "training", False)
    model.eval()  # dropout or other train-mode noise would break every equality
    try:
        if fresh:  # which hook points fire on this model: once (a run checking one property per call asks again)
            observed = observed_hooks(model)
            _OBSERVED[model] = (_state(model), observed)
        else:
            observed = set(known[1]) if known else set()
        rows = []
        for n in names:
            with counting(model) as cost:
                result = PROPERTIES[n](model, seed=seed, max_examples=max_examples, observed=observed)
            rows.append({**{c: getattr(result, c) for c in COLUMNS if c not in COST_COLUMNS},
                         **{c: getattr(cost, c) for c in COST_COLUMNS}})
    finally:
        model.train(was_training)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["passed"] = frame["passed"].astype(object)
    frame.attrs["adapter"] = describe(model)
    frame.attrs.update(placement_of(model))  # dtype, device, attn_implementation: what ran
    return frame

