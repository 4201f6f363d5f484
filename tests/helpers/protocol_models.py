"""Small protocol models for the observability tests: silent or unreadable hooks, and a plain module.

``SilentPattern``: hook_pattern is registered but the forward pass goes around it (as OPT's does
through the bridge); ``TuplePattern``: hook_pattern receives a tuple, which the harness's saver
cannot clone; ``PlainLM``: a user's own causal LM with no TransformerLens and no hook points.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tests.mutants.base import RefAttention, RefConfig, RefModel


class SilentPattern(RefAttention):
    """hook_pattern is registered (so it is in hook_dict) but the forward pass goes around it (OPT via the bridge)."""

    @property
    def hook_pattern(self):  # shadows the registered HookPoint for attribute access only
        return lambda pattern: pattern


class TuplePattern(RefAttention):
    """hook_pattern receives a tuple: the harness's saver cannot clone it."""

    def normalize(self, scores, allowed):
        return _Wrapped(scores.softmax(-1))

    def kernel(self, raw_scores, pattern, v, q_idx, k_idx, key_mask):
        return super().kernel(raw_scores, pattern[0], v, q_idx, k_idx, key_mask)


class _Wrapped(tuple):
    def __new__(cls, t):
        return super().__new__(cls, (t,))


def ref_model(attention: type, cfg: RefConfig = RefConfig(n_layers=1)) -> RefModel:
    return type(f"{attention.__name__}Model", (RefModel,), {"attention_cls": attention})(cfg)


class PlainLM(nn.Module):
    """A user's own causal LM: one attention head, no positions, no TransformerLens, no hook points."""

    def __init__(self, vocab: int = 16, d: int = 16, use_mask: bool = True):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.emb = nn.Parameter(torch.randn(vocab, d, generator=gen))
        self.qkv = nn.Parameter(torch.randn(d, 3 * d, generator=gen) / math.sqrt(d))
        self.out = nn.Parameter(torch.randn(d, vocab, generator=gen) / math.sqrt(d))
        self.use_mask = use_mask

    def forward(self, tokens, attention_mask=None, position_offset=0):
        x = self.emb[tokens]
        q, k, v = (x @ self.qkv).chunk(3, -1)
        n = tokens.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
        if attention_mask is not None and self.use_mask:
            allowed = (allowed & attention_mask.bool()[:, None, :]) | torch.eye(n, dtype=torch.bool)
        scores = (q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
        return (x + scores.softmax(-1) @ v) @ self.out
