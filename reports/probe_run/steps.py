"""How each method of `attnlab probe` runs, where its result is written, and how it is read back on --resume.

The cheap rankings share one attribution pass (:func:`probes.attribution_scores`: gradient
importance, zero- and mean-ablation attribution and the head means from one forward and one
backward pass); the exact answers, the prune curves and the estimator comparison reuse what earlier
methods of the same run computed instead of computing it again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd
import torch
from torch import Tensor

import probes
from harness.run_dir import RunDir, atomic_write, atomic_write_json, read_json
from probes import _head_stats, gates
from probes._patterns import PATTERN_ELEMENTS
from probes._stacks import with_kinds
from probes._validate import ModelInfo, model_info, probe_data
from probes.compare import ESTIMATORS
from probes.importance import importance_frame
from probes.similarity import jsd_row
from reports import rundata
from reports.probe_run.plan import REDUCED_FRACTIONS, Shape, Variant

WARM_S = 2.0  # first passes shorter than this are timed again (at most 3) and the fastest is the estimate


@dataclass
class Context:
    """One probe run: the model, its data and options, and what its finished methods produced."""

    model: Any
    tokens: Tensor
    loss_mask: Optional[Tensor]
    seeds: tuple[int, ...]
    tolerance: float
    top_k: int
    layout: RunDir
    # an encoder-decoder's source keywords (source_tokens, source_mask), passed to every probe; empty: none
    source: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # seconds, forward, backward
    _attribution: Optional[probes.Attribution] = None
    _info: Optional[ModelInfo] = None

    @property
    def info(self) -> ModelInfo:
        """The probes' rows of heads: the layers, or an encoder-decoder's three stacks' (``model_info(all_heads)``)."""
        if self._info is None:
            self._info = model_info(self.model, all_heads=True)
        return self._info

    @property
    def n_heads(self) -> int:
        return int(self.info.n_layers * self.info.n_heads)

    def attribution(self) -> probes.Attribution:
        if self._attribution is None:
            self._attribution = probes.attribution_scores(self.model, self.tokens, loss_mask=self.loss_mask,
                                                          **self.source)
        return self._attribution

    def has_estimates(self) -> bool:
        """Whether :meth:`estimate` answers without a pass: the attribution pass has run, or its files are read."""
        return self._attribution is not None or \
            all(f"importance_{m}" in self.results for m in ("gradient", "attribution"))

    def scores(self, method: str) -> Tensor:
        """``[n_layers, n_heads]`` importance of a finished importance method (read back on --resume)."""
        frame = self.results[f"importance_{method}"]
        return torch.tensor(frame["importance"].to_numpy(), dtype=torch.float64).view(self.info.n_layers,
                                                                                      self.info.n_heads)

    def estimate(self, method: str) -> Tensor:
        """First-order loss change of removing each head (zero ablation for ``ablation``, mean otherwise):
        from this run's attribution pass, or from the files of the finished methods that hold it (--resume)."""
        source = "importance_gradient" if method == "ablation" else "importance_attribution"
        if source in self.results:
            frame = self.results[source]
            return torch.tensor(frame["loss_delta"].to_numpy(), dtype=torch.float64).view(self.info.n_layers,
                                                                                          self.info.n_heads)
        a = self.attribution()
        return a.zero_delta if method == "ablation" else a.mean_delta

    def gradient(self) -> Tensor:
        """The gradient importance prune orders follow (probes.prune_curve's default method)."""
        if "importance_gradient" in self.results:
            return self.scores("gradient")
        return self.attribution().gradient


def first_pass(model: Any, tokens: Tensor, loss_mask: Optional[Tensor], exact_top: int, seeds: int,
               backward: bool = True, source: Optional[dict[str, Any]] = None) -> tuple[float, Shape]:
    """Seconds of one pass of the whole data through the whole model, timed on the model itself, and its shape
    (an encoder-decoder's, given its ``source`` keywords: a "layer" of the shape is a row of heads of one stack)."""
    source = source or {}
    info = model_info(model, all_heads=True)
    data = probe_data(info, tokens, loss_mask=loss_mask, **source)
    rows = gates.rows_per_pass(None, data.pos, info.device, d_vocab=info.d_vocab)
    # the unit of a plan is one mask over the data (what the progress line and the re-plan count: a call carrying
    # k masks' rows is k of them), timed as the masked methods run it: as many masks as ride in one call, the
    # time shared among them (on a small model a call of 4 masks' rows costs ~2 single ones, not 1 or 4)
    per_call = max(1, rows // min(data.n, rows))
    ones = torch.ones(per_call, info.n_layers, info.n_heads)
    seconds: list[float] = []
    tails: list[float] = []
    # a first pass pays one-off costs (allocator, kernels' first use); where a pass is cheap, time a second
    while len(seconds) < 3 and (not seconds or sum(seconds) * per_call < WARM_S):
        with _stack_time(model) as stack:
            start = time.perf_counter()
            gates.masked_stats(model, info, data, ones)
            seconds.append((time.perf_counter() - start) / per_call)
        # with prefix reuse the pass runs the stack layer by layer (calls with a stop), then the tail alone
        tails.append(max(0.0, 1.0 - stack[0] / per_call / seconds[-1]) if info.prefix_reuse else 0.0)
    # a backward pass runs in smaller chunks (gates.grad_rows bounds its saved activations), which costs
    # more per token than the forward's: time one chunk of it rather than assume 2 forwards' worth
    # (``backward=False``: a resumed run whose attribution pass is done; the plan then assumes 1 + BACKWARD)
    grad_passes = 0.0
    if backward:
        grad_rows = min(data.n, gates.grad_rows(None, info, data.pos))
        chunk = probe_data(info, tokens[:grad_rows], loss_mask=None if loss_mask is None else loss_mask[:grad_rows],
                           **{name: t[:grad_rows] for name, t in source.items()})
        timed = []
        for _ in range(2 if grad_rows < data.n else 1):  # the first backward pays one-off costs; the run pays them once
            start = time.perf_counter()
            _head_stats.gate_gradients(model, info, chunk)
            timed.append(time.perf_counter() - start)
        grad_passes = (timed[0] + min(timed) * (math.ceil(data.n / grad_rows) - 1)) / min(seconds)
    shape = Shape(info.n_layers, info.n_heads, data.n, seeds, info.prefix_reuse, per_call, exact_top,
                  grad_passes=grad_passes, pos=data.pos, tail=tails[seconds.index(min(seconds))],
                  jsd_per_s=jsd_rate(info.n_layers * info.n_heads, data.pos))
    return min(seconds), shape


def jsd_rate(heads: int, pos: int) -> float:
    """Elements per second of probes.head_similarity's divergence step (:func:`probes.similarity.jsd_row`), timed
    on random patterns of the size one chunk of its pattern pass holds (probes._patterns.PATTERN_ELEMENTS)."""
    rows = max(1, PATTERN_ELEMENTS // (heads * pos * pos))
    n = min(heads, max(1, PATTERN_ELEMENTS // (rows * pos * pos)))
    g = torch.Generator().manual_seed(0)
    p = torch.rand(rows, n, pos, pos, generator=g).softmax(-1)
    h, w = -torch.special.xlogy(p, p).sum(-1), torch.ones(rows, pos)
    best = math.inf
    for _ in range(2):  # the first call pays the temporaries' first allocation
        start = time.perf_counter()
        jsd_row(p, h, w, 0)
        best = min(best, time.perf_counter() - start)
    return rows * n * pos * pos / max(best, 1e-9)


@contextmanager
def _stack_time(model: Any) -> Iterator[list[float]]:
    """Seconds the model spends in calls that stop at a layer (``stop_at_layer``: the stack, not its tail)."""
    spent = [0.0]
    began: list[float] = []

    def pre(module: Any, args: tuple, kwargs: dict) -> None:
        began.append(time.perf_counter() if kwargs.get("stop_at_layer") is not None else math.nan)

    def post(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        start = began.pop()
        if not math.isnan(start):
            spent[0] += time.perf_counter() - start

    with gates.call_hooks(model, pre, post):
        yield spent


def top_depth(shape: Shape, estimates: dict[str, Tensor]) -> tuple[tuple[str, float], ...]:
    """Per importance method, the mean share of the stack its top candidates' passes run (a head of layer l runs
    layers l..L-1), from the first-order estimates that choose them (:func:`_top`)."""
    out = []
    for method, estimate in estimates.items():
        layers = _top(estimate, min(shape.exact_top, shape.heads)) // shape.n_heads
        out.append((f"importance_{method}", float((shape.n_layers - layers).double().mean()) / shape.n_layers))
    return tuple(out)


def _top(estimate: Tensor, k: int) -> Tensor:
    """Flat indices of the ``k`` heads whose removal the estimate says raises the loss most."""
    return torch.argsort(estimate.flatten().cpu(), descending=True, stable=True)[:k]


def _exact_for_top(ctx: Context, method: str, estimate: Tensor, k: int) -> pd.DataFrame:
    """Exact ``method`` for the top ``k`` heads of ``estimate``; the other rows keep the estimate (exact False)."""
    frame = probes.head_importance(ctx.model, ctx.tokens, loss_mask=ctx.loss_mask, method=method,
                                   heads=_top(estimate, k), **ctx.source)
    exact = frame["loss_delta"].notna()
    guess = estimate.flatten().cpu().numpy()
    frame.loc[~exact, "importance"] = guess[~exact.to_numpy()]
    frame.loc[~exact, "loss_delta"] = guess[~exact.to_numpy()]
    frame["exact"] = exact
    return frame


def _importance(method: str) -> Callable[[Context, Variant], Any]:
    def run(ctx: Context, variant: Variant) -> pd.DataFrame:
        if method in ("gradient", "attribution"):
            a = ctx.attribution()
            imp, delta = (a.gradient, a.zero_delta) if method == "gradient" else (a.mean_delta, a.mean_delta)
            return with_kinds(importance_frame(imp, delta, method=method, normalize=False, baseline_loss=None),
                              ctx.info)
        if variant.name == "exact":
            frame = probes.head_importance(ctx.model, ctx.tokens, loss_mask=ctx.loss_mask, method=method,
                                           **ctx.source)
            frame["exact"] = True
            return frame
        return _exact_for_top(ctx, method, ctx.estimate(method), int(variant.name.split()[2]))
    return run


def _prune_curve(ctx: Context, variant: Variant) -> pd.DataFrame:
    full = variant.name == "11 points"
    return probes.prune_curve(ctx.model, ctx.tokens, loss_mask=ctx.loss_mask, order=("importance", "random"),
                              seeds=ctx.seeds if full else ctx.seeds[:1], scores=ctx.gradient(),
                              fractions=None if full else REDUCED_FRACTIONS, **ctx.source)


def _redundancy(ctx: Context, variant: Variant) -> pd.Series:
    return probes.redundancy(ctx.model, ctx.tokens, loss_mask=ctx.loss_mask, tolerance=float(ctx.tolerance),
                             seeds=ctx.seeds, scores=ctx.gradient(), per_layer=variant.name == "full", **ctx.source)


def top_patterns(model: Any, tokens: Any, importance: pd.DataFrame, k: int,
                 source: Optional[dict[str, Tensor]] = None) -> pd.DataFrame:
    """Attention patterns of the ``k`` most important heads on ``tokens[:1]``, long format; an encoder-decoder's
    (``importance`` with its ``kind`` column, ``source`` its keywords) lead with the head's ``kind``."""
    top = importance.sort_values("importance", ascending=False).head(k).reset_index(drop=True)
    info = model_info(model, all_heads=True)
    kinds = list(top["kind"]) if "kind" in top else [None] * len(top)
    rows = [info.rows_of(kind)[int(layer)] for kind, layer in zip(kinds, top["layer"], strict=True)]
    names = {info.pattern_hooks[row] for row in rows}
    one = {name: t[:1] for name, t in (source or {}).items()}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[:1], names_filter=lambda n: n in names, **one)
    frames = []
    for rank, row in top.iterrows():
        pattern = cache[info.pattern_hooks[rows[rank]]][0, int(row["head"])].float().cpu()
        q, kk = torch.meshgrid(torch.arange(pattern.shape[0]), torch.arange(pattern.shape[1]), indexing="ij")
        frame = pd.DataFrame({"layer": int(row["layer"]), "head": int(row["head"]), "rank": rank,
                              "query": q.flatten().numpy(), "key": kk.flatten().numpy(),
                              "weight": pattern.flatten().numpy()})
        if kinds[rank] is not None:
            frame.insert(0, "kind", kinds[rank])
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def example_source(source: dict[str, Tensor]) -> pd.DataFrame:
    """The first sequence's source, one row per position: what ``example_source_tokens.csv`` holds."""
    tokens = source["source_tokens"][0]
    mask = source.get("source_mask")
    real = torch.ones_like(tokens) if mask is None else mask[0]
    return pd.DataFrame({"position": range(len(tokens)), "token": tokens.tolist(), "real": real.long().tolist()})


def _patterns(ctx: Context, variant: Variant) -> pd.DataFrame:
    found = [m for m in ("ablation", "mean_ablation", "attribution", "gradient") if f"importance_{m}" in ctx.results]
    importance = ctx.results[f"importance_{found[0]}"] if found else \
        with_kinds(importance_frame(ctx.attribution().zero_delta, ctx.attribution().zero_delta), ctx.info)
    return top_patterns(ctx.model, ctx.tokens, importance, min(ctx.top_k, ctx.n_heads), ctx.source)


def _estimators(ctx: Context, variant: Variant) -> pd.DataFrame:
    """probes.compare_estimators, reusing the importances this run already has where they are exact."""
    known: dict[str, Any] = {}
    for method in ("ablation", "mean_ablation", "gradient"):
        frame = ctx.results.get(f"importance_{method}")
        if frame is not None and ("exact" not in frame or bool(frame["exact"].all())):
            known[method] = (ctx.scores(method), *ctx.costs.get(f"importance_{method}", (float("nan"),) * 3))
    if "ablation" in known:
        known["baseline_loss"] = ctx.results["importance_ablation"].attrs.get("baseline_loss")
        if known["baseline_loss"] is None:  # read back from its CSV on --resume: one pass finds it again
            known.pop("baseline_loss")
    methods = ESTIMATORS if variant.name == "with l0_gates" else tuple(m for m in ESTIMATORS if m != "l0_gates")
    return probes.compare_estimators(ctx.model, ctx.tokens, loss_mask=ctx.loss_mask, seed=ctx.seeds[0],
                                     methods=methods, known=known, **ctx.source)


RUNNERS: dict[str, Callable[[Context, Variant], Any]] = {
    **{f"importance_{m}": _importance(m) for m in ("gradient", "attribution", "ablation", "mean_ablation")},
    "prune_curve": _prune_curve,
    "redundancy": _redundancy,
    "similarity": lambda ctx, v: probes.head_similarity(ctx.model, ctx.tokens, metric="pattern", **ctx.source),
    "head_roles": lambda ctx, v: probes.head_roles(ctx.model, ctx.tokens, **ctx.source),
    "attention_entropy": lambda ctx, v: probes.attention_entropy(ctx.model, ctx.tokens, **ctx.source),
    "patterns": _patterns,
    "estimators": _estimators,
}


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def write(layout: RunDir, method: str, value: Any) -> None:
    """The method's file, written atomically (a stopped run never leaves half of one)."""
    if method == "redundancy":
        atomic_write_json(layout.redundancy_json, {k: _plain(v) for k, v in value.items()}, indent=1)
    else:
        index = method == "similarity"
        atomic_write(layout.probe_file(rundata.PROBE_FILES[method]), lambda f: value.to_csv(f, index=index))


def read(layout: RunDir, method: str) -> Any:
    """A finished method's result, read back from its file (--resume)."""
    if method == "redundancy":
        return read_json(layout.redundancy_json)
    return pd.read_csv(layout.probe_file(rundata.PROBE_FILES[method]), index_col=0 if method == "similarity" else None)


def output(layout: RunDir, method: str) -> Any:
    return layout.redundancy_json if method == "redundancy" else layout.probe_file(rundata.PROBE_FILES[method])
