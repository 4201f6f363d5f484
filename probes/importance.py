"""Head importance: how much the loss depends on each attention head.

Five estimates, all through the gate mechanism of :mod:`probes.gates`:

- ``ablation``: remove one head at a time (its ``hook_z`` output set to 0) and measure the
  change of the next-token loss, exactly (leave-one-out);
- ``mean_ablation``: replace the head's output by its per-position mean over the data, which
  removes what the head computes from the input without moving the residual stream off its
  usual range;
- ``gradient``: Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?",
  eq. 2: ``I_h = E_x |dL(x)/dxi_h|`` for a gate ``xi_h`` on the head's output held at 1; one
  forward and one backward pass. ``normalize=True`` divides each layer's scores by their L2 norm,
  as they do (§4.1, after Molchanov et al. 2017).
- ``attribution``: attribution patching (Nanda 2023; Syed et al. 2023), the first-order estimate
  of the mean-ablation loss change, ``sum (mean - z) . dL/dz``, for every head from one forward and
  one backward pass (:mod:`probes.attribution`): the cheap ranking on models too large for exact
  leave-one-out of every head;
- ``l0_gates``: Voita et al. (2019), §4: hard-concrete gates (Louizos et al. 2018) on every head,
  trained on the frozen model with the task loss plus an L0 penalty; the importance is each gate's
  probability of being non-zero (:mod:`probes.l0_gates`; options in :class:`probes.L0Options`).

A larger importance means a more important head; for the ablations importance is the loss change
itself (it may be negative: removing the head helps).
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel
from harness.errors import AttnlabError
from probes import _head_stats, gates, l0_gates
from probes._stacks import with_kinds
from probes._validate import (
    METHODS,
    ModelInfo,
    ProbeData,
    check_batch_size,
    check_bool,
    check_choice,
    probe_inputs,
    takes_any_model,
)
from probes.attribution import attribution


def leave_one_out(model: ProtocolModel, info: ModelInfo, data: ProbeData, *, base: Optional[Tensor] = None,
                  means: Optional[Tensor] = None, batch_size: Optional[int] = None,
                  heads: Optional[Tensor] = None) -> tuple[Tensor, float]:
    """Loss change ``[n_layers, n_heads]`` from removing each head still on in ``base``, and the base loss.

    Heads already off in ``base`` get NaN. The base itself rides in the same batched call. ``heads``
    (flat indices ``layer * n_heads + head``) limits the exact answer to those heads, the rest NaN:
    the top candidates of a cheap estimator, on a model too large for every head.
    """
    L, H = info.n_layers, info.n_heads
    base = torch.ones(L, H, device=info.device) if base is None else base.to(info.device, torch.float32)
    on = base.flatten().nonzero().flatten()
    if heads is not None:
        on = on[torch.isin(on, heads.to(on.device))]
    masks = base.flatten().repeat(len(on) + 1, 1)  # row 0: the base itself
    masks[torch.arange(1, len(on) + 1, device=info.device), on] = 0
    loss, _ = gates.masked_stats(model, info, data, masks.view(-1, L, H), means=means, base=base,
                                 batch_size=batch_size)
    delta = torch.full((L * H,), float("nan"), dtype=torch.float64, device=info.device)
    delta[on] = loss[1:] - loss[0]
    return delta.view(L, H), float(loss[0])


def importance_scores(model: ProtocolModel, info: ModelInfo, data: ProbeData, method: str, *,
                      base: Optional[Tensor] = None, means: Optional[Tensor] = None, batch_size: Optional[int] = None,
                      l0: Optional[l0_gates.L0Options] = None) -> tuple[Tensor, Tensor]:
    """``(importance, loss_delta)``, each ``[n_layers, n_heads]`` float64, for an already validated call.

    ``l0_gates`` has no measured loss change: its ``loss_delta`` is NaN."""
    if method == "gradient":
        return _head_stats.gate_gradients(model, info, data, base=base, means=means, batch_size=batch_size)
    if method == "attribution":
        if base is not None:
            raise AttnlabError("method='attribution' estimates removing one head from the intact model; it cannot "
                               "re-estimate on a pruned one: expected reestimate=False or another method")
        est = attribution(model, info, data, batch_size=batch_size).mean_delta
        return est, est
    if method == "l0_gates":
        probs, _ = l0_gates.train_gates(model, info, data, l0_gates.L0Options() if l0 is None else l0, base=base)
        return probs, torch.full_like(probs, float("nan"))
    delta, _ = leave_one_out(model, info, data, base=base, means=means, batch_size=batch_size)
    return delta, delta


def layer_normalize(scores: Tensor) -> Tensor:
    """Divide each layer's scores by their L2 norm (Michel et al. 2019 §4.1); an all-zero layer stays 0."""
    finite = torch.nan_to_num(scores, nan=0.0)
    norm = finite.norm(dim=1, keepdim=True)
    return torch.where(norm > 0, scores / norm.clamp(min=torch.finfo(scores.dtype).tiny), scores)


@takes_any_model
def head_importance(model: AnyModel, tokens: Tensor, *, loss_mask: Optional[Tensor] = None, method: str = "ablation",
                    batch_size: Optional[int] = None, normalize: bool = False,
                    attention_mask: Optional[Tensor] = None,
                    l0_options: Optional[l0_gates.L0Options] = None, heads: Any = None,
                    source_tokens: Optional[Tensor] = None, source_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """Importance of every head: ``DataFrame[layer, head, importance, loss_delta]``.

    An encoder-decoder (``cfg.is_encoder_decoder``) has three kinds of heads, and the frame leads with a
    ``kind`` column: ``encoder`` (the encoder's self-attention), ``decoder`` (the decoder's) and ``cross``
    (its cross-attention), each gated through its own ``hook_z``, ``layer`` counting within its stack. Its
    ``tokens`` are the decoder's input and the loss the decoder's NLL of its targets given the source,
    ``source_tokens`` ``[n, src_pos]`` under ``source_mask`` (1 real, 0 padding; no source: the model's
    default one). ``heads`` then indexes the rows in that order: encoder layers, decoder, cross.

    ``tokens`` ``[n, pos]``; the loss is the next-token cross-entropy over the targets selected by
    ``loss_mask`` (``loss_mask[i, t]`` = 1: token t counts when predicted from position t-1; None:
    every target). ``loss_delta`` is the loss change when the head is removed: measured for the
    ablations, the first-order estimate ``-dL/dxi_h`` for ``gradient`` and that of mean ablation for
    ``attribution``. ``normalize`` applies the
    per-layer L2 normalization to ``importance``. ``batch_size`` bounds the sequences per forward
    pass (copies for different masks count separately). ``attrs["baseline_loss"]`` holds the
    unablated loss for the ablation methods. For ``l0_gates``, ``importance`` is each gate's
    probability of being non-zero after training (``l0_options``, default :class:`probes.L0Options`:
    its seed makes the call deterministic), ``loss_delta`` is NaN, and ``attrs`` holds the gates'
    last task loss and expected number of open gates. ``heads`` (flat indices ``layer * n_heads + head``)
    limits the ablations to those heads, every other row NaN: the exact answer for a few candidates.
    """
    check_method(method)
    check_bool("normalize", normalize)
    batch_size = check_batch_size(batch_size)
    l0 = l0_gates.check_options(l0_options)
    model, info, data = probe_inputs(model, tokens, all_heads=True, loss_mask=loss_mask, attention_mask=attention_mask,
                                     source_tokens=source_tokens, source_mask=source_mask)
    subset = _check_heads(heads, info, method)
    means = _head_stats.ablation_means(model, info, data, method, batch_size=batch_size)
    baseline, extra = None, dict[str, Any]()
    if method == "gradient":
        importance, delta = _head_stats.gate_gradients(model, info, data, batch_size=batch_size)
    elif method == "attribution":
        importance, delta = importance_scores(model, info, data, method, batch_size=batch_size)
    elif method == "l0_gates":
        importance, extra = l0_gates.train_gates(model, info, data, l0)
        delta = torch.full_like(importance, float("nan"))
    else:
        delta, baseline = leave_one_out(model, info, data, means=means, batch_size=batch_size, heads=subset)
        importance = delta
    if normalize:
        importance = layer_normalize(importance)
    return with_kinds(importance_frame(importance, delta, method=method, normalize=normalize, baseline_loss=baseline,
                                       **extra), info)


def check_method(method: Any) -> str:
    """``method`` names an importance estimate (:data:`METHODS`): what a probe that ranks or removes heads by
    importance (:func:`head_importance`, :mod:`probes.pruning`) takes."""
    return check_choice("method", method, METHODS)


def _check_heads(heads: Any, info: ModelInfo, method: str) -> Optional[Tensor]:
    if heads is None:
        return None
    n = info.n_layers * info.n_heads
    if method not in ("ablation", "mean_ablation"):
        raise AttnlabError(f"heads={heads!r} is for the ablation methods (one masked pass per head), not {method!r}")
    flat = torch.as_tensor(heads) if not isinstance(heads, Tensor) else heads
    if flat.ndim != 1 or flat.dtype.is_floating_point or flat.dtype == torch.bool or \
            (len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= n)):
        raise AttnlabError(f"heads={heads!r} is invalid: expected flat head indices layer * n_heads + head in [0, {n})")
    return flat.long()


def importance_frame(importance: Tensor, delta: Tensor, **attrs: Any) -> pd.DataFrame:
    """``DataFrame[layer, head, importance, loss_delta]`` from two ``[n_layers, n_heads]`` tensors; ``attrs`` kept."""
    L, H = importance.shape
    frame = pd.DataFrame({
        "layer": torch.arange(L).repeat_interleave(H).numpy(),
        "head": torch.arange(H).repeat(L).numpy(),
        "importance": importance.flatten().cpu().numpy(),
        "loss_delta": delta.flatten().cpu().numpy(),
    })
    frame.attrs.update(attrs)
    return frame
