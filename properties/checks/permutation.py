"""Permutation equivariance: without positions, bidirectional attention treats the input as a set.

Self-attention with no positional information is a function of the multiset of tokens
applied position-wise (Lee et al. 2019, Set Transformer, Property 1), so
``f(x[:, pi]) == f(x)[:, pi]`` for every permutation pi. Deviation: scaled logit difference
(see ``_common.LOGIT_RTOL``).
"""

from __future__ import annotations

from hypothesis import strategies as st

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, max_len, scaled_deviation
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import permutations, token_batches


@model_property(name="permutation_equivariance", order=10, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE,
                applies=Applies(positional=("none",), attention=("bidirectional",), min_ctx=2))
def permutation_equivariance(case: Case) -> Plan:
    """``f(x[:, pi]) == f(x)[:, pi]`` for models with no positional embedding and bidirectional attention."""
    model, cfg = case.model, case.cfg
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

    return Plan(strategy, measure, describe)
