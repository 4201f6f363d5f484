"""Attention entropy: how spread out or how peaked each head's attention is.

Per head, over informative queries (real queries that can see two or more real keys):
``entropy`` the mean Shannon entropy of the attention distribution in nats (0 for a head that
always looks at one key, log(n) for uniform attention over n keys); ``max_prob`` the mean weight of
the most attended key; ``saturated_fraction`` the fraction of queries whose largest weight is at
least ``threshold``, i.e. that behave like hard attention (cf. the entropy-collapse analysis of
Zhai et al. 2023).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel
from harness.errors import AttnlabError
from probes import _patterns, _stacks
from probes._validate import check_batch_size, check_threshold, probe_inputs, takes_any_model


@takes_any_model
def attention_entropy(model: AnyModel, tokens: Tensor, *, threshold: float = 0.9, batch_size: Optional[int] = None,
                      attention_mask: Optional[Tensor] = None, source_tokens: Optional[Tensor] = None,
                      source_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """``DataFrame[layer, head, entropy, max_prob, saturated_fraction]``.

    An encoder-decoder's frame covers its three stacks and leads with the ``kind`` column of
    :func:`probes.head_importance` (``encoder``, ``decoder``, ``cross``; ``layer`` within each stack), given
    ``source_tokens``/``source_mask`` as that function takes them: the encoder's heads are read over the source's
    queries and keys, cross-attention's over the decoder's queries and the source's keys
    (:mod:`probes._stacks`). A stack with no informative query (a one-token source) is NaN, and
    ``attrs["no_informative_queries"]`` names it.
    """
    threshold = check_threshold("threshold", threshold)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, need_pattern=True, attention_mask=attention_mask,
                                     need_loss=False, source_tokens=source_tokens, source_mask=source_mask)
    L, H = info.n_layers, info.n_heads
    sums = torch.zeros(3, L, H, dtype=torch.float64, device=info.device)
    n_queries = torch.zeros(L, dtype=torch.float64, device=info.device)
    for sl, patterns in _patterns.stream(model, info, data, batch_size=batch_size):
        for row, p in enumerate(patterns):
            w = _stacks.informative(_stacks.stack(info, data, sl, row))[:, None].double()  # [b, 1, q]
            n_queries[row] += float(w.sum())
            p = p.double()
            top = p.max(-1).values  # [b, n_heads, q]
            stats = (-torch.special.xlogy(p, p).sum(-1), top, (top >= threshold).double())
            for i, s in enumerate(stats):
                sums[i, row] += (s * w).sum((0, 2))
    if not bool((n_queries > 0).any()):
        raise AttnlabError("no query sees two or more real tokens: expected sequences of at least 2 real tokens")
    means = (sums / n_queries[None, :, None]).cpu()  # a row without queries: 0 / 0, NaN
    frame = pd.DataFrame({
        "layer": torch.arange(L).repeat_interleave(H).numpy(),
        "head": torch.arange(H).repeat(L).numpy(),
        "entropy": means[0].flatten().numpy(),
        "max_prob": means[1].flatten().numpy(),
        "saturated_fraction": means[2].flatten().numpy(),
    })
    empty = sorted({info.kind(r) or "decoder" for r in range(L) if n_queries[r] == 0})
    if empty:
        frame.attrs["no_informative_queries"] = empty
    return _stacks.with_kinds(frame, info)
