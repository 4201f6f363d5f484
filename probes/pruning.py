"""Pruning curves and the redundancy headline numbers (Michel, Levy & Neubig 2019).

Heads are pruned cumulatively: least important first (importance order, by default the gradient
importance I_h Michel et al. prune by; with ``reestimate`` the importance of the remaining heads is
recomputed after each step, their §4.2), or in a seeded random order, the baseline a pruning curve
needs to mean anything. A pruned head's
``hook_z`` output is zero (its per-position mean for ``method="mean_ablation"``). Every mask of a
curve rides in one batched call of :func:`probes.gates.masked_stats`.
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel
from harness.errors import AttnlabError
from probes import _head_stats, gates
from probes._validate import (
    ModelInfo,
    ProbeData,
    check_batch_size,
    check_bool,
    check_choice,
    check_fractions,
    check_orders,
    check_seeds,
    check_tolerance,
    probe_inputs,
    takes_any_model,
)
from probes.importance import check_method, importance_scores


def _ranking(model: ProtocolModel, info: ModelInfo, data: ProbeData, method: str, means: Optional[Tensor],
             steps: list[int], reestimate: bool, batch_size: Optional[int], known: Optional[Tensor] = None) -> Tensor:
    """Flat head indices, least important first.

    Without ``reestimate`` one importance estimate orders every head; with it, importance is
    recomputed on the pruned model before each step in ``steps`` (cumulative head counts).
    Ties keep the head order (layer, then head), so the ranking is deterministic.
    """
    N = info.n_layers * info.n_heads
    if not reestimate:
        scores = known if known is not None else \
            importance_scores(model, info, data, method, means=means, batch_size=batch_size)[0]
        return torch.sort(scores.flatten().cpu(), stable=True).indices
    order: list[int] = []
    base = torch.ones(N, device=info.device)
    for target in sorted(set(steps) | {N}):
        if target <= len(order):
            continue
        scores, _ = importance_scores(model, info, data, method, base=base.view(info.n_layers, info.n_heads),
                                      means=means, batch_size=batch_size)
        scores = scores.flatten().cpu()
        scores[torch.tensor(order, dtype=torch.long)] = float("inf")  # already pruned
        chosen = torch.sort(scores, stable=True).indices[: target - len(order)].tolist()
        order += chosen
        base[chosen] = 0
    return torch.tensor(order, dtype=torch.long)


def _known(scores: Optional[Tensor], info: ModelInfo) -> Optional[Tensor]:
    if scores is None:
        return None
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (info.n_layers, info.n_heads):
        raise AttnlabError(f"scores {tuple(getattr(scores, 'shape', ()))} is invalid: expected a tensor "
                           f"[n_layers, n_heads] = [{info.n_layers}, {info.n_heads}] of importance")
    return scores.double()


def _cumulative_masks(order: Tensor, counts: list[int], n_layers: int, n_heads: int) -> Tensor:
    """``[len(counts), n_layers, n_heads]``: mask i prunes the first ``counts[i]`` heads of ``order``."""
    masks = torch.ones(len(counts), n_layers * n_heads)
    for i, c in enumerate(counts):
        masks[i, order[:c]] = 0
    return masks.view(-1, n_layers, n_heads)


def _random_order(seed: int, n: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


@takes_any_model
def prune_curve(model: AnyModel, tokens: Tensor, *, loss_mask: Optional[Tensor] = None, order: Any = "importance",
                fractions: Any = None, seeds: Any = (0, 1, 2), reestimate: bool = False, method: str = "gradient",
                batch_size: Optional[int] = None, attention_mask: Optional[Tensor] = None,
                scores: Optional[Tensor] = None, source_tokens: Optional[Tensor] = None,
                source_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """Loss and accuracy as heads are pruned: ``DataFrame[order, seed, n_pruned, fraction_pruned, loss, accuracy]``.

    ``order``: "importance", "random", or a sequence of both. ``fractions`` (default 0, 0.1, ..., 1)
    are rounded to whole heads; ``fraction_pruned`` is the fraction actually pruned. ``seeds`` seed
    the random orders (``seed`` is <NA> for the importance order). ``method`` is the importance
    estimate (see :func:`probes.head_importance`) and, for ``mean_ablation``, how heads are removed;
    the default, ``gradient``, is the I_h Michel et al. prune by (one forward and backward pass,
    where exact leave-one-out ``ablation`` costs a masked pass per head). ``scores``: that importance
    (``[n_layers, n_heads]``), already computed on this data, so it is not recomputed. An encoder-decoder
    prunes all three kinds of heads, given its source as :func:`probes.head_importance` takes it (``scores``
    then has that function's rows: encoder layers, decoder layers, cross-attention layers).
    """
    orders = check_orders(order)
    fracs = check_fractions(fractions)
    seeds = check_seeds(seeds) if "random" in orders else ()
    check_bool("reestimate", reestimate)
    check_method(method)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, loss_mask=loss_mask, attention_mask=attention_mask,
                                     source_tokens=source_tokens, source_mask=source_mask)
    L, H = info.n_layers, info.n_heads
    N = L * H
    counts = sorted({round(f * N) for f in fracs})
    means = _head_stats.ablation_means(model, info, data, method, batch_size=batch_size)

    runs: list[tuple[str, Any, Tensor]] = []
    if "importance" in orders:
        runs.append(("importance", pd.NA, _ranking(model, info, data, method, means, counts, reestimate, batch_size,
                                                   _known(scores, info))))
    for seed in seeds:
        runs.append(("random", seed, _random_order(seed, N)))
    masks = torch.cat([_cumulative_masks(perm, counts, L, H) for _, _, perm in runs])
    loss, acc = gates.masked_stats(model, info, data, masks, means=means, batch_size=batch_size)
    rows = []
    for r, (name, seed, _) in enumerate(runs):
        for i, c in enumerate(counts):
            j = r * len(counts) + i
            rows.append((name, seed, c, c / N, float(loss[j]), float(acc[j])))
    frame = pd.DataFrame(rows, columns=["order", "seed", "n_pruned", "fraction_pruned", "loss", "accuracy"])
    frame["seed"] = frame["seed"].astype("Int64")
    frame.attrs.update(method=method, reestimate=reestimate, n_heads=N)
    return frame


CRITERIA = ("loss", "accuracy")


def _prunable(broken: Tensor) -> int:
    """Heads pruned before the model first fails (``broken[n]``: it fails with n heads pruned)."""
    over = broken.nonzero()
    return int(over[0]) - 1 if len(over) else len(broken) - 1


@takes_any_model
def redundancy(model: AnyModel, tokens: Tensor, *, tolerance: float = 0.01, loss_mask: Optional[Tensor] = None,
               method: str = "gradient", seeds: Any = (0, 1, 2), reestimate: bool = False, criterion: str = "loss",
               batch_size: Optional[int] = None, attention_mask: Optional[Tensor] = None,
               per_layer: bool = True, scores: Optional[Tensor] = None, source_tokens: Optional[Tensor] = None,
               source_mask: Optional[Tensor] = None) -> pd.Series:
    """The headline numbers of head redundancy, as a ``pandas.Series``.

    A pruned model "survives" when its loss stays within ``baseline_loss * (1 + tolerance)``
    (``criterion="loss"``), or, with ``criterion="accuracy"``, when its next-token accuracy stays
    within ``tolerance`` of ``baseline_accuracy`` (Michel et al. 2019 read accuracy / BLEU). A model
    that solves its task almost perfectly has a loss near 0, where any relative loss budget is tiny;
    the accuracy reading is the useful one there.

    - ``prunable_fraction`` / ``prunable_heads``: how many heads can be pruned, least important
      first, before the model first fails; ``random_prunable_fraction``: the same for random orders
      (mean over ``seeds``), the baseline it must beat;
    - ``heads_needed_L{l}``: the fewest heads layer l can keep (pruned least important first,
      every other layer intact) and survive;
    - ``one_head_best_L{l}`` / ``one_head_rel_increase_L{l}``: Michel et al.'s "one head is
      sufficient" test (§3.2): layer l keeps only its best single head, the rest intact, and the
      relative loss increase; ``one_head_all_layers_rel_increase`` / ``_accuracy``: every layer
      keeps only its best head at once.

    ``per_layer=False`` leaves out the per-layer numbers (``heads_needed_L*`` and ``one_head_*``:
    about ``n_heads`` masked passes more), for a model too large to afford them. ``scores``,
    ``source_tokens``, ``source_mask``: as for :func:`prune_curve`; an encoder-decoder's per-layer keys name
    each attention layer as its head labels do (``heads_needed_enc L0``, ``heads_needed_L0``,
    ``heads_needed_xL0`` for encoder, decoder and cross-attention layer 0).
    """
    tolerance = check_tolerance(tolerance)
    check_method(method)
    check_choice("criterion", criterion, CRITERIA)
    seeds = check_seeds(seeds)
    check_bool("reestimate", reestimate)
    check_bool("per_layer", per_layer)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, loss_mask=loss_mask, attention_mask=attention_mask,
                                     source_tokens=source_tokens, source_mask=source_mask)
    L, H = info.n_layers, info.n_heads
    N = L * H
    counts = list(range(N + 1))
    means = _head_stats.ablation_means(model, info, data, method, batch_size=batch_size)
    ranking = _ranking(model, info, data, method, means, counts, reestimate, batch_size, _known(scores, info))

    # Each curve is read up to the first mask that breaks the model, so each runs only that far
    # (gates.masked_stats_until): the same numbers as running every mask, at a fraction of the passes.
    base_loss, base_acc = gates.masked_stats(model, info, data, torch.ones(1, L, H), means=means,
                                             batch_size=batch_size)
    baseline, baseline_acc = float(base_loss[0]), float(base_acc[0])

    def broken_at(loss: Tensor, acc: Tensor) -> Tensor:
        return loss > baseline * (1 + tolerance) if criterion == "loss" else acc < baseline_acc - tolerance

    def curve(masks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(broken, loss, acc) over ``masks``, the first one (nothing pruned) being the baseline."""
        loss, acc = gates.masked_stats_until(model, info, data, masks[1:], broken_at, means=means,
                                             batch_size=batch_size)
        loss, acc = torch.cat([base_loss, loss]), torch.cat([base_acc, acc])
        return broken_at(loss, acc), loss, acc

    imp_broken, imp_loss, imp_acc = curve(_cumulative_masks(ranking, counts, L, H))
    prunable = _prunable(imp_broken)
    random_prunable = [_prunable(curve(_cumulative_masks(_random_order(s, N), counts, L, H))[0]) for s in seeds]
    out: dict[str, Any] = {
        "n_heads": N, "tolerance": tolerance, "criterion": criterion,
        "baseline_loss": baseline, "baseline_accuracy": baseline_acc,
        "prunable_heads": prunable, "prunable_fraction": prunable / N,
        "pruned_loss": float(imp_loss[prunable]), "pruned_accuracy": float(imp_acc[prunable]),
        "random_prunable_fraction": sum(random_prunable) / len(random_prunable) / N,
    }
    if not per_layer:
        series = pd.Series(out, name="redundancy", dtype=object)
        series.attrs.update(method=method, reestimate=reestimate, per_layer=False)
        return series
    for layer in range(L):  # prune within one layer only, in the global ranking's order
        in_layer = ranking[(ranking // H) == layer]
        needed = H - _prunable(curve(_cumulative_masks(in_layer, list(range(H + 1)), L, H))[0])
        out[f"heads_needed_{info.row_name(layer)}"] = needed
    single = torch.ones(L * H, L, H)
    for layer in range(L):
        for h in range(H):
            single[layer * H + h, layer] = 0
            single[layer * H + h, layer, h] = 1
    one = gates.masked_stats(model, info, data, single, means=means, batch_size=batch_size)[0].view(L, H)
    best = one.argmin(1)
    for layer in range(L):
        out[f"one_head_best_{info.row_name(layer)}"] = int(best[layer])
        out[f"one_head_rel_increase_{info.row_name(layer)}"] = float(one[layer, best[layer]] / baseline - 1)
    keep_best = torch.zeros(1, L, H)
    keep_best[0, torch.arange(L), best.cpu()] = 1
    all_loss, all_acc = gates.masked_stats(model, info, data, keep_best, means=means, batch_size=batch_size)
    out["one_head_all_layers_rel_increase"] = float(all_loss[0] / baseline - 1)
    out["one_head_all_layers_accuracy"] = float(all_acc[0])
    series = pd.Series(out, name="redundancy", dtype=object)
    series.attrs.update(method=method, reestimate=reestimate)
    return series
