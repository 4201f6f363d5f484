"""Head similarity: which heads do the same thing.

- ``pattern``: 1 - the mean Jensen-Shannon divergence (Lin 1991; base-2 logarithms, so in [0, 1])
  between two heads' attention distributions over keys, averaged over every informative query
  (see :func:`probes._stacks.informative`). 1 means identical patterns on this data.
- ``output``: linear CKA (Kornblith et al. 2019, "Similarity of Neural Network Representations
  Revisited", eq. for the linear kernel) between two heads' outputs ``hook_z`` (the head's
  ``[d_head]`` output before the shared output projection), over every real token:
  ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)`` on centred features. Invariant to orthogonal
  maps and scaling; NaN for a head whose output is constant on the data.

An encoder-decoder's heads of all three stacks are compared (labels ``enc L0H1``, ``L0H1``, ``xL0H1``;
:mod:`probes._stacks`), each pair only where the measure is defined: patterns within one stack (two stacks'
patterns are distributions over different keys, or for different queries), outputs within the encoder, or among
the decoder's self- and cross-attention heads (both sit at the decoder's positions). Other pairs are NaN, and
``attrs["compared_within"]`` lists the groups compared.
"""

from __future__ import annotations

import math
from typing import Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel, ProtocolModel
from harness.errors import AttnlabError
from probes import _patterns, _stacks
from probes._validate import (
    METRICS,
    ModelInfo,
    ProbeData,
    check_batch_size,
    check_choice,
    probe_inputs,
    takes_any_model,
)


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
    sim = torch.full((N, N), float("nan"), dtype=torch.float64, device=info.device)
    groups = _stacks.groups(info, "pattern")
    jsd_sums = [torch.zeros(len(g) * info.n_heads, len(g) * info.n_heads, dtype=torch.float64, device=info.device)
                for g in groups]
    n_queries = [0.0] * len(groups)
    for sl, patterns in _patterns.stream(model, info, data, batch_size=batch_size):
        for g, rows in enumerate(groups):
            p = torch.cat([patterns[r] for r in rows], dim=1)  # [b, N_g, q, k]
            w = _stacks.informative(_stacks.stack(info, data, sl, rows[0])).to(p.dtype)  # [b, q]
            n_queries[g] += float(w.sum())
            h = _entropy(p)  # [b, N_g, q]
            for i in range(p.shape[1]):
                jsd_sums[g][i, i:] += jsd_row(p, h, w, i)
    if not any(n_queries):
        raise AttnlabError("no query sees two or more real tokens: expected sequences of at least 2 real tokens")
    for rows, jsd_sum, n in zip(groups, jsd_sums, n_queries, strict=True):
        if n == 0:
            continue  # a stack with no informative query (a one-token source) stays NaN
        jsd_mean = (jsd_sum / max(n, 1.0) / math.log(2)).clamp(0.0, 1.0)  # nats -> bits: JSD <= 1 bit
        jsd_mean = torch.triu(jsd_mean) + torch.triu(jsd_mean, 1).T
        heads = _heads(info, rows)
        sim[heads[:, None], heads[None, :]] = 1 - jsd_mean
    return sim


def _heads(info: ModelInfo, rows: list[int]) -> Tensor:
    """Flat head indices of the heads of mask ``rows``."""
    return (torch.tensor(rows)[:, None] * info.n_heads + torch.arange(info.n_heads)[None]).flatten().to(info.device)


def _output_cka(model: ProtocolModel, info: ModelInfo, data: ProbeData, batch_size: Optional[int]) -> Tensor:
    N = info.n_layers * info.n_heads
    out = torch.full((N, N), float("nan"), dtype=torch.float64, device=info.device)
    for rows in _stacks.groups(info, "positions"):
        heads = _heads(info, rows)
        out[heads[:, None], heads[None, :]] = _cka(model, info, data, batch_size, rows)
    return out


def _cka(model: ProtocolModel, info: ModelInfo, data: ProbeData, batch_size: Optional[int], rows: list[int]) -> Tensor:
    """Linear CKA between every pair of heads of mask ``rows``, whose outputs sit at the same positions."""
    gram: Optional[Tensor] = None
    total: Optional[Tensor] = None
    count = 0
    for sl, zs in _patterns.stream(model, info, data, what="z", batch_size=batch_size, rows=rows):
        z = torch.stack(zs, dim=2)  # [b, pos, rows, n_heads, d_head]
        d_head = z.shape[-1]
        x = z[_stacks.stack(info, data, sl, rows[0]).query_real].flatten(1).double()  # [samples, N * d_head]
        gram = x.T @ x if gram is None else gram + x.T @ x
        total = x.sum(0) if total is None else total + x.sum(0)
        count += x.shape[0]
    assert gram is not None and total is not None
    mean = total / count
    cov = gram - count * torch.outer(mean, mean)  # centred X^T X, accumulated over chunks
    N = len(rows) * info.n_heads
    blocks = cov.view(N, d_head, N, d_head).permute(0, 2, 1, 3)  # [N, N, d_head, d_head]
    cross = blocks.pow(2).sum((-1, -2))  # ||X_j^T X_i||_F^2
    self_norm = cross.diagonal().sqrt()  # ||X_i^T X_i||_F
    denom = torch.outer(self_norm, self_norm)
    return torch.where(denom > 0, cross / denom, torch.full_like(cross, float("nan")))


@takes_any_model
def head_similarity(model: AnyModel, tokens: Tensor, *, metric: str = "pattern", batch_size: Optional[int] = None,
                    attention_mask: Optional[Tensor] = None, source_tokens: Optional[Tensor] = None,
                    source_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """Square similarity matrix between every pair of heads, rows and columns labelled ``L{l}H{h}``.

    An encoder-decoder's covers its three stacks (``source_tokens``/``source_mask`` as
    :func:`probes.head_importance` takes them), labelled ``enc L0H1``, ``L0H1`` and ``xL0H1``; a pair the metric
    cannot compare is NaN (the module docstring)."""
    check_choice("metric", metric, METRICS)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, need_pattern=metric == "pattern",
                                     attention_mask=attention_mask, need_loss=False, source_tokens=source_tokens,
                                     source_mask=source_mask)
    if metric == "pattern":
        sim = _pattern_similarity(model, info, data, batch_size)
    else:
        sim = _output_cka(model, info, data, batch_size)
    labels = info.head_labels()
    frame = pd.DataFrame(sim.cpu().numpy(), index=labels, columns=labels)
    frame.attrs["metric"] = metric
    if info.kinds:
        frame.attrs["compared_within"] = [sorted({info.kinds[r] for r in rows})
                                          for rows in _stacks.groups(info, metric if metric == "pattern"
                                                                     else "positions")]
    return frame
