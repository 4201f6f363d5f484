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

An encoder-decoder's three stacks (:mod:`probes._stacks`) are scored too. The encoder's heads read the source
with the same key sets (a previous-token or duplicate-token head looks the same in either direction). Induction
is n/a there: it is the copy of what came next for predicting the next token, which the encoder does not do.
Cross-attention's queries are decoder positions and its keys source positions, so "previous" and "after an earlier
copy" mean nothing and those roles are n/a; ``duplicate_token`` is every source key holding the query's token (a
copying or alignment head) and ``first_token`` the first real source token (the sink). An n/a role is NaN in its
stack's rows and named, with why, in ``attrs["not_applicable"]`` (:data:`NOT_APPLICABLE`).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd
import torch
from torch import Tensor

from harness.adapters.protocol import AnyModel
from probes import _patterns, _stacks
from probes._validate import check_batch_size, probe_inputs, takes_any_model

ROLES = ("previous_token", "induction", "duplicate_token", "first_token")
_NO_ORDER = "a source position is neither before nor after a decoder position"
# The roles that do not apply to a stack of an encoder-decoder, and why (the module docstring).
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "encoder": {"induction": "the encoder predicts no next token, so nothing copies what followed an earlier copy"},
    "cross": {"previous_token": _NO_ORDER, "induction": _NO_ORDER},
}


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


def cross_key_sets(queries: Tensor, query_real: Tensor, keys: Tensor, key_real: Tensor) -> dict[str, Tensor]:
    """bool ``[b, q, k]`` key sets of the roles cross-attention has: the source keys holding the query's token, and
    the first real source key; for decoder tokens ``queries`` ``[b, q]`` and source tokens ``keys`` ``[b, k]``."""
    pair_real = query_real[:, :, None] & key_real[:, None, :]
    same = (queries[:, :, None] == keys[:, None, :]) & pair_real
    idx = torch.arange(keys.shape[1], device=keys.device)
    first = (idx[None, None, :] == key_real.long().argmax(-1)[:, None, None]) & pair_real
    return {"duplicate_token": same, "first_token": first}


def _key_sets(s: _stacks.Stack) -> dict[str, Tensor]:
    if s.self_attention:
        return role_key_sets(s.query_tokens, s.query_real)
    return cross_key_sets(s.query_tokens, s.query_real, s.key_tokens, s.key_real)


@takes_any_model
def head_roles(model: AnyModel, tokens: Tensor, *, batch_size: Optional[int] = None,
               attention_mask: Optional[Tensor] = None, source_tokens: Optional[Tensor] = None,
               source_mask: Optional[Tensor] = None) -> pd.DataFrame:
    """``DataFrame[layer, head, previous_token, induction, duplicate_token, first_token]``.

    A role whose key set is empty for every query (e.g. ``induction`` on data with no repeated
    token) is NaN. An encoder-decoder's frame leads with :func:`probes.head_importance`'s ``kind`` column,
    given ``source_tokens``/``source_mask`` as that function takes them; the roles that do not apply to a
    stack are NaN there and named in ``attrs["not_applicable"]`` (``{kind: {role: why}}``).
    """
    batch_size = check_batch_size(batch_size)
    model, info, data = probe_inputs(model, tokens, all_heads=True, need_pattern=True, attention_mask=attention_mask,
                                     need_loss=False, source_tokens=source_tokens, source_mask=source_mask)
    L, H = info.n_layers, info.n_heads
    mass = {role: torch.zeros(L, H, dtype=torch.float64, device=info.device) for role in ROLES}
    n_queries = {role: torch.zeros(L, dtype=torch.float64) for role in ROLES}
    groups = _stacks.groups(info, "pattern")  # the rows of one stack share its key sets
    for sl, patterns in _patterns.stream(model, info, data, batch_size=batch_size):
        for rows in groups:
            sets = _key_sets(_stacks.stack(info, data, sl, rows[0]))
            kind = info.kind(rows[0])
            for role, keys in sets.items():
                if role in NOT_APPLICABLE.get(kind or "", {}):
                    continue
                has = keys.any(-1)  # [b, q]: queries where the role is defined
                n_queries[role][rows] += float(has.sum())
                for row in rows:
                    pattern = patterns[row]
                    on_set = (pattern * keys[:, None].to(pattern.dtype)).sum(-1)  # [b, n_heads, q]
                    mass[role][row] += (on_set * has[:, None].to(pattern.dtype)).sum((0, 2)).double()
    columns = {"layer": torch.arange(L).repeat_interleave(H).numpy(), "head": torch.arange(H).repeat(L).numpy()}
    for role in ROLES:
        count = n_queries[role].to(info.device)[:, None]
        score = torch.where(count > 0, mass[role] / count.clamp(min=1), torch.full_like(mass[role], float("nan")))
        columns[role] = score.flatten().cpu().numpy()
    frame = pd.DataFrame(columns)
    if info.kinds:
        frame.attrs["not_applicable"] = {kind: dict(roles) for kind, roles in NOT_APPLICABLE.items()}
    return _stacks.with_kinds(frame, info)
