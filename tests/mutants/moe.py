"""Mixture-of-experts variants of the reference model (tests/mutants/base.py) for batch_independence.

Every block's MLP is a top-1 mixture of experts (Fedus et al. 2021, Switch Transformers §2.1: each token goes to
the expert of its largest router logit, scaled by that expert's softmax gate). ``CapacityMoE`` counts an expert
capacity over the whole batch, as NLLB-MoE's router does on its flattened input (Switch §2.2 "expert capacity";
Lepikhin et al. 2020, GShard): the tokens an expert receives past its capacity, in batch order, are dropped (the
block passes them through on the residual). That is a design, declared by ``cfg.expert_capacity``
(``DesignFacts.expert_capacity``); the mutants are the same router with the capacity undeclared, and a router that
normalises its logits over the whole batch, which no capacity excuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from tests.mutants.base import RefConfig, RefModel

N_EXPERTS = 2
CAPACITY = 2  # tokens per expert per forward pass, all rows together


@dataclass(frozen=True)
class MoeConfig(RefConfig):
    """The reference config that declares its router's batch-wide capacity (``DesignFacts.expert_capacity``)."""

    expert_capacity: Optional[int] = CAPACITY


class CapacityMoE(nn.Module):
    def __init__(self, cfg: RefConfig, capacity: int = CAPACITY):
        super().__init__()
        self.capacity = capacity
        self.router = nn.Linear(cfg.d_model, N_EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(cfg.d_model, cfg.d_mlp), nn.GELU(),
                                                   nn.Linear(cfg.d_mlp, cfg.d_model)) for _ in range(N_EXPERTS))

    def route(self, logits: Tensor) -> Tensor:
        """``[tokens, experts]`` gates from ``[tokens, experts]`` logits: a softmax per token."""
        return logits.softmax(-1)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # the batch flattened: capacity is counted over every row's tokens
        gates = self.route(self.router(flat))
        choice = gates.argmax(-1)
        onehot = nn.functional.one_hot(choice, N_EXPERTS)
        kept = (onehot.cumsum(0) * onehot).sum(-1) <= self.capacity  # the token's place in its expert's queue
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            sel = (choice == e) & kept
            out[sel] = expert(flat[sel]) * gates[sel, e:e + 1]
        return out.reshape(x.shape)


class BatchSoftmaxMoE(CapacityMoE):
    def route(self, logits):
        return logits.softmax(0)  # normalised over every token of the batch: another row's tokens move the gates


class MoeModel(RefModel):
    moe_cls: type = CapacityMoE

    def __init__(self, cfg: RefConfig):
        super().__init__(cfg)
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        for block in self.blocks:
            block.mlp = self.moe_cls(cfg)
            with torch.no_grad():  # LeCun init, as the reference's
                for p in block.mlp.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5 if p.ndim == 2 else 0 * p)
        self.setup()


class BatchSoftmaxMoeModel(MoeModel):
    moe_cls = BatchSoftmaxMoE
