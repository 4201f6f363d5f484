"""A hand-built protocol model whose heads attend by rule, for closed-form probe checks.

It is a plain ``HookedRootModule`` (not attnlab's Transformer): no ``start_at_layer``, so the
probes run it without prefix reuse, as they would a user's own model.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


def rule_pattern(rule: str, tokens: Tensor, real: Tensor) -> Tensor:
    """``[b, q, k]`` attention of one rule head: uniform over its key set, itself when the set is empty."""
    b, p = tokens.shape
    out = torch.zeros(b, p, p)
    for i in range(b):
        first = int(real[i].long().argmax())
        for q in range(p):
            if not real[i, q]:
                out[i, q, q] = 1.0
                continue
            seen = [k for k in range(q + 1) if real[i, k]]
            if rule == "previous_token":
                keys = [q - 1] if q - 1 in seen else []
            elif rule == "first_token":
                keys = [first] if q > first else []
            elif rule == "uniform":
                keys = seen
            elif rule == "induction":
                keys = [k for k in seen if k < q and k - 1 in seen and tokens[i, k - 1] == tokens[i, q]]
            elif rule == "duplicate_token":
                keys = [k for k in seen if k < q and tokens[i, k] == tokens[i, q]]
            else:
                raise ValueError(rule)
            for k in keys or [q]:
                out[i, q, k] = 1.0 / len(keys or [q])
    return out


class FixedPatternModel(HookedRootModule):
    """One causal layer of five rule heads; values, output and unembedding are ordinary linear maps."""

    RULES = ("previous_token", "first_token", "uniform", "induction", "duplicate_token")

    def __init__(self, d_vocab: int = 12, d_head: int = 4, d_model: int = 16, seed: int = 0):
        super().__init__()
        H = len(self.RULES)
        self.cfg = SimpleNamespace(n_layers=1, n_heads=H, d_head=d_head, d_model=d_model, d_vocab=d_vocab,
                                   n_ctx=64, positional_embedding_type="none", attention_dir="causal")
        torch.manual_seed(seed)
        self.embed = nn.Embedding(d_vocab, d_model)
        self.blocks = nn.ModuleList([nn.Module()])
        attn = nn.Module()
        attn.v = nn.Linear(d_model, H * d_head)
        attn.o = nn.Linear(H * d_head, d_model)
        attn.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        attn.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        self.blocks[0].attn = attn
        self.unembed = nn.Linear(d_model, d_vocab)
        self.setup()

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        real = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.embed(tokens)
        attn = self.blocks[0].attn
        b, p, _ = x.shape
        H, dh = self.cfg.n_heads, self.cfg.d_head
        pattern = torch.stack([rule_pattern(r, tokens, real) for r in self.RULES], dim=1)
        pattern = attn.hook_pattern(pattern)
        v = attn.v(x).view(b, p, H, dh).transpose(1, 2)
        z = attn.hook_z((pattern @ v).transpose(1, 2))
        x = x + attn.o(z.reshape(b, p, H * dh))
        return self.unembed(x)
