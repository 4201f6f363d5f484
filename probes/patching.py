"""Activation patching of the residual stream over layers x positions, batched.

Activation patching (Meng et al. 2022, "Locating and Editing Factual Associations in GPT", §2.1;
Wang et al. 2022, the IOI circuit) runs the model on a *corrupted* input while one activation is
replaced by its value on the *clean* input; how far a metric moves back towards its clean value
says how much that activation carries. Here the activation is ``blocks.{l}.hook_resid_pre`` at
one position, for every layer l and position p: the table TransformerLens's
``patching.get_act_patch_resid_pre`` computes with one forward pass per (l, p).

Speed. For layer l, every position's patch rides in one forward pass (the corrupted batch
repeated once per position, position-major). On models whose ``forward`` can stop and start at a
layer (``stop_at_layer``/``start_at_layer``), the corrupted residual entering layer l is computed
once and the patched passes start there: layers before l are the same in every patched run.

On attnlab's own causal Transformer a patch at position p also leaves every position before p as it
was in the corrupted run, in every layer (a causal model's position i reads positions <= i only), so
the patched pass computes positions p.. alone: it starts at layer l from the corrupted keys and values
of positions < p (a :class:`~harness.model.KVCache` the corrupted run filled) and the logits before p
are the corrupted run's. Patches at nearby positions still share a pass where one pass's fixed cost
outweighs the positions it recomputes (:func:`position_groups`). At GPT-2 small's T128 x 8
sequences, patching every 8th position at every layer computes 53 % of the tokens of full passes and
takes 71 s against 110 s for the batched passes over every position (load ~1.5-1.9).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional, cast

import torch
from jaxtyping import Float
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel, is_encoder_decoder
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model import KVCache, Transformer
from probes import gates
from probes._validate import ModelInfo, model_info, takes_any_model
from probes.gates import eval_mode, rows_per_pass

Metric = Callable[[Tensor], Tensor]  # logits [batch, pos, d_vocab] -> a scalar tensor

# A pass's fixed cost in tokens' worth of work: what a pass of one token costs beyond that token.
# Measured on attnlab's Transformer, 2 CPU cores, 1 against 256 tokens from layer 0 (load 0.3): 126
# tokens at d_model 32, 87 at 64, 50 at 128, 29 at 256 (~120-220 us of Python per block), 23 at
# GPT-2 small (streaming its 0.5 GB of weights); 20 + 4000 / d_model follows all five within 15 %.
def cpu_pass_overhead_tokens(d_model: int) -> int:
    return round(20 + 4000 / d_model)


ACCELERATOR_PASS_OVERHEAD_TOKENS = 4096  # an estimate, not a measurement: no GPU was at hand


def resid_hook(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def _check(clean: object, corrupted: object, d_vocab: int, metric: object) -> tuple[Tensor, Tensor]:
    for name, t in (("clean_tokens", clean), ("corrupted_tokens", corrupted)):
        if not isinstance(t, Tensor) or t.ndim != 2 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise AttnlabError(f"{name} is invalid: expected an integer tensor [batch, pos], got "
                               f"{type(t).__name__}{tuple(t.shape) if isinstance(t, Tensor) else ''}")
        if t.numel() == 0 or int(t.min()) < 0 or int(t.max()) >= d_vocab:
            raise AttnlabError(f"{name} is invalid: expected a non-empty tensor of token ids in [0, {d_vocab})")
    assert isinstance(clean, Tensor) and isinstance(corrupted, Tensor)
    if clean.shape != corrupted.shape:
        raise AttnlabError(f"clean_tokens {tuple(clean.shape)} and corrupted_tokens {tuple(corrupted.shape)} "
                           "have different shapes: expected the same [batch, pos]")
    if not callable(metric):
        raise AttnlabTypeError(f"metric={metric!r} is invalid: expected a callable logits -> scalar tensor")
    return clean, corrupted


def _saver(store: dict[str, Tensor]) -> Callable:
    """A hook that keeps a copy of what it sees under its hook's name."""
    def fn(t: Tensor, hook: Any) -> None:
        store[hook.name] = t.detach().clone()
    return fn


def _patch_fn(clean_resid: Tensor, positions: Sequence[int], b: int) -> Callable:
    """A resid_pre hook: copy ``i`` of the position-major batch takes the clean residual at ``positions[i]``."""

    def fn(resid: Tensor, hook: Any) -> Tensor:
        out = resid.clone()
        for i, p in enumerate(positions):
            out[i * b:(i + 1) * b, p] = clean_resid[:, p].to(out.dtype)
        return out

    return fn


def position_groups(positions: Sequence[int], pos: int, rows: int, max_k: int, overhead: int) -> list[list[int]]:
    """``positions`` ascending, split into runs that each take one suffix pass from the run's first position.

    A pass of ``k`` patches from position ``p`` computes ``k * rows * (pos - p)`` tokens plus a fixed cost of
    ``overhead`` tokens' worth; the split minimises the total (dynamic programming over the sorted positions,
    at most ``max_k`` patches per pass)."""
    ps = sorted(positions)
    n, max_k = len(ps), max(1, min(max_k, 256))
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - max_k), j):  # the run ps[i:j]
            cost = best[i] + overhead + (j - i) * rows * (pos - ps[i])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(ps[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def _suffix_route(model: object, info: ModelInfo) -> bool:
    """attnlab's own causal Transformer: its forward takes ``start_at_layer`` with a ``kv_cache`` holding earlier
    positions, and a position reads no later one."""
    return info.prefix_reuse and isinstance(model, Transformer) and model.config.attention_dir == "causal"


def _patch_suffixes(model: Transformer, info: ModelInfo, metric: Metric, clean: dict[str, Tensor], corrupted: Tensor,
                    layers: list[int], positions: list[int], per_pass: int, out: Tensor) -> None:
    """The table through suffix passes (module docstring): each pass starts at its layer and first position."""
    b, pos = corrupted.shape
    full = KVCache(model.config.n_layers, capacity=pos)
    resid: dict[str, Tensor] = {}
    # the corrupted logits, every layer's keys and values, and the residuals the patches start from
    base = gates.hooked_pass(model, info, corrupted, None, [(resid_hook(x), _saver(resid)) for x in layers],
                             kv_cache=full)
    device = corrupted.device
    overhead = (cpu_pass_overhead_tokens(model.config.d_model) if device.type == "cpu"
                else ACCELERATOR_PASS_OVERHEAD_TOKENS)
    groups = position_groups(positions, pos, b, per_pass, overhead)  # the same at every layer
    for layer in layers:
        for chunk in groups:
            start, k = chunk[0], len(chunk)
            x = resid[resid_hook(layer)][:, start:].repeat(k, 1, 1)
            for i, p in enumerate(chunk):
                x[i * b:(i + 1) * b, p - start] = clean[resid_hook(layer)][:, p].to(x.dtype)
            cache = full.prefix(start, repeat=k, layers=range(layer, model.config.n_layers)) if start else None
            logits = model(x, start_at_layer=layer, kv_cache=cache)
            for i, p in enumerate(chunk):
                mine = logits[i * b:(i + 1) * b]
                out[layer, p] = float(metric(torch.cat((base[:, :start], mine), 1) if start else mine))


@torch.no_grad()
@takes_any_model
def patch_residual(model: AnyModel, clean_tokens: Tensor, corrupted_tokens: Tensor,
                   metric: Metric, *, layers: Optional[Sequence[int]] = None,
                   positions: Optional[Sequence[int]] = None,
                   batch_size: Optional[int] = None) -> Float[Tensor, "n_layers pos"]:
    """``metric`` of the corrupted run with ``hook_resid_pre`` of layer l at position p patched from the clean run.

    Returns ``[n_layers, pos]`` float64 (entries outside ``layers``/``positions`` are NaN), the same
    numbers as TransformerLens's ``patching.get_act_patch_resid_pre(model, corrupted, clean_cache,
    metric)``. ``metric`` maps logits ``[batch, pos, d_vocab]`` to a scalar; ``batch_size`` caps the
    sequences per forward pass (default: about 32k tokens per pass). ``clean_tokens`` and
    ``corrupted_tokens`` are ``[batch, pos]`` token ids of the same shape (validated here, before any
    forward pass, with an error naming the value). An encoder-decoder is refused: its forward needs a source.
    """
    cfg = getattr(model, "cfg", None)
    L, d_vocab = getattr(cfg, "n_layers", None), getattr(cfg, "d_vocab", None)
    if not isinstance(L, int) or not isinstance(d_vocab, int):
        model_info(model)  # raises the probes' error naming what the model lacks
        raise AttnlabTypeError(f"model {type(model).__name__} has no integer cfg.n_layers/cfg.d_vocab")
    if is_encoder_decoder(model):  # its forward needs a source this probe does not take: never a silent default
        raise AttnlabError(f"patch_residual patches a decoder-only model's residual stream; {type(model).__name__} "
                           "is an encoder-decoder (cfg.is_encoder_decoder): expected a model without a source")
    clean, corrupted = _check(clean_tokens, corrupted_tokens, d_vocab, metric)
    b, pos = corrupted.shape
    layers = list(range(L)) if layers is None else list(layers)
    positions = list(range(pos)) if positions is None else list(positions)
    bad = [x for x in layers if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < L]
    if bad or not layers:
        raise AttnlabError(f"layers={layers!r} is invalid: expected a non-empty list of integers in [0, {L})")
    bad = [x for x in positions if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < pos]
    if bad or not positions:
        raise AttnlabError(f"positions={positions!r} is invalid: expected a non-empty list of integers in [0, {pos})")
    missing = [resid_hook(x) for x in layers if resid_hook(x) not in getattr(model, "hook_dict", {})]
    if missing:
        raise AttnlabTypeError(f"model {type(model).__name__} lacks hook point(s) {missing[:4]}: residual patching "
                               "reads and writes blocks.{l}.hook_resid_pre")
    info = model_info(model)
    model = cast(ProtocolModel, model)  # model_info checked it
    device = info.device
    clean, corrupted = clean.to(device), corrupted.to(device)
    out = torch.full((L, pos), float("nan"), dtype=torch.float64)
    per_pass = max(1, rows_per_pass(batch_size, pos) // b)
    with eval_mode(model):
        store: dict[str, Tensor] = {}
        gates.hooked_pass(model, info, clean, None, [(resid_hook(x), _saver(store)) for x in layers],
                          until=resid_hook(max(layers)))  # the clean run ends at the last residual it saves
        if _suffix_route(model, info):
            _patch_suffixes(cast(Transformer, model), info, metric, store, corrupted, layers, positions, per_pass, out)
            return out
        corrupt_resid: list[Tensor] = []
        if info.prefix_reuse:  # corrupted residual entering every layer, computed once
            corrupt_resid.append(model(corrupted, stop_at_layer=0))
            for layer in range(max(layers)):
                corrupt_resid.append(model(corrupt_resid[layer], start_at_layer=layer, stop_at_layer=layer + 1))
        for layer in layers:
            for j in range(0, len(positions), per_pass):
                chunk = positions[j:j + per_pass]
                k = len(chunk)
                hooks = [(resid_hook(layer), _patch_fn(store[resid_hook(layer)], chunk, b))]
                if info.prefix_reuse:
                    logits = gates.hooked_pass(model, info, corrupt_resid[layer].repeat(k, 1, 1), None, hooks,
                                               start=layer)
                else:
                    logits = gates.hooked_pass(model, info, corrupted.repeat(k, 1), None, hooks)
                for i, p in enumerate(chunk):
                    out[layer, p] = float(metric(logits[i * b:(i + 1) * b]))
    return out
