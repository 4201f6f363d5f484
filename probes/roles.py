"""Head roles: how much attention each head puts where known circuits put it.

For each query, a role names a set of keys; the score is the attention mass on that set,
averaged over the queries where the set is not empty (padding excluded):

- ``previous_token``: the key just before the query (Olsson et al. 2022, "In-context Learning
  and Induction Heads": the first half of the induction circuit);
- ``induction``: every key that follows an earlier occurrence of the query's token (positions
  j+1 with tokens[j] == tokens[q], j+1 < q): where an induction head looks to copy what came next;
- ``duplicate_token``: every earlier occurrence of the query's own token (Wang et al. 2022,
  "Interpretability in the Wild", duplicate-token heads);
- ``first_token``: the first real token, the usual "attention sink" of a head with nothing to do
  (Xiao et al. 2023), scored over queries after the first.

On a sequence made of a random prefix repeated once, a perfect induction head scores 1.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel
from probes import _patterns
from probes._validate import check_batch_size, probe_inputs, takes_any_model

ROLES = ("previous_token", "induction", "duplicate_token", "first_token")


def role_key_sets(tokens: Tensor, real: Tensor) -> dict[str, Tensor]:
    """bool ``[b, q, k]`` key sets of every role, for tokens ``[b, pos]`` and real-token mask ``[b, pos]``."""
    b, p = tokens.shape
    idx = torch.arange(p, device=tokens.device)
    earlier = idx[None, :] < idx[:, None]  # [q, k]: k < q
    pair_real = real[:, :, None] & real[:, None, :]
    same = (tokens[:, :, None] == tokens[:, None, :]) & pair_real & earlier
    # key k follows an earlier copy of the query token when tokens[k-1] == tokens[q] and k < q
    after_copy = torch.zeros_like(same)
    after_copy[:, :, 1:] = same[:, :, :-1] & earlier[None, :, 1:] & real[:, None, 1:]
    previous = (idx[None, :] == idx[:, None] - 1)[None] & pair_real
    first_idx = real.long().argmax(-1)  # first real position of each sequence
    after_first = idx[None, :, None] > first_idx[:, None, None]  # queries after the first real token
    first = (idx[None, None, :] == first_idx[:, None, None]) & pair_real & after_first
    return {"previous_token": previous, "induction": after_copy, "duplicate_token": same, "first_token": first}


@takes_any_model
def head_roles(model: AnyModel, tokens: Tensor, *, batch_size: Optional[int] = None,
               attention_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """``DataFrame[layer, head, previous_token, induction, duplicate_token, first_token]``.

    A role whose key set is empty for every query (e.g. ``induction`` on data with no repeated
    token) is NaN.
    """
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, need_pattern=True, attention_mask=attention_mask, need_loss=False)
    L, H = info.n_layers, info.n_heads
    mass = {role: torch.zeros(L, H, dtype=torch.float64, device=info.device) for role in ROLES}
    n_queries = dict.fromkeys(ROLES, 0.0)
    for sl, patterns in _patterns.stream(model, info, data, batch_size=batch_size):
        sets = role_key_sets(data.tokens[sl], data.real()[sl])
        for role, keys in sets.items():
            has = keys.any(-1)  # [b, q]: queries where the role is defined
            n_queries[role] += float(has.sum())
            for layer, pattern in enumerate(patterns):
                on_set = (pattern * keys[:, None].to(pattern.dtype)).sum(-1)  # [b, n_heads, q]
                mass[role][layer] += (on_set * has[:, None].to(pattern.dtype)).sum((0, 2)).double()
    columns = {"layer": torch.arange(L).repeat_interleave(H).numpy(), "head": torch.arange(H).repeat(L).numpy()}
    for role in ROLES:
        score = mass[role] / n_queries[role] if n_queries[role] else torch.full((L, H), float("nan"))
        columns[role] = score.flatten().cpu().numpy()
    return pd.DataFrame(columns)
