"""Sharding probe work across the processes of a ``torchrun`` job (torch.distributed).

When a process group is initialized (gloo on CPU, nccl on GPU), every rank runs the same probe
call, evaluates only its share of the work items (head masks, or passes of masks) and the
shares are summed into one result that every rank returns. A work item is computed by exactly
one rank, exactly as one process computes it, and the others contribute zeros, so the sum is
the one-process result bit for bit (x + 0 = x); without a process group everything is a no-op.

The interface, for any probe that evaluates independent items:

    mine = shard_masks(masks)                  # indices of the masks this rank evaluates
    values = evaluate(masks[mine])             # [len(mine), ...]
    full = gather(values, mine, len(masks))    # [len(masks), ...], the same on every rank

``owner(i)`` / ``world()`` serve loops that assign items themselves; ``combine(t)`` sums a
tensor whose entries each rank filled for its own items.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["world", "owner", "shard_masks", "gather", "combine"]


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialized process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def owner(item: int) -> int:
    """The rank that evaluates work item ``item`` (round robin, so every rank gets a share)."""
    return item % world()[1]


def shard_masks(masks: Tensor) -> Tensor:
    """Indices (into dim 0 of ``masks``) of the masks this rank evaluates; all of them in one process."""
    rank, size = world()
    return torch.arange(rank, masks.shape[0], size, device=masks.device)


def combine(t: Tensor) -> Tensor:
    """Sum ``t`` over the ranks (in place, and returned); each entry should come from one rank only."""
    _, size = world()
    if size == 1:
        return t
    if t.device.type != "cuda" or dist.get_backend() != "nccl":  # gloo reduces CPU tensors
        cpu = t.detach().cpu().clone()
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        t.copy_(cpu.to(t.device))
        return t
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather(values: Tensor, indices: Tensor, k: int) -> Tensor:
    """The full ``[k, ...]`` result from each rank's ``values`` for its ``indices`` (see :func:`shard_masks`)."""
    full = torch.zeros((k, *values.shape[1:]), dtype=values.dtype, device=values.device)
    full[indices.to(values.device)] = values
    return combine(full)
