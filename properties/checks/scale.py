"""Scaled dot-product scores: ``hook_attn_scores = q.k / sqrt(d_head) + mask + bias(i - j)``.

Vaswani et al. 2017 §3.2.1 (eq. 1) scale the dot products by 1/sqrt(d_k); q and k are read
from ``hook_q``/``hook_k`` (``hook_rot_q``/``hook_rot_k`` after RoPE, Su et al. 2021).
Allowed entries (causal: key <= query) must equal q.k/sqrt(d_head) plus a bias that may
depend only on the head and the query–key offset (ALiBi, Press et al. 2022; zero for every
other positional type): the bias is estimated as the mean residual on each diagonal and
the deviation is what that leaves, over ``max(1, max|q.k/sqrt(d_head)|, max|bias|)``.
Tolerance 1e-4: the two float32 dot products differ by summation order, ~d_head * 2^-24
relative. Masked entries must be <= -1e4 (their softmax weight then underflows to 0);
a masked entry above that counts as its excess over -1e4.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import all_heads, check_protocol, run
from properties.checks._common import fmt, max_len
from properties.search import PropertyResult, search
from properties.strategies import position_offsets, token_batches

NAME = "attention_scale"
TOLERANCE = 1e-4
MASK_CEILING = -1e4
MAX_OFFSET = 64


def _diagonal_bias(resid: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Per head, the mean of ``resid [batch, heads, q, k]`` over each diagonal q - k, as ``[heads, q, k]``."""
    n_q, n_k = allowed.shape
    offset = torch.arange(n_q)[:, None] - torch.arange(n_k)[None, :]
    bias = resid.new_zeros(resid.shape[1:])
    for d in offset[allowed].unique().tolist():
        sel = (offset == d) & allowed
        bias[:, sel] = resid[:, :, sel].mean(dim=(0, 2))[:, None]
    return bias


def attention_scale(model, *, seed: int = 0, max_examples: int | None = None) -> PropertyResult:
    """``hook_attn_scores`` is q.k/sqrt(d_head) plus the mask plus a bias of the query–key offset only."""
    check_protocol(model)
    cfg = model.cfg
    pos_type = cfg.positional_embedding_type
    qn, kn = ("hook_rot_q", "hook_rot_k") if pos_type == "rotary" else ("hook_q", "hook_k")
    names = {layer: [f"blocks.{layer}.attn.{h}" for h in (qn, kn, "hook_attn_scores")] for layer in range(cfg.n_layers)}
    n_max = max_len(cfg)

    @st.composite
    def strategy(draw):
        x = draw(token_batches(cfg.d_vocab, max_batch=2, max_len=n_max))
        return x, draw(position_offsets(min(MAX_OFFSET, cfg.n_ctx - x.shape[1])))  # positions stay < n_ctx

    def measure(example):
        x, offset = example
        _, acts = run(model, x, position_offset=offset, capture=[n for v in names.values() for n in v])
        n = x.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool)
        if cfg.attention_dir == "causal":
            allowed = allowed.tril()
        worst, where = 0.0, "scores match"
        for layer, (q_name, k_name, s_name) in names.items():
            q = all_heads(acts[q_name].double(), cfg.n_heads)
            k = all_heads(acts[k_name].double(), cfg.n_heads)
            scores = acts[s_name].double()  # [batch, n_heads, q, k]
            expected = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(cfg.d_head)
            resid = (scores - expected).where(allowed, scores.new_zeros(()))
            bias = _diagonal_bias(resid, allowed) if pos_type == "alibi" else torch.zeros_like(resid[0])
            scale = max(1.0, float(expected[..., allowed].abs().max()), float(bias.abs().max()))
            err = ((resid - bias).abs() / scale).where(allowed, resid.new_zeros(())).nan_to_num(nan=math.inf)
            if float(err.max()) > worst:
                worst = float(err.max())
                b, h, i, j = (int(t) for t in (err == err.max()).nonzero()[0])
                where = (f"layer {layer} head {h} (q {i}, k {j}, row {b}): score {fmt(float(scores[b, h, i, j]))}, "
                         f"q.k/sqrt(d_head) {fmt(float(expected[b, h, i, j]))}"
                         + (f", diagonal bias {fmt(float(bias[h, i, j]))}" if pos_type == "alibi" else ""))
            masked = scores.where(~allowed, scores.new_full((), -math.inf)).nan_to_num(nan=math.inf)
            excess = float(masked.max()) - MASK_CEILING
            if excess > worst:
                worst = excess
                b, h, i, j = (int(t) for t in (masked == masked.max()).nonzero()[0])
                where = (f"layer {layer} head {h}: masked score (q {i}, k {j}, row {b}) is "
                         f"{fmt(float(scores[b, h, i, j]))}, expected <= {MASK_CEILING:g}")
        return worst, where

    def describe(example):
        x, offset = example
        return f"tokens={x.tolist()} position_offset={offset}"

    return search(NAME, TOLERANCE, strategy(), measure, describe, seed=seed, max_examples=max_examples)
