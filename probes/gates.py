"""The one mechanism behind every probe: head masks applied on ``hook_z``.

A head mask ``m`` (``[n_layers, n_heads]``, 1 = keep) rewrites layer l's ``hook_z`` as

    z'[..., h, :] = m[l, h] * z[..., h, :] + (1 - m[l, h]) * r[l, pos, h, :]

with ``r = 0`` (ablation: the head's output is removed before the output projection) or the
head's per-position mean over the data (mean ablation). Gradient importance (Michel, Levy &
Neubig 2019, §4.1) makes ``m`` a gate ``xi`` held at 1 and differentiates the loss by it
(:mod:`probes._head_stats`, with the head means, over this module's pass runner).

Speed. ``k`` masks ride in one forward pass: the data batch is repeated ``k`` times, mask-major
(rows ``i*b .. (i+1)*b`` carry mask ``i``). A mask that first differs from the reference mask
(``base``, default all ones) at layer l changes nothing before layer l's output projection, so
on models whose ``forward`` can stop and start at a layer (TransformerLens-style
``stop_at_layer``/``start_at_layer``) the residual entering layer l is computed once per data
chunk and every mask of that group starts from it. Other models (e.g. a ``TransformerBridge``,
which re-runs the earlier blocks anyway) run the same masks from the tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional, overload

import torch
from jaxtyping import Float64, Shaped
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel
from harness.errors import AttnlabError
from probes import _shard
from probes._nll import token_nll
from probes._validate import ModelInfo, ProbeData

# Rows x positions per forward pass when the caller gives no batch_size. On a GPU, large passes
# fill the device (activations stay well under a GiB). On CPU a pass should amortise the per-pass
# Python and hook overhead yet keep its activations near the caches: at 2**15 tokens (d_model 128:
# 16 MB per residual, 64 MB per MLP hidden) batched leave-one-out ran only 1.1x the one-forward-
# per-head loop at 16 x 128 tokens, against 1.4-1.5x at 2**11-2**13 tokens per pass, where the
# memory traffic of the repeated batch no longer dominates (tests/bench/test_bench_probes.py).
TOKENS_PER_PASS = 2 ** 15
CPU_TOKENS_PER_PASS = 2 ** 13
# float32 logits per pass (256 MiB); token_nll reads them a slice at a time. The unembedding's output and its
# temporaries hold 2-3x that: leave-one-out peaked 810 MB above the model at a 49k vocabulary
# (tests/bench/test_bench_probes.py, VmHWM). Half of it (5 rows of SmolLM2-135M) timed a pass at 44 s against
# 21 s at this size (one run each, load ~5 on 2 cores): not conclusive, so the measured setting stays.
LOGIT_ELEMENTS = 2 ** 26
GRAD_FLOATS_PER_TOKEN = 20
# Saved activations per backward pass: 256 MiB. On SmolLM2-135M (2 GB goal) peak RSS was 1.67 GB at one
# 128-token row per backward and 2.31 GB at three, ~0.32 GB a row; two rows (512 MiB) reached 2.04 GB in a whole
# `attnlab probe` run (the process's peak, set by the attribution pass), so one row it is.
GRAD_ACTIVATION_BYTES = 2 ** 28


def rows_per_pass(batch_size: Optional[int], pos: int, device: Optional[torch.device] = None, *,
                  d_vocab: int = 0) -> int:
    """Sequences per forward pass (a sequence repeated for k masks counts k times).

    ``device``: where the model runs; None or a CPU takes the CPU budget. ``d_vocab`` also bounds the
    pass by its logits (``LOGIT_ELEMENTS``): at a 49k vocabulary 64 rows x 128 tokens of float32 logits
    are 1.6 GB, and the 135M probe peaked at 5.7 GB RSS with the token budget alone."""
    if batch_size is not None:
        return batch_size
    tokens = TOKENS_PER_PASS if device is not None and torch.device(device).type != "cpu" else CPU_TOKENS_PER_PASS
    if d_vocab > 0:
        tokens = min(tokens, LOGIT_ELEMENTS // d_vocab)
    return max(1, tokens // pos)


def grad_rows(batch_size: Optional[int], info: ModelInfo, pos: int) -> int:
    """Sequences per forward + backward pass: autograd keeps every layer's activations until the backward.

    About ``GRAD_FLOATS_PER_TOKEN`` floats per token per layer and d_model (residuals, norms, q/k/v, MLP
    hidden, saved for the backward), plus three copies of the logits, held under ``GRAD_ACTIVATION_BYTES``
    so a backward never holds gigabytes. Measured on SmolLM2-135M (30 layers x d_model 576, vocab 49k):
    1.76 MB per token of peak RSS, of which the logits' 0.59 MB; the rest is 17 floats per layer and d_model."""
    if batch_size is not None:
        return batch_size
    per_token = 4 * (GRAD_FLOATS_PER_TOKEN * info.n_layers * max(info.d_model, 1) + 3 * info.d_vocab)
    return max(1, min(rows_per_pass(None, pos, info.device, d_vocab=info.d_vocab),
                      GRAD_ACTIVATION_BYTES // (per_token * pos)))


@contextmanager
def eval_mode(model: AnyModel) -> Iterator[None]:
    """Probe in eval mode (no dropout), then restore every module's own training flag."""
    flags = [(m, m.training) for m in model.modules()]
    if not any(flag for _, flag in flags):  # already in eval mode: toggling every module's flag twice costs
        yield                               # more than a small model's whole pass (~1.3 ms at 2 layers)
        return
    model.eval()
    try:
        yield
    finally:
        # model.train() first: a TransformerBridge propagates it to the wrapped Hugging Face model,
        # whose root is not among the bridge's modules(); then any mixed per-module flags.
        if len({flag for _, flag in flags}) == 1:
            model.train(flags[0][1])
        for m, flag in flags:
            m.training = flag


@contextmanager
def call_hooks(model: Any, pre: Callable, post: Callable) -> Iterator[None]:
    """``pre(module, args, kwargs)`` before and ``post(module, args, kwargs, output)`` after every call of the
    model's own forward within the ``with`` block (torch's module hooks, with keywords), removed after, even on
    error: what counts or times the passes a probe makes sees each call's ``start_at_layer``/``stop_at_layer``."""
    handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
               model.register_forward_hook(post, with_kwargs=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Done(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the ``until`` hook of :func:`hooked_pass` once it has seen what the pass is for."""


def _then_stop(fn: Callable) -> Callable:
    def last(x: Tensor, hook: Any) -> None:
        fn(x, hook)
        raise _Done
    return last


@overload
def hooked_pass(model: ProtocolModel, info: ModelInfo, x: Tensor, attention_mask: Optional[Tensor], hooks: list, *,
                start: Optional[int] = ..., stop: Optional[int] = ..., source: Optional[dict] = ...,
                until: None = ..., kv_cache: Any = ...) -> Tensor: ...


@overload
def hooked_pass(model: ProtocolModel, info: ModelInfo, x: Tensor, attention_mask: Optional[Tensor], hooks: list, *,
                start: Optional[int] = ..., stop: Optional[int] = ..., source: Optional[dict] = ...,
                until: str, kv_cache: Any = ...) -> None: ...


def hooked_pass(model: ProtocolModel, info: ModelInfo, x: Tensor, attention_mask: Optional[Tensor], hooks: list, *,
        start: Optional[int] = None, stop: Optional[int] = None, source: Optional[dict] = None,
        until: Optional[str] = None, kv_cache: Any = None) -> Optional[Tensor]:
    """One forward pass through the model protocol with temporary forward hooks.

    Hooks go straight onto the HookPoints (TransformerLens's ``HookPoint.add_hook``) and exactly
    those are removed afterwards, even on error: ``model.hooks()`` would also sweep every hook
    point of the model on exit, a cost that dominates small passes. ``source``: an encoder-decoder's
    source keywords (:meth:`ProbeData.source`), passed to the forward as they are.

    ``until``: the name of one of ``hooks`` after which nothing the pass computes is needed; the pass
    ends there (a signal raised from that hook, caught here) and returns None. A pass that only reads
    activations so skips the layers after the last it reads and the unembedding: nobody reads them.
    ``kv_cache``: passed to the forward as ``kv_cache=`` (attnlab's Transformer fills it or continues from it).
    """
    if until is not None and until not in {name for name, _ in hooks}:
        raise AttnlabError(f"until={until!r} names none of the pass's hooks: expected one of "
                           f"{[name for name, _ in hooks][:4]}")
    kwargs: dict = dict(source or {})
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if start is not None:
        kwargs["start_at_layer"] = start
    if stop is not None:
        kwargs["stop_at_layer"] = stop
    if kv_cache is not None:
        kwargs["kv_cache"] = kv_cache
    added = []
    try:
        for name, fn in hooks:
            if info.encoder_decoder:
                fn = _same_heads(name, fn, info.n_heads)
            point = info.hook_points[name] if name in info.hook_points else model.hook_dict[name]
            added.append((point, point.add_hook(_then_stop(fn) if name == until else fn, dir="fwd")))
        return model(x, **kwargs)
    except _Done:
        return None
    finally:
        for point, handle in added:
            handle.hook.remove()
            point.fwd_hooks = [h for h in point.fwd_hooks if h is not handle]


def _same_heads(name: str, fn: Callable, n_heads: int) -> Callable:
    """``fn``, refusing a ``hook_z`` (or ``hook_pattern``) whose head count is not ``cfg.n_heads``: an
    encoder-decoder's masks give every kind of head the one count (an HF model may declare other counts for its
    encoder, e.g. BART's encoder_attention_heads)."""
    dim = 1 if name.endswith("hook_pattern") else 2  # [batch, n_heads, q, k] against [batch, pos, n_heads, d_head]

    def checked(z: Tensor, hook: Any) -> Any:
        if z.ndim == 4 and z.shape[dim] != n_heads:
            raise AttnlabError(f"{name} has {z.shape[dim]} heads but cfg.n_heads={n_heads}: expected an "
                               "encoder-decoder with one head count for every kind of head (the probes gate them "
                               "with one mask)")
        return fn(z, hook)
    return checked


def gate_fn(layer_masks: Tensor, replacement: Optional[Tensor] = None) -> Callable:
    """A ``hook_z`` hook applying ``k`` masks of one layer (``[k, n_heads]``) to a mask-major batch.

    ``replacement`` (``[pos, n_heads, d_head]``) is what a removed head outputs instead (mean
    ablation); None means zero. A kept head (mask 1) passes through bit for bit.
    """

    def fn(z: Tensor, hook: Any) -> Tensor:
        k = layer_masks.shape[0]
        zz = z.reshape(k, -1, *z.shape[1:])  # [k, batch, pos, n_heads, d_head]
        m = layer_masks.to(z.dtype)[:, None, None, :, None]
        out = zz * m
        if replacement is not None:
            out = out + (1 - m) * replacement[None, None, : z.shape[1]].to(z.dtype)
        return out.reshape(z.shape)

    return fn


def _row_hooks(info: ModelInfo, masks: Tensor, rows: list[int], means: Optional[Tensor]) -> list:
    """Hooks for the mask rows where some mask removes something; untouched rows get no hook at all."""
    hooks = []
    for row in rows:
        m = masks[:, row]
        if bool((m != 1).any()):
            hooks.append((info.z_hooks[row], gate_fn(m, None if means is None else means[row])))
    return hooks


def _rows_from(info: ModelInfo, layer: int) -> list[int]:
    """The rows a pass starting at (decoder) layer ``layer`` runs: those from it on, and those that rerun."""
    return [r for r in range(info.n_layers) if info.starts[r] >= layer or info.reruns[r]]


def _rows_at(info: ModelInfo, layer: int) -> list[int]:
    """The rows a pass of layer ``layer`` alone runs (a prefix residual's step)."""
    return [r for r in range(info.n_layers) if info.starts[r] == layer or info.reruns[r]]


def chunks(data: ProbeData, rows: int) -> Iterator[tuple[Tensor, Optional[Tensor], Tensor, dict[str, Tensor]]]:
    """Slices of the data: tokens, attention mask, loss weights and the source keywords (empty without one)."""
    step = min(data.n, rows)
    for s in range(0, data.n, step):
        am = None if data.attention_mask is None else data.attention_mask[s:s + step]
        yield data.tokens[s:s + step], am, data.weights[s:s + step], data.source(slice(s, s + step))


def repeat_source(source: dict[str, Tensor], k: int) -> dict[str, Tensor]:
    """The source keywords of a batch repeated ``k`` times, mask-major like the tokens."""
    return {name: _repeat(t, k) for name, t in source.items()}


@overload
def _repeat(t: Tensor, k: int) -> Tensor: ...
@overload
def _repeat(t: Optional[Tensor], k: int) -> Optional[Tensor]: ...
def _repeat(t: Optional[Tensor], k: int) -> Optional[Tensor]:
    if t is None or k == 1:
        return t
    return t.repeat(k, *([1] * (t.ndim - 1)))


def masked_stats(model: ProtocolModel, info: ModelInfo, data: ProbeData, masks: Shaped[Tensor, "k n_layers n_heads"],
                 *, means: Optional[Tensor] = None, base: Optional[Tensor] = None,
                 batch_size: Optional[int] = None) -> tuple[Float64[Tensor, " k"], Float64[Tensor, " k"]]:
    """Loss and accuracy of the model under each of ``masks`` (``[k, n_layers, n_heads]``).

    Returns float64 ``[k]`` tensors: the next-token cross-entropy and the argmax accuracy,
    averaged over the loss positions of the whole data (token-weighted). ``base`` is the mask
    whose residual stream is shared: every mask is grouped by the first layer where it differs
    from ``base`` and starts there (prefix reuse); it does not change any result.
    """
    L, H = info.n_layers, info.n_heads
    # identical masks (e.g. every order's "all heads pruned") are evaluated once
    masks, inverse = torch.unique(masks.to(info.device, torch.float32), dim=0, return_inverse=True)
    base = torch.ones(L, H, device=info.device) if base is None else base.to(info.device, torch.float32)
    k = masks.shape[0]
    if info.prefix_reuse:
        differs = (masks != base).any(-1)  # [k, n_layers]
        # the first (decoder) layer a differing row moves: a row's own layer; an encoder row's, layer 0
        starts = torch.tensor(info.starts, device=info.device)
        first = torch.where(differs, starts, torch.full_like(starts, info.depth)).amin(1)
    else:
        first = torch.zeros(k, dtype=torch.long, device=info.device)
    groups = [(int(layer), (first == layer).nonzero().flatten()) for layer in torch.unique(first)]
    rows = rows_per_pass(batch_size, data.pos, info.device, d_vocab=info.d_vocab)
    loss_sum = torch.zeros(k, dtype=torch.float64, device=info.device)
    correct_sum = torch.zeros(k, dtype=torch.float64, device=info.device)
    # The passes (masks riding together) are the same for every data chunk, so under torchrun each
    # pass, with all its chunks, belongs to one rank (probes._shard): the sum over ranks is exact.
    per_pass = max(1, rows // min(data.n, rows))
    passes = [(layer, idx[j:j + per_pass]) for layer, idx in groups for j in range(0, len(idx), per_pass)]
    passes = [p for i, p in enumerate(passes) if _shard.owner(i) == _shard.world()[0]]
    with eval_mode(model), torch.no_grad():
        for tok, am, w, src in chunks(data, rows):
            resid: list[Tensor] = []
            if info.prefix_reuse and passes:  # residual entering each needed layer, under the base mask, once
                resid.append(hooked_pass(model, info, tok, am, [], stop=0, source=src))
                for layer in range(max(layer for layer, _ in passes)):
                    hooks = _row_hooks(info, base[None], _rows_at(info, layer), means)
                    resid.append(hooked_pass(model, info, resid[layer], am, hooks, start=layer, stop=layer + 1,
                                             source=src))
            for layer, sel in passes:
                kk = len(sel)
                hooks = _row_hooks(info, masks[sel], _rows_from(info, layer), means)
                if info.prefix_reuse:
                    logits = hooked_pass(model, info, _repeat(resid[layer], kk), _repeat(am, kk), hooks, start=layer,
                                         source=repeat_source(src, kk))
                else:
                    logits = hooked_pass(model, info, _repeat(tok, kk), _repeat(am, kk), hooks,
                                         source=repeat_source(src, kk))
                nll, correct = token_nll(logits, tok, kk)
                loss_sum[sel] += (nll * w).sum((1, 2)).double()
                correct_sum[sel] += (correct.float() * w).sum((1, 2)).double()
    _shard.combine(loss_sum)
    _shard.combine(correct_sum)
    total = data.weights.sum().double()
    return (loss_sum / total)[inverse], (correct_sum / total)[inverse]


def masked_stats_until(model: ProtocolModel, info: ModelInfo, data: ProbeData,
                       masks: Shaped[Tensor, "k n_layers n_heads"], broken: Callable[[Tensor, Tensor], Tensor],
                       *, means: Optional[Tensor] = None, batch_size: Optional[int] = None, chunk: Optional[int] = None
                       ) -> tuple[Float64[Tensor, " k"], Float64[Tensor, " k"]]:
    """:func:`masked_stats` of ``masks`` in order, stopping after the chunk where ``broken(loss, acc)`` first holds.

    A prune curve is read only up to the first mask that breaks the model (``probes.pruning._prunable``),
    so the masks after it need not run: the losses up to and including it are the ones the full call
    gives (same passes, same chunks of data), the rest are NaN. ``chunk``: masks per call (default:
    as many as ride in one pass).
    """
    k = masks.shape[0]
    loss = torch.full((k,), float("nan"), dtype=torch.float64, device=info.device)
    acc = torch.full((k,), float("nan"), dtype=torch.float64, device=info.device)
    rows = rows_per_pass(batch_size, data.pos, info.device, d_vocab=info.d_vocab)
    step = chunk or max(1, rows // min(data.n, rows))
    for s in range(0, k, step):
        loss[s:s + step], acc[s:s + step] = masked_stats(model, info, data, masks[s:s + step], means=means,
                                                         batch_size=batch_size)
        if bool(broken(loss[s:s + step], acc[s:s + step]).any()):
            break
    return loss, acc


def source_real(info: ModelInfo, tok: Tensor, src: dict[str, Tensor]) -> Optional[Tensor]:
    """float64 ``[batch, src_pos]``, 1 on the source's real tokens, for a chunk of ``tok``; None for a decoder-only
    view. Without source keywords the model reads its default source, one token per row."""
    if not info.encoder_decoder:
        return None
    if "source_tokens" not in src:
        return torch.ones(tok.shape[0], 1, dtype=torch.float64, device=info.device)
    mask = src.get("source_mask")
    return torch.ones(src["source_tokens"].shape, dtype=torch.float64, device=info.device) if mask is None \
        else mask.double()


def is_encoder_row(info: ModelInfo, row: int) -> bool:
    """Whether mask row ``row`` gates encoder heads (whose positions are the source's)."""
    return bool(info.kinds) and info.kinds[row] == "encoder"


def stack_rows(per_row: list[Tensor]) -> Tensor:
    """``[rows, pos, ...]`` from per-row ``[pos_r, ...]`` tensors, zero-padded to the longest ``pos_r`` (an
    encoder-decoder's encoder rows span the source's positions, the others the decoder's)."""
    longest = max(t.shape[0] for t in per_row)
    return torch.stack([t if t.shape[0] == longest else
                        torch.cat((t, t.new_zeros(longest - t.shape[0], *t.shape[1:]))) for t in per_row])
