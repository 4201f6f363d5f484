"""Per-head statistics over the data, from the pass runner in :mod:`probes.gates`: each head's mean output
(the replacement of mean ablation) and the gradients of the loss by head gates (gradient importance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, cast

import torch
from jaxtyping import Float, Float64
from torch import Tensor

from harness.adapters.protocol import ProtocolModel
from probes._nll import token_nll
from probes._validate import ModelInfo, ProbeData
from probes.gates import (
    chunks,
    eval_mode,
    grad_rows,
    hooked_pass,
    is_encoder_row,
    rows_per_pass,
    source_real,
    stack_rows,
)


def ablation_means(model: ProtocolModel, info: ModelInfo, data: ProbeData, method: str, *,
                   batch_size: Optional[int] = None) -> Optional[Tensor]:
    """The :func:`head_means` that ``method`` replaces a removed head's output with: ``mean_ablation``'s;
    every other method zeroes the head (None, and no pass)."""
    return head_means(model, info, data, batch_size=batch_size) if method == "mean_ablation" else None


def head_means(model: ProtocolModel, info: ModelInfo, data: ProbeData, *, batch_size: Optional[int] = None
               ) -> Float[Tensor, "n_layers pos n_heads d_head"]:
    """Per-position mean of every head's ``hook_z`` over the data's real tokens.

    ``[n_layers, pos, n_heads, d_head]``; a position that is padding in every sequence gets 0.
    This is the replacement of mean ablation: the head's output no longer depends on the input.
    An encoder-decoder's encoder rows average over the real source tokens, per source position
    (``pos`` is then the longer of the decoder's and the source's, the rest zeros).
    """
    sums: dict[int, Tensor] = {}
    count = torch.zeros(data.pos, dtype=torch.float64, device=info.device)
    src_count: Optional[Tensor] = None

    def capture(layer: int, real: Tensor) -> Callable:
        def fn(z: Tensor, hook: Any) -> None:
            s = (z.double() * real[:, :, None, None]).sum(0)  # [pos, n_heads, d_head]: one layer, one chunk
            sums[layer] = s if layer not in sums else sums[layer] + s
        return fn

    with eval_mode(model), torch.no_grad():
        for tok, am, _, src in chunks(data, rows_per_pass(batch_size, data.pos, info.device, d_vocab=info.d_vocab)):
            real = torch.ones(tok.shape, dtype=torch.float64, device=info.device) if am is None else am.double()
            count += real.sum(0)
            sreal = source_real(info, tok, src)
            if sreal is not None:
                src_count = sreal.sum(0) if src_count is None else src_count + sreal.sum(0)
            hooks = [(info.z_hooks[row], capture(row, cast(Tensor, sreal) if is_encoder_row(info, row) else real))
                     for row in range(info.n_layers)]
            # only activations are needed: the pass ends at the last head output it reads (the last row's, an
            # encoder-decoder's last cross-attention), so the rest of that layer, ln_final and the unembedding
            # never run, on any model
            hooked_pass(model, info, tok, am, hooks, source=src, until=info.z_hooks[-1])
    denom = count.clamp(min=1)[:, None, None]
    src_denom = None if src_count is None else src_count.clamp(min=1)[:, None, None]
    return stack_rows([sums[row] / (cast(Tensor, src_denom) if is_encoder_row(info, row) else denom)
                       for row in range(info.n_layers)]).float()


def gate_gradients(model: ProtocolModel, info: ModelInfo, data: ProbeData, *, base: Optional[Tensor] = None,
                   means: Optional[Tensor] = None, batch_size: Optional[int] = None
                   ) -> tuple[Float64[Tensor, "n_layers n_heads"], Float64[Tensor, "n_layers n_heads"]]:
    """Gradients of the loss by head gates xi = 1 (Michel, Levy & Neubig 2019, eq. 2 and §4.1).

    Each sequence x gets its own gates, so one forward and one backward give every per-sequence
    gradient dL(x)/dxi_h, where L(x) is the sequence's mean loss over its loss positions.
    Returns ``(importance, expected_delta)``, both ``[n_layers, n_heads]`` float64:
    ``importance = E_x |dL(x)/dxi_h|`` over sequences with a loss position (their I_h), and
    ``expected_delta = -dL/dxi_h`` of the token-weighted loss, the first-order (Taylor) estimate
    of the loss change when the gate goes from 1 to 0. Heads already off in ``base`` stay off.
    """
    L, H = info.n_layers, info.n_heads
    base = torch.ones(L, H, device=info.device) if base is None else base.to(info.device, torch.float32)
    abs_sum = torch.zeros(L, H, dtype=torch.float64, device=info.device)
    signed_sum = torch.zeros(L, H, dtype=torch.float64, device=info.device)
    n_seqs = 0

    def gated(layer: int, gates: Tensor) -> Callable:
        def fn(z: Tensor, hook: Any) -> Tensor:
            g = (base[layer] * gates[:, layer]).to(z.dtype)[:, None, :, None]  # [batch, 1, n_heads, 1]
            out = z * g
            if means is not None:  # a pruned head (base 0) keeps its mean output
                out = out + (1 - base[layer]).to(z.dtype)[None, None, :, None] * means[layer][None, : z.shape[1]]
            return out
        return fn

    with eval_mode(model), torch.enable_grad():
        for tok, am, w, src in chunks(data, grad_rows(batch_size, info, data.pos)):
            gates = torch.ones(tok.shape[0], L, H, device=info.device, requires_grad=True)
            hooks = [(info.z_hooks[row], gated(row, gates)) for row in range(L)]
            logits = hooked_pass(model, info, tok, am, hooks, source=src)
            nll, _ = token_nll(logits, tok, 1)
            seq_w = w.sum(1)
            per_seq = (nll[0] * w).sum(1) / seq_w.clamp(min=1)
            (grad,) = torch.autograd.grad(per_seq.sum(), gates)
            grad = grad.double()
            valid = seq_w > 0
            abs_sum += grad[valid].abs().sum(0)
            signed_sum += (grad * seq_w.double()[:, None, None]).sum(0)  # d(token-weighted loss), unnormalised
            n_seqs += int(valid.sum())
    return abs_sum / max(n_seqs, 1), -signed_sum / data.weights.sum().double()
