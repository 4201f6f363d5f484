"""Process-group setup for data-parallel training under ``torchrun``.

``torchrun`` sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; with
WORLD_SIZE > 1 (or a process group the caller already started) training is
data-parallel: gloo on CPU, nccl on CUDA. Every rank draws the same global batch from the
same seeded generator and keeps its own slice, so the data a step sees does not depend on
the number of processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from harness.errors import AttnlabError


@dataclass
class DistInfo:
    world_size: int
    rank: int
    device: torch.device
    started_here: bool  # this module started the process group, so it also ends it

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(choice: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise AttnlabError("device='cuda' was requested but no CUDA device is available: expected 'cpu' or 'auto'")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise AttnlabError(f"environment variable {name}={raw!r} is invalid: expected an integer") from None


def setup(device_choice: str) -> DistInfo:
    """Join (or start) the process group when running data-parallel, and pick this rank's device."""
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    if world <= 1 and not dist.is_initialized():
        return DistInfo(1, 0, resolve_device(device_choice), False)
    started = False
    device = resolve_device(device_choice, local_rank)
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        started = True
    return DistInfo(dist.get_world_size(), dist.get_rank(), device, started)


def all_reduce_sum(t: Tensor, info: DistInfo) -> Tensor:
    if info.active:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(info: DistInfo) -> None:
    if info.active:
        dist.barrier()


def teardown(info: DistInfo) -> None:
    if info.started_here and dist.is_initialized():
        dist.destroy_process_group()
