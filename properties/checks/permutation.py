"""Permutation equivariance: without positions, bidirectional attention treats the input as a set.

Self-attention with no positional information is a function of the multiset of tokens
applied position-wise (Lee et al. 2019, Set Transformer, Property 1), so
``f(x[:, pi]) == f(x)[:, pi]`` for every permutation pi. Deviation: scaled logit difference
(see ``_common.LOGIT_RTOL``).
"""

from __future__ import annotations

from hypothesis import strategies as st

from harness.adapters.protocol import check_protocol, forward_capture
from properties.checks._common import LOGIT_RTOL, fmt, max_len, scaled_deviation
from properties.search import PropertyResult, search
from properties.strategies import permutations, token_batches

NAME = "permutation_equivariance"


def permutation_equivariance(model, *, seed: int = 0, max_examples: int | None = None,
                             observed: set[str] | None = None) -> PropertyResult:
    """``f(x[:, pi]) == f(x)[:, pi]`` for models with no positional embedding and bidirectional attention."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if cfg.positional_embedding_type != "none" or cfg.attention_dir != "bidirectional" or cfg.n_ctx < 2:
        return PropertyResult.not_applicable(NAME, LOGIT_RTOL)
    tokens = token_batches(cfg.d_vocab, max_batch=2, min_len=2, max_len=max_len(cfg))
    strategy = tokens.flatmap(lambda x: st.tuples(st.just(x), permutations(x.shape[1])))

    def measure(example):
        x, perm = example
        permuted, _ = forward_capture(model, x[:, perm])
        reference, _ = forward_capture(model, x)
        dev, idx = scaled_deviation(permuted, reference[:, perm])
        return dev, f"logits differ by {fmt(dev)} at (row, pos, vocab)={idx}"

    def describe(example):
        x, perm = example
        return f"tokens={x.tolist()} perm={perm.tolist()}"

    return search(NAME, LOGIT_RTOL, strategy, measure, describe, seed=seed, max_examples=max_examples)
