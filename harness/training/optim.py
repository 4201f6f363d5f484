"""Optimizers with weight-decay groups, the label-smoothed loss, and optimizer state as tensors + JSON.

Optimizer state is split into tensors (safetensors) and plain values (JSON) so that a
checkpoint never needs pickle.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.errors import AttnlabError
from harness.training.config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices that decay, and everything that must not.

    Biases and norm gains (1-D) and embedding tables do not decay: shrinking a gain or an
    embedding toward 0 changes what the model represents rather than regularizing a
    linear map (the GPT-2 / nanoGPT convention). A table tied to the unembedding is an
    embedding and does not decay either.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """``sgd``, ``momentum`` (heavy ball), ``adam`` (Kingma & Ba 2015, L2 decay) or ``adamw``
    (decoupled decay, Loshchilov & Hutter 2019). The lr is set per step by the schedule."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr)
    if cfg.optimizer == "momentum":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def update_overflow(optimizer: torch.optim.Optimizer) -> Optional[str]:
    """Why the next ``optimizer.step()`` cannot be taken in the parameters' dtype, or None.

    The step multiplies each update by python scalars that torch casts to the parameter dtype:
    the lr, ``lr * weight_decay``, and for Adam the bias-corrected step size ``lr / (1 - beta1^t)``
    (Kingma & Ba 2015, Algorithm 1). A scalar beyond the dtype's range (float16 holds at most
    65504) is an update too large to represent: the run has diverged, before any loss is inf.
    """
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        scales = [lr, lr * float(group.get("weight_decay", 0.0))]
        betas = group.get("betas")
        for p in group["params"]:
            if betas is not None:
                t = int(optimizer.state.get(p, {}).get("step", 0)) + 1  # the step this update will be
                scales.append(lr / (1.0 - float(betas[0]) ** t))
            if p.dtype.is_floating_point and max(scales) > torch.finfo(p.dtype).max:
                return (f"too large for the parameters' dtype ({p.dtype} holds at most "
                        f"{torch.finfo(p.dtype).max:g}; this step scales the update by {max(scales):g})")
    return None


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def smoothed_cross_entropy(logits: Tensor, targets: Tensor, eps: float) -> Tensor:
    """Per-token label-smoothed cross-entropy ``[n]`` for logits ``[n, d_vocab]``.

    Szegedy et al. 2016 §7: the target is (1 - eps)·one_hot(y) + eps·u with u uniform, so the
    loss is (1 - eps)·CE(y, q) + eps·H(u, q), H(u, q) = -(1/V) Σ_j log q_j. Computed in
    float32 at least, since log-softmax in bf16 loses the small probabilities.
    """
    logp = F.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, dim=-1)
    nll = -logp.gather(-1, targets[:, None]).squeeze(-1)
    if eps == 0.0:
        return nll
    return (1.0 - eps) * nll - eps * logp.mean(dim=-1)


def optimizer_state_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], str]:
    """The optimizer's state as ``{"state.<param>.<name>": tensor}`` plus a JSON string of the rest."""
    sd = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            if isinstance(value, Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous().clone()
            else:
                plain.setdefault(str(idx), {})[name] = value
    meta = {"param_groups": sd["param_groups"], "plain_state": plain, "class": type(optimizer).__name__}
    return tensors, json.dumps(meta)


def optimizer_state_from_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], meta_json: str,
                                 source: str) -> None:
    """Inverse of :func:`optimizer_state_to_tensors`; ``source`` names the file in errors."""
    try:
        meta = json.loads(meta_json)
        groups = meta["param_groups"]
        cls = meta["class"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise AttnlabError(f"{source}: optimizer metadata is missing or corrupt ({exc})") from None
    if cls != type(optimizer).__name__:
        raise AttnlabError(f"{source} holds {cls} state, but the run uses {type(optimizer).__name__}")
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise AttnlabError(f"{source}: unexpected tensor {key!r}: expected 'state.<param index>.<name>'")
        state.setdefault(int(parts[1]), {})[parts[2]] = value
    for idx, plain in meta.get("plain_state", {}).items():
        state.setdefault(int(idx), {}).update(plain)
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as exc:
        raise AttnlabError(f"{source} does not fit this model's optimizer: {exc}") from None
