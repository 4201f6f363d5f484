"""Autoregressive sampling with a KV cache.

Incremental decoding must give the logits a full recompute gives: each step feeds only the new
token, its keys and values are written into the cache's preallocated storage, and its position is
the number of real tokens before it (so a left-padded batch decodes like its unpadded rows).
"""

from __future__ import annotations

from typing import Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from harness._checks import check_int, check_number
from harness.errors import AttnlabError
from harness.model.inputs import check_mask, check_tokens
from harness.model.kv_cache import KVCache


def _check(model, tokens, max_new_tokens, temperature, top_k) -> None:
    cfg = model.config
    check_int("max_new_tokens", max_new_tokens, 0)
    # finite=False: generate's contract is the lower bound only, as it always was
    check_number("temperature", temperature, 0, low_inclusive=True, finite=False,
                 expected="a number >= 0 (0 = greedy)")
    check_int("top_k", top_k, 1, cfg.d_vocab, none_ok=True)
    if cfg.attention_dir != "causal":
        raise AttnlabError("generate needs a causal model: attention_dir='bidirectional' lets every token see "
                           "the future")
    check_tokens(tokens, cfg.d_vocab)


def sample(logits: Float[Tensor, "batch d_vocab"], temperature: float, top_k: Optional[int],
           generator: Optional[torch.Generator]) -> Int[Tensor, " batch"]:
    """Next token ids ``[batch]`` from last-position logits ``[batch, d_vocab]``."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model, tokens: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: Optional[int] = None, attention_mask: Optional[Tensor] = None,
             generator: Optional[torch.Generator] = None, use_cache: bool = True,
             return_logits: bool = False
             ) -> Int[Tensor, "batch total"] | tuple[Int[Tensor, "batch total"], Float[Tensor, "batch new d_vocab"]]:
    """Tokens ``[batch, pos + max_new_tokens]`` (and, with ``return_logits``, the logits that
    chose each new token, ``[batch, max_new_tokens, d_vocab]``)."""
    _check(model, tokens, max_new_tokens, temperature, top_k)
    batch, pos = tokens.shape
    mask = check_mask(attention_mask, batch, pos)
    if mask is None:
        mask = torch.ones(batch, pos, dtype=torch.bool, device=tokens.device)
    if model.config.positional_embedding_type == "standard":
        last = int(mask.sum(-1).max()) + max_new_tokens - 1
        if last > model.config.n_ctx:
            raise AttnlabError(f"generating {max_new_tokens} tokens reaches position {last - 1}: expected positions "
                               f"< n_ctx={model.config.n_ctx} for the learned position table")
    total = pos + max_new_tokens
    # the final length is known: tokens, mask and the cache's storage are allocated once, written in place
    out = torch.cat((tokens, tokens.new_zeros(batch, max_new_tokens)), dim=1)
    mask = torch.cat((mask.bool(), mask.new_ones(batch, max_new_tokens, dtype=torch.bool)), dim=1)
    cache = KVCache(model.config.n_layers, capacity=max(total, 1)) if use_cache else None
    steps = []
    logits = model(tokens, attention_mask=mask[:, :pos], kv_cache=cache)[:, -1]
    for i in range(max_new_tokens):
        steps.append(logits)
        out[:, pos + i] = sample(logits, temperature, top_k, generator)
        if i + 1 == max_new_tokens:
            break
        if cache is not None:
            logits = model(out[:, pos + i:pos + i + 1], kv_cache=cache)[:, -1]
        else:
            logits = model(out[:, :pos + i + 1], attention_mask=mask[:, :pos + i + 1])[:, -1]
    if return_logits:
        empty = tokens.new_zeros((batch, 0, model.config.d_vocab), dtype=torch.float32)
        return out, (torch.stack(steps, dim=1) if steps else empty)
    return out
