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
from probes import _patterns
from probes._validate import check_batch_size, check_threshold, probe_inputs, takes_any_model


@takes_any_model
def attention_entropy(model: AnyModel, tokens: Tensor, *, threshold: float = 0.9, batch_size: Optional[int] = None,
                      attention_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """``DataFrame[layer, head, entropy, max_prob, saturated_fraction]``."""
    threshold = check_threshold("threshold", threshold)
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, need_pattern=True, attention_mask=attention_mask, need_loss=False)
    L, H = info.n_layers, info.n_heads
    sums = torch.zeros(3, L, H, dtype=torch.float64, device=info.device)
    n_queries = 0.0
    for sl, patterns in _patterns.stream(model, info, data, batch_size=batch_size):
        w = _patterns.informative_queries(info, data.real()[sl])[:, None].double()  # [b, 1, q]
        n_queries += float(w.sum())
        for layer, p in enumerate(patterns):
            p = p.double()
            top = p.max(-1).values  # [b, n_heads, q]
            stats = (-torch.special.xlogy(p, p).sum(-1), top, (top >= threshold).double())
            for i, s in enumerate(stats):
                sums[i, layer] += (s * w).sum((0, 2))
    if n_queries == 0:
        raise AttnlabError("no query sees two or more real tokens: expected sequences of at least 2 real tokens")
    means = (sums / n_queries).cpu()
    return pd.DataFrame({
        "layer": torch.arange(L).repeat_interleave(H).numpy(),
        "head": torch.arange(H).repeat(L).numpy(),
        "entropy": means[0].flatten().numpy(),
        "max_prob": means[1].flatten().numpy(),
        "saturated_fraction": means[2].flatten().numpy(),
    })
