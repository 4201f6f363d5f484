"""Head similarity: which heads do the same thing.

- ``pattern``: 1 - the mean Jensen-Shannon divergence (Lin 1991; base-2 logarithms, so in [0, 1])
  between two heads' attention distributions over keys, averaged over every informative query
  (see :func:`probes._patterns.informative_queries`). 1 means identical patterns on this data.
- ``output``: linear CKA (Kornblith et al. 2019, "Similarity of Neural Network Representations
  Revisited", eq. for the linear kernel) between two heads' outputs ``hook_z`` (the head's
  ``[d_head]`` output before the shared output projection), over every real token:
  ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)`` on centred features. Invariant to orthogonal
  maps and scaling; NaN for a head whose output is constant on the data.
"""

from __future__ import annotations

import math
from typing import Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel
from harness.errors import AttnlabError
from probes import _patterns
from probes._validate import (
    METRICS,
    ModelInfo,
    ProbeData,
    check_batch_size,
    check_choice,
    probe_inputs,
    takes_any_model,
)


def _labels(info: ModelInfo) -> list[str]:
    return [f"L{layer}H{h}" for layer in range(info.n_layers) for h in range(info.n_heads)]


def _entropy(p: Tensor) -> Tensor:
    """Shannon entropy in nats over the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def jsd_row(p: Tensor, h: Tensor, w: Tensor, i: int) -> Tensor:
    """float64 ``[N - i]``: head i's Jensen-Shannon divergence (nats) from heads i.. summed over weighted queries.

    ``p`` the patterns ``[b, N, q, k]``, ``h`` their entropies ``[b, N, q]``, ``w`` the query weights ``[b, q]``.
    JSD(P, Q) = H((P + Q) / 2) - (H(P) + H(Q)) / 2 (Lin 1991, eq. 4.1 with equal weights)."""
    m = 0.5 * (p[:, i: i + 1] + p[:, i:])
    jsd = _entropy(m) - 0.5 * (h[:, i: i + 1] + h[:, i:])
    return (jsd * w[:, None]).sum((0, 2)).double()


def _pattern_similarity(model: ProtocolModel, info: ModelInfo, data: ProbeData, batch_size: Optional[int]) -> Tensor:
    N = info.n_layers * info.n_heads
    jsd_sum = torch.zeros(N, N, dtype=torch.float64, device=info.device)
    n_queries = 0.0
    for sl, patterns in _patterns.stream(model, info, data, batch_size=batch_size):
        p = torch.cat(patterns, dim=1)  # [b, N, q, k]
        w = _patterns.informative_queries(info, data.real()[sl]).to(p.dtype)  # [b, q]
        n_queries += float(w.sum())
        h = _entropy(p)  # [b, N, q]
        for i in range(N):
            jsd_sum[i, i:] += jsd_row(p, h, w, i)
    jsd_mean = (jsd_sum / max(n_queries, 1.0) / math.log(2)).clamp(0.0, 1.0)  # nats -> bits: JSD <= 1 bit
    jsd_mean = torch.triu(jsd_mean) + torch.triu(jsd_mean, 1).T
    if n_queries == 0:
        raise AttnlabError("no query sees two or more real tokens: expected sequences of at least 2 real tokens")
    return 1 - jsd_mean


def _output_cka(model: ProtocolModel, info: ModelInfo, data: ProbeData, batch_size: Optional[int]) -> Tensor:
    gram: Optional[Tensor] = None
    total: Optional[Tensor] = None
    count = 0
    for sl, zs in _patterns.stream(model, info, data, what="z", batch_size=batch_size):
        z = torch.stack(zs, dim=2)  # [b, pos, n_layers, n_heads, d_head]
        d_head = z.shape[-1]
        x = z[data.real()[sl]].flatten(1).double()  # [samples, N * d_head]
        gram = x.T @ x if gram is None else gram + x.T @ x
        total = x.sum(0) if total is None else total + x.sum(0)
        count += x.shape[0]
    assert gram is not None and total is not None
    mean = total / count
    cov = gram - count * torch.outer(mean, mean)  # centred X^T X, accumulated over chunks
    N = info.n_layers * info.n_heads
    blocks = cov.view(N, d_head, N, d_head).permute(0, 2, 1, 3)  # [N, N, d_head, d_head]
    cross = blocks.pow(2).sum((-1, -2))  # ||X_j^T X_i||_F^2
    self_norm = cross.diagonal().sqrt()  # ||X_i^T X_i||_F
    denom = torch.outer(self_norm, self_norm)
    return torch.where(denom > 0, cross / denom, torch.full_like(cross, float("nan")))


@takes_any_model
def head_similarity(model: AnyModel, tokens: Tensor, *, metric: str = "pattern", batch_size: Optional[int] = None,
                    attention_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """Square similarity matrix between every pair of heads, rows and columns labelled ``L{l}H{h}``."""
    check_choice("metric", metric, METRICS)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, need_pattern=metric == "pattern", attention_mask=attention_mask,
                                     need_loss=False)
    if metric == "pattern":
        sim = _pattern_similarity(model, info, data, batch_size)
    else:
        sim = _output_cka(model, info, data, batch_size)
    labels = _labels(info)
    frame = pd.DataFrame(sim.cpu().numpy(), index=labels, columns=labels)
    frame.attrs["metric"] = metric
    return frame
