"""A one-layer model built by hand so exactly one head matters (the L0-gate and estimator tests share it)."""

from __future__ import annotations

import torch

from harness import ModelConfig, Transformer

D_VOCAB, D_HEAD, N_HEADS = 8, 8, 4


def constructed_model() -> Transformer:
    """One attention-only layer, no norms: head 1 alone carries the current token to the unembedding,
    which reads only the subspace head 1 writes; head 0 (and 2, 3) have W_O = 0.

    On sequences that repeat one token, predicting the next token = copying the current one, which
    only head 1 can do (attention over identical tokens reads the same value anywhere): removing it
    leaves a uniform prediction (loss log 8), removing any other head changes nothing.
    """
    cfg = ModelConfig(n_layers=1, d_model=2 * D_VOCAB, n_heads=N_HEADS, d_head=D_HEAD, d_vocab=D_VOCAB,
                      n_ctx=16, attn_only=True, normalization_type=None, positional_embedding_type="none",
                      attn_bias=False)
    model = Transformer(cfg)
    hd = N_HEADS * D_HEAD
    with torch.no_grad():
        model.embed.weight.zero_()
        model.embed.weight[:, :D_VOCAB] = torch.eye(D_VOCAB)  # token v -> e_v in the first half
        model.unembed.weight.zero_()
        model.unembed.weight[:, D_VOCAB:] = 10 * torch.eye(D_VOCAB)  # logits read only the second half
        if model.unembed.bias is not None:
            model.unembed.bias.zero_()
        w = model.blocks[0].attn.qkv.weight
        w[2 * hd:] = 0
        w[2 * hd + D_HEAD: 2 * hd + 2 * D_HEAD, :D_VOCAB] = torch.eye(D_VOCAB)  # head 1's value = e_v
        o = model.blocks[0].attn.o.weight
        o.zero_()
        o[D_VOCAB:, D_HEAD: 2 * D_HEAD] = torch.eye(D_VOCAB)  # head 1 writes it into the second half
    return model.eval()


def constant_tokens(n: int = 24, pos: int = 12) -> torch.Tensor:
    return torch.randint(0, D_VOCAB, (n, 1), generator=torch.Generator().manual_seed(3)).expand(n, pos).contiguous()
