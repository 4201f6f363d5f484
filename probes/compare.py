"""Importance estimators against the exact answer.

The exact importance of head h is its leave-one-out loss change: the loss with h alone removed
(``hook_z`` output zero), minus the loss of the intact model. Every cheaper estimator (mean
ablation, the gradient estimate of Michel et al. 2019, the learned L0 gates of Voita et al. 2019)
and a random order are scored against it three ways:

- rank agreement: Spearman's rho and Kendall's tau-b between the estimator's importance and the
  exact loss change (tie-aware: Spearman on average ranks, tau-b's tie correction, Kendall 1945);
- usefulness: the fraction of heads its order (least important first) prunes cumulatively before
  the loss first rises more than ``budget`` (relative) above the intact loss; every order is pruned
  the same way, by zeroing ``hook_z`` (the quantity the exact answer measures);
- cost: seconds, and forward and backward passes counted in units of the whole data through the
  whole model (a pass that starts at layer l of n counts (n - l) / n of one; prefix reuse is why
  exact ablation costs fewer than ``n_heads + 1`` passes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from harness._checks import check_number, check_seed, check_sequence
from harness.adapters.protocol import AnyModel, ProtocolModel
from harness.errors import AttnlabError
from probes import _head_stats, gates, l0_gates
from probes._validate import ModelInfo, ProbeData, check_batch_size, probe_inputs, takes_any_model
from probes.importance import importance_scores, leave_one_out
from probes.pruning import _cumulative_masks, _prunable, _random_order

ESTIMATORS = ("ablation", "mean_ablation", "gradient", "l0_gates", "random")
BUDGETS = (0.01, 0.05, 0.1)
# The one owner of probes/estimators.csv's columns: one row per (method, budget).
ESTIMATOR_COLUMNS = ("method", "spearman", "kendall", "budget", "prunable_fraction", "seconds",
                     "forward_passes", "backward_passes")


def average_ranks(x: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
    """Ranks 1..n, tied values sharing the mean of the ranks they span (float64)."""
    x = x.double()
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(1, len(x) + 1, dtype=torch.float64)
    values, inverse = torch.unique(x, return_inverse=True)
    sums = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranks))
    return (sums / counts)[inverse]


def spearman(x: Float[Tensor, " n"], y: Float[Tensor, " n"]) -> float:
    """Spearman's rho: Pearson correlation of the average ranks; NaN when either side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = float(rx.norm() * ry.norm())
    return float((rx * ry).sum()) / denom if denom > 0 else math.nan


def kendall_tau_b(x: Float[Tensor, " n"], y: Float[Tensor, " n"]) -> float:
    """Kendall's tau-b = (C - D) / sqrt((n0 - n1)(n0 - n2)) over all pairs (Kendall 1945).

    C / D: concordant / discordant pairs; n0 = n(n-1)/2; n1, n2: pairs tied in x, in y. NaN when
    either side is constant. O(n^2) pairs: a model's heads number in the hundreds at most.
    """
    x, y = x.double(), y.double()
    i, j = torch.triu_indices(len(x), len(x), offset=1)
    sx, sy = torch.sign(x[i] - x[j]), torch.sign(y[i] - y[j])
    n0 = len(i)
    n1, n2 = int((sx == 0).sum()), int((sy == 0).sum())
    denom = math.sqrt((n0 - n1) * (n0 - n2))
    return float((sx * sy).sum()) / denom if denom > 0 else math.nan


def pass_share(rows: int, kwargs: dict, n_layers: int, n_sequences: int) -> float:
    """One call of a model's forward, in passes of the whole data through the whole model: ``rows`` sequences
    through the layers its ``start_at_layer`` / ``stop_at_layer`` keywords say ran."""
    start = kwargs.get("start_at_layer") or 0
    stop = kwargs.get("stop_at_layer")
    stop = n_layers if stop is None else stop
    return rows * max(stop - start, 0) / (n_sequences * n_layers)


class PassCounter:
    """Counts forward and backward passes through a model, in units of the whole data set.

    A forward pre-hook on the model adds ``rows * layers_run / (n_sequences * n_layers)`` per call
    (``start_at_layer`` / ``stop_at_layer`` say which layers ran); a gradient hook on the logits adds
    the same share for the backward pass through them.
    """

    def __init__(self, info: ModelInfo, n_sequences: int):
        self.info, self.n = info, n_sequences
        self.forward = self.backward = 0.0

    def _share(self, rows: int, kwargs: dict) -> float:
        return pass_share(rows, kwargs, self.info.depth, self.n)  # the layers start_at_layer counts

    @contextmanager
    def counting(self, model: Any) -> Iterator[PassCounter]:
        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            share = self._share(args[0].shape[0], kwargs)
            self.forward += share
            self._last = share

        def post(module: Any, args: tuple, kwargs: dict, out: Any) -> None:
            if isinstance(out, Tensor) and out.requires_grad:
                share = self._last

                def count(grad: Tensor) -> None:
                    self.backward += share
                out.register_hook(count)

        with gates.call_hooks(model, pre, post):
            yield self


def _check_methods(methods: Any) -> tuple[str, ...]:
    items = (methods,) if isinstance(methods, str) else methods
    if not isinstance(items, (tuple, list)) or not items or \
            any(not isinstance(m, str) or m not in ESTIMATORS for m in items):
        raise AttnlabError(f"methods={methods!r} is invalid: expected a non-empty sequence of {list(ESTIMATORS)}")
    return tuple(dict.fromkeys(items))


def _check_budgets(budgets: Any) -> tuple[float, ...]:
    values = check_sequence("budgets", budgets, "a non-empty sequence of relative loss rises > 0")
    for b in values:
        check_number("budget", b, 0.0, expected="a finite relative loss rise > 0 (0.01 = 1%)")
    return tuple(dict.fromkeys(float(b) for b in values))


def _scores(model: ProtocolModel, info: ModelInfo, data: ProbeData, method: str, seed: int, l0: l0_gates.L0Options,
            batch_size: Optional[int]) -> Tensor:
    """Importance ``[n_layers, n_heads]`` (larger = more important) by one estimator other than ablation."""
    if method == "random":  # the head pruned first is the least important
        perm = _random_order(seed, info.n_layers * info.n_heads)
        scores = torch.empty(len(perm), dtype=torch.float64)
        scores[perm] = torch.arange(len(perm), dtype=torch.float64)
        return scores.view(info.n_layers, info.n_heads)
    means = _head_stats.ablation_means(model, info, data, method, batch_size=batch_size)
    scores, _ = importance_scores(model, info, data, method, means=means, batch_size=batch_size, l0=l0)
    return scores.cpu()


@takes_any_model
def compare_estimators(model: AnyModel, tokens: Tensor, *, loss_mask: Optional[Tensor] = None,
                       attention_mask: Optional[Tensor] = None, methods: Any = ESTIMATORS, budgets: Any = BUDGETS,
                       seed: int = 0, l0_options: Optional[l0_gates.L0Options] = None,
                       batch_size: Optional[int] = None, known: Optional[dict[str, Any]] = None,
                       source_tokens: Optional[Tensor] = None, source_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """Each estimator against exact leave-one-out: ``DataFrame[ESTIMATOR_COLUMNS]``, one row per (method, budget).

    ``spearman`` / ``kendall``: rank correlation of the estimator's importance with the exact loss
    change of removing each head alone. The exact answer *is* the ``ablation`` estimator, so its
    correlations are 1 by construction (it is listed for its cost and its prune order, the
    reference every other row is measured against). ``prunable_fraction``: heads its order prunes,
    least important first, before the loss first exceeds ``baseline * (1 + budget)``. ``seconds``,
    ``forward_passes``, ``backward_passes``: the estimator's own cost (the exact answer's for
    ``ablation``; the pruning evaluation is shared and not counted). ``seed`` seeds the random
    order and, unless ``l0_options`` gives its own, the L0 gates. ``attrs``: ``baseline_loss``,
    ``n_heads``. ``known`` maps a method to ``(importance [n_layers, n_heads], seconds, forward_passes,
    backward_passes)`` already computed on this data (``attnlab probe`` ran them as its own steps):
    those are not recomputed; ``known["ablation"]`` must be the exact answer of every head, and
    ``known["baseline_loss"]`` the intact loss. An encoder-decoder's heads of all three stacks are ranked and
    pruned together, given ``source_tokens``/``source_mask`` as :func:`probes.head_importance` takes them (its
    ``known`` importances then have that function's rows: encoder layers, decoder layers, cross-attention layers).
    """
    methods = _check_methods(methods)
    budgets = _check_budgets(budgets)
    seed = check_seed("seed", seed)
    l0 = l0_gates.check_options(l0_options)
    l0 = l0 if l0_options is not None else l0_gates.L0Options(seed=seed)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, loss_mask=loss_mask, attention_mask=attention_mask,
                                     source_tokens=source_tokens, source_mask=source_mask)
    L, H = info.n_layers, info.n_heads
    N = L * H

    known = dict(known or {})
    counter = PassCounter(info, data.n)
    cost: dict[str, tuple[float, float, float]] = {}
    scores: dict[str, Tensor] = {}
    for method, (value, *spent) in ((m, v) for m, v in known.items() if m in ESTIMATORS):
        scores[method], cost[method] = torch.as_tensor(value, dtype=torch.float64).cpu().view(L, H), tuple(spent)
    with counter.counting(model):
        if "ablation" in scores and "baseline_loss" in known:
            exact, baseline = scores["ablation"], float(known["baseline_loss"])
        else:
            start = time.perf_counter()
            exact, baseline = leave_one_out(model, info, data, batch_size=batch_size)
            cost["ablation"] = (time.perf_counter() - start, counter.forward, counter.backward)
            scores["ablation"] = exact.cpu()
        for method in methods:
            if method in scores:
                continue
            counter.forward = counter.backward = 0.0
            start = time.perf_counter()
            scores[method] = _scores(model, info, data, method, seed, l0, batch_size)
            cost[method] = (time.perf_counter() - start, counter.forward, counter.backward)

    counts = list(range(N + 1))
    orders = {m: torch.sort(scores[m].flatten(), stable=True).indices for m in methods}
    # each curve runs only until it passes the largest budget (gates.masked_stats_until): prunable_fraction
    # reads nothing after that, so the numbers are those of the whole curve
    limit = baseline * (1 + max(budgets))
    curves = torch.stack([gates.masked_stats_until(model, info, data, _cumulative_masks(orders[m], counts, L, H),
                                                   lambda loss, _: loss > limit, batch_size=batch_size)[0].cpu()
                          for m in methods])

    exact_flat = exact.flatten().cpu()
    rows = []
    for i, method in enumerate(methods):
        rho, tau = spearman(scores[method].flatten(), exact_flat), kendall_tau_b(scores[method].flatten(), exact_flat)
        seconds, fwd, bwd = cost[method]
        for b in budgets:
            prunable = _prunable(curves[i] > baseline * (1 + b))
            rows.append((method, rho, tau, b, prunable / N, seconds, fwd, bwd))
    frame = pd.DataFrame(rows, columns=list(ESTIMATOR_COLUMNS))
    frame.attrs.update(baseline_loss=baseline, n_heads=N)
    return frame
