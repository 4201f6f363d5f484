"""Attribution patching: every head's ablation effect, to first order, from one forward and one backward pass.

Replacing head h's output ``z`` (``hook_z``) by ``r`` changes the loss by about
``sum_x,pos (r - z) . dL/dz`` (a first-order Taylor step): Nanda (2023), "Attribution Patching:
Activation Patching At Industrial Scale"; Syed, Rager & Conmy (2023), "Attribution Patching
Outperforms Automated Circuit Discovery". With ``r = 0`` this is ``-dL/dxi_h`` for a gate ``xi_h``
on the head, the estimate Michel, Levy & Neubig (2019) read their gradient importance from; with
``r`` the head's per-position mean over the data it estimates mean ablation. Both need the same
``dL/dz``, and the means come from the same forward pass (``sum_pos mu[pos] . sum_x dL/dz_x[pos]``
only needs the sums), so one pass over the data gives every head's estimate of both, the gradient
importance and the means themselves: what :func:`probes._head_stats.gate_gradients` and
:func:`probes._head_stats.head_means` give separately, in one pass. Exact leave-one-out costs a masked
pass per head; these estimates rank the heads whose exact answer is worth computing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, cast

import torch
from jaxtyping import Float, Float64
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel
from probes import gates
from probes._nll import token_nll
from probes._validate import ModelInfo, ProbeData, check_batch_size, probe_inputs, takes_any_model


@dataclass
class Attribution:
    """One forward + backward pass's estimates, each ``[n_layers, n_heads]`` float64 (means excepted)."""

    gradient: Float64[Tensor, "n_layers n_heads"]  # Michel et al.'s I_h = E_x |dL(x)/dxi_h|
    zero_delta: Float64[Tensor, "n_layers n_heads"]  # first-order loss change of zero ablation, -dL/dxi_h
    mean_delta: Float64[Tensor, "n_layers n_heads"]  # first-order loss change of mean ablation
    means: Float[Tensor, "n_layers pos n_heads d_head"]  # per-position head means (probes._head_stats.head_means)


def attribution(model: ProtocolModel, info: ModelInfo, data: ProbeData, *, batch_size: Optional[int] = None
                ) -> Attribution:
    """Gradient importance, zero- and mean-ablation attribution and the head means, in one pass over ``data``."""
    L, H = info.n_layers, info.n_heads
    abs_sum = torch.zeros(L, H, dtype=torch.float64, device=info.device)
    signed_sum = torch.zeros(L, H, dtype=torch.float64, device=info.device)  # sum_x w_x dL(x)/dxi
    grad_z: dict[int, Tensor] = {}  # layer -> sum_x w_x dL(x)/dz_x, [pos, n_heads, d_head] float64
    z_sum: dict[int, Tensor] = {}  # layer -> sum over real tokens of z, [pos, n_heads, d_head] float64
    count = torch.zeros(data.pos, dtype=torch.float64, device=info.device)
    src_count: Optional[Tensor] = None
    n_seqs = 0

    def gated(layer: int, gate: Tensor, real: Tensor, seq_w: Tensor) -> Callable:
        def fn(z: Tensor, hook: Any) -> Tensor:
            s = (z.detach().double() * real[:, :, None, None]).sum(0)
            z_sum[layer] = s if layer not in z_sum else z_sum[layer] + s
            out = z * gate[:, layer].to(z.dtype)[:, None, :, None]

            def keep(g: Tensor) -> None:  # dL/dz of the per-sequence losses, weighted into the data loss
                gs = (g.double() * seq_w[:, None, None, None]).sum(0)
                grad_z[layer] = gs if layer not in grad_z else grad_z[layer] + gs
            out.register_hook(keep)
            return out
        return fn

    with gates.eval_mode(model), torch.enable_grad():
        for tok, am, w, src in gates.chunks(data, gates.grad_rows(batch_size, info, data.pos)):
            real = torch.ones(tok.shape, dtype=torch.float64, device=info.device) if am is None else am.double()
            count += real.sum(0)
            sreal = gates.source_real(info, tok, src)  # an encoder-decoder's encoder rows: the source's positions
            if sreal is not None:
                src_count = sreal.sum(0) if src_count is None else src_count + sreal.sum(0)
            gate = torch.ones(tok.shape[0], L, H, device=info.device, requires_grad=True)
            seq_w = w.sum(1)
            hooks = [(info.z_hooks[row], gated(row, gate, cast(Tensor, sreal) if gates.is_encoder_row(info, row)
                                               else real, seq_w.double())) for row in range(L)]
            logits = gates.hooked_pass(model, info, tok, am, hooks, source=src)
            nll, _ = token_nll(logits, tok, 1)
            per_seq = (nll[0] * w).sum(1) / seq_w.clamp(min=1)
            (grad,) = torch.autograd.grad(per_seq.sum(), gate)
            grad = grad.double()
            valid = seq_w > 0
            abs_sum += grad[valid].abs().sum(0)
            signed_sum += (grad * seq_w.double()[:, None, None]).sum(0)
            n_seqs += int(valid.sum())
    total = data.weights.sum().double()
    per_row = [z_sum[row] / cast(Tensor, src_count if gates.is_encoder_row(info, row) else count
                                 ).clamp(min=1)[:, None, None] for row in range(L)]
    means = gates.stack_rows(per_row)
    mean_dot = torch.stack([(per_row[row] * grad_z[row]).sum((0, 2)) if row in grad_z
                            else torch.zeros(H, dtype=torch.float64, device=info.device) for row in range(L)])
    return Attribution(gradient=abs_sum / max(n_seqs, 1), zero_delta=-signed_sum / total,
                       mean_delta=(mean_dot - signed_sum) / total, means=means.float())


@takes_any_model
def attribution_scores(model: AnyModel, tokens: Tensor, *, loss_mask: Optional[Tensor] = None,
                       attention_mask: Optional[Tensor] = None, batch_size: Optional[int] = None,
                       source_tokens: Optional[Tensor] = None, source_mask: Optional[Tensor] = None) -> Attribution:
    """:func:`attribution` of a model on ``tokens`` (as :func:`probes.head_importance` takes them), validated.

    An encoder-decoder's rows are its three kinds of heads (``probes._validate.KINDS``: encoder, decoder,
    cross), given ``source_tokens``/``source_mask`` as :func:`probes.head_importance` takes them."""
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, loss_mask=loss_mask, attention_mask=attention_mask,
                                     source_tokens=source_tokens, source_mask=source_mask)
    return attribution(model, info, data, batch_size=batch_size)
