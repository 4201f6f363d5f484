"""Softmax saturation versus d_k: why attention scores are scaled by 1/sqrt(d_k).

Vaswani et al. 2017 §3.2.1: if the components of q and k are independent with mean 0 and
variance 1, q·k has variance d_k; large dot products push the softmax into regions with
extremely small gradients, so the scores are scaled by 1/sqrt(d_k). :func:`saturation_sweep`
measures this on freshly initialised ``harness`` attention: one head of width d_head, unit-
variance inputs, and LeCun initialisation std 1/sqrt(d_model), under which q and k have
unit-variance components as the argument assumes. Unscaled, the score variance grows like
d_head (log–log slope 1), the pattern collapses onto one key (entropy -> 0, max weight -> 1)
and the softmax Jacobian, hence the gradient reaching W_Q and W_K, vanishes; scaled, all of
these stay flat (slope 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from harness import ModelConfig, Transformer
from harness._checks import check_int, check_ints
from harness.adapters.protocol import FwdHooks
from harness.errors import AttnlabError

COLUMNS = ["d_head", "scaled", "seed", "score_var", "entropy", "max_prob", "jacobian_norm", "qk_grad_norm"]


def softmax_jacobian_norm(p: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of the softmax Jacobian diag(p) - p p^T for each row of ``p [..., k]``.

    ||J||_F^2 = sum p_i^2 - 2 sum p_i^3 + (sum p_i^2)^2 (expand the diagonal and off-diagonal terms).
    """
    s2, s3 = p.pow(2).sum(-1), p.pow(3).sum(-1)
    return (s2 - 2 * s3 + s2.pow(2)).clamp(min=0).sqrt()


def _measure(d_head: int, scaled: bool, seed: int, d_model: int, n_pos: int, batch: int) -> dict:
    cfg = ModelConfig(n_layers=1, d_model=d_model, n_heads=1, d_head=d_head, d_vocab=2, n_ctx=n_pos,
                      attn_only=True, normalization_type=None, positional_embedding_type="none",
                      attention_dir="bidirectional", use_attn_scale=scaled, attn_bias=False,
                      init_range=1.0 / math.sqrt(d_model), seed=seed)
    model = Transformer(cfg)
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    x = torch.randn(batch, n_pos, d_model, generator=gen)  # unit-variance inputs
    # dL/dz of a random linear loss, normalized so dL/dpattern = upstream . v has unit scale at every d_head
    upstream = torch.randn(batch, n_pos, 1, d_head, generator=gen) / math.sqrt(d_head)
    acts: dict[str, torch.Tensor] = {}

    def keep(name: str, retain: bool = False):
        def fn(t: torch.Tensor, hook) -> None:
            if retain:
                t.retain_grad()
            acts[name] = t
        return fn

    hooks: FwdHooks = [("blocks.0.attn.hook_q", keep("q", True)), ("blocks.0.attn.hook_k", keep("k", True)),
             ("blocks.0.attn.hook_attn_scores", keep("scores")), ("blocks.0.attn.hook_pattern", keep("pattern")),
             ("blocks.0.attn.hook_z", keep("z"))]
    with model.hooks(fwd_hooks=hooks):
        model(x, start_at_layer=0, stop_at_layer=1)
    (acts["z"] * upstream).sum().backward()
    p = acts["pattern"].detach().double()  # [batch, 1, q, k]
    entropy = -(p * p.clamp(min=1e-300).log()).sum(-1)
    q_grad, k_grad = cast(Tensor, acts["q"].grad), cast(Tensor, acts["k"].grad)  # retain_grad() above
    grad = torch.cat((q_grad, k_grad), dim=-1).double()  # [batch, pos, 1, 2 d_head]
    return dict(d_head=d_head, scaled=scaled, seed=seed,
                score_var=float(acts["scores"].detach().double().var()),
                entropy=float(entropy.mean()), max_prob=float(p.amax(-1).mean()),
                jacobian_norm=float(softmax_jacobian_norm(p).mean()),
                qk_grad_norm=float(grad.norm(dim=-1).mean()))


def saturation_sweep(d_heads: Sequence[int] = (8, 16, 32, 64, 128, 256, 512),
                     scaled: Sequence[bool] = (True, False), seeds: Sequence[int] = (0, 1, 2), *,
                     d_model: int = 64, n_pos: int = 32, batch: int = 8) -> pd.DataFrame:
    """One row per (d_head, scaled, seed): score variance, mean attention entropy (nats), mean max
    weight, mean softmax-Jacobian Frobenius norm and mean per-position norm of dL/d(q, k).

    Inputs are ``batch`` x ``n_pos`` unit-variance vectors of width ``d_model``; the loss is a
    random linear function of ``hook_z``. Bidirectional attention without a mask, so every
    score is a plain dot product.
    """
    d_heads = check_ints("d_heads", d_heads, 1)
    seeds = check_ints("seeds", seeds, 0)
    scaled = tuple(scaled)
    if not scaled or any(not isinstance(s, bool) for s in scaled):
        raise AttnlabError(f"scaled={scaled!r} is invalid: expected a non-empty sequence of bools")
    for name, value, minimum in (("d_model", d_model, 1), ("n_pos", n_pos, 2), ("batch", batch, 1)):
        check_int(name, value, minimum)
    rows = [_measure(d, s, seed, d_model, n_pos, batch) for s in scaled for d in d_heads for seed in seeds]
    return pd.DataFrame(rows, columns=COLUMNS)


def loglog_slope(frame: pd.DataFrame, column: str, scaled: bool) -> float:
    """Least-squares slope of log(mean over seeds of ``column``) against log(d_head)."""
    if column not in COLUMNS[3:]:
        raise AttnlabError(f"column={column!r} is invalid: expected one of {COLUMNS[3:]}")
    sub = frame[frame["scaled"] == scaled].groupby("d_head")[column].mean()
    if len(sub) < 2:
        raise AttnlabError(f"need at least two d_head values with scaled={scaled} to fit a slope, got {len(sub)}")
    return float(np.polyfit(np.log(sub.index.to_numpy(float)), np.log(sub.to_numpy(float)), 1)[0])
