"""Learned head gates: hard-concrete gates with an L0 penalty (Voita et al. 2019, §4).

Each head h gets a stochastic gate ``z_h`` in [0, 1] on its ``hook_z`` output. The gate follows
the hard-concrete distribution of Louizos, Welling & Kingma (2018), §4: with ``u ~ U(0, 1)``,

    s = sigmoid((log u - log(1 - u) + log_alpha_h) / beta)        (a binary concrete sample)
    z = clamp(s * (zeta - gamma) + gamma, 0, 1)                    (stretched to (gamma, zeta), clipped)

with ``beta = 2/3``, ``gamma = -0.1``, ``zeta = 1.1`` (their values). The clipping puts mass on
exactly 0 and exactly 1, and the probability that a gate is non-zero has a closed form (their
eq. 12):

    P(z_h != 0) = sigmoid(log_alpha_h - beta * log(-gamma / zeta))

The model stays frozen; only ``log_alpha`` is trained, on the task loss (the next-token
cross-entropy of the gated model) plus ``penalty`` times the expected number of open gates,
``sum_h P(z_h != 0)`` (the L0 norm's expectation). A head the loss does not need is driven shut;
a head it needs stays open. The final ``P(z_h != 0)`` is the head's importance. Gating goes through
``hook_z`` only, so it works on any protocol model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from harness._checks import check_number, check_positive_int, check_seed
from harness.adapters.protocol import ProtocolModel
from harness.errors import AttnlabTypeError
from probes import gates
from probes._nll import token_nll
from probes._validate import ModelInfo, ProbeData

# Louizos et al. 2018, §4 (and Voita et al. 2019, who take them over): temperature and stretch.
BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def l0_penalty(log_alpha: Float[Tensor, "n_layers n_heads"], beta: float = BETA,
               gamma: float = GAMMA, zeta: float = ZETA) -> Float[Tensor, "n_layers n_heads"]:
    """``P(z != 0)`` for hard-concrete gates with parameters ``log_alpha`` (Louizos et al. 2018, eq. 12)."""
    return torch.sigmoid(log_alpha - beta * math.log(-gamma / zeta))


def sample_gates(log_alpha: Float[Tensor, "n_layers n_heads"],
                 u: Float[Tensor, "batch n_layers n_heads"],
                 beta: float = BETA, gamma: float = GAMMA,
                 zeta: float = ZETA) -> Float[Tensor, "batch n_layers n_heads"]:
    """One hard-concrete sample per row of uniform noise ``u`` in (0, 1); differentiable in ``log_alpha``
    (the reparameterisation of Louizos et al. 2018, §4)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha[None]) / beta)
    return (s * (zeta - gamma) + gamma).clamp(0.0, 1.0)


@dataclass(frozen=True)
class L0Options:
    """How the gates are trained.

    ``penalty``: lambda, the loss (nats per target token) a head must be worth to stay open;
    ``steps``: Adam steps on ``log_alpha`` (learning rate ``lr``); ``rows``: sequences per step,
    drawn at random (all of them when the data has fewer); ``init``: the starting ``log_alpha``
    (3.0: every gate open with probability ~0.99); ``seed``: seeds the gate noise and the draws,
    so a call is deterministic.
    """

    penalty: float = 0.01
    steps: int = 100
    lr: float = 0.1
    rows: int = 16
    init: float = 3.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_number("penalty", self.penalty, 0.0, low_inclusive=True)
        check_positive_int("steps", self.steps)
        check_number("lr", self.lr, 0.0)
        check_positive_int("rows", self.rows)
        check_number("init", self.init, expected="a finite number (the starting log_alpha)")
        check_seed("seed", self.seed)


def check_options(options: Any) -> L0Options:
    if options is None:
        return L0Options()
    if not isinstance(options, L0Options):
        raise AttnlabTypeError(f"l0_options must be a probes.L0Options or None, got {type(options).__name__}")
    return options


def _gated(layer: int, g: Tensor) -> Callable:
    def fn(z: Tensor, hook: Any) -> Tensor:
        return z * g[:, layer].to(z.dtype)[:, None, :, None]  # [batch, 1, n_heads, 1]
    return fn


def train_gates(model: ProtocolModel, info: ModelInfo, data: ProbeData, options: L0Options, *,
                base: Optional[Tensor] = None) -> tuple[Tensor, dict[str, float]]:
    """Train the gates on the frozen model; returns ``(P(z != 0) [n_layers, n_heads] float64, stats)``.

    Heads off in ``base`` are held at zero (their importance is 0). ``stats``: the last step's task
    loss and expected number of open gates.
    """
    L, H = info.n_layers, info.n_heads
    base = torch.ones(L, H, device=info.device) if base is None else base.to(info.device, torch.float32)
    gen = torch.Generator().manual_seed(options.seed)  # CPU generator: same draws on every device
    log_alpha = torch.full((L, H), float(options.init), device=info.device, requires_grad=True)
    opt = torch.optim.Adam([log_alpha], lr=options.lr)
    rows = min(options.rows, data.n)
    task = open_gates = math.nan
    with gates.eval_mode(model), torch.enable_grad():
        for _ in range(options.steps):
            pick = torch.randperm(data.n, generator=gen)[:rows].to(info.device)
            w = data.weights[pick]
            # the noise is drawn in (0, 1) exclusive: log u and log(1 - u) stay finite
            u = torch.rand(rows, L, H, generator=gen).clamp(1e-6, 1 - 1e-6).to(info.device)
            g = sample_gates(log_alpha, u) * base  # one gate sample per sequence, for lower variance
            hooks = [(info.z_hooks[row], _gated(row, g)) for row in range(L)]
            am = None if data.attention_mask is None else data.attention_mask[pick]
            logits = gates.hooked_pass(model, info, data.tokens[pick], am, hooks, source=data.source(pick))
            nll, _ = token_nll(logits, data.tokens[pick], 1)
            loss = (nll[0] * w).sum() / w.sum().clamp(min=1)
            expected_open = (l0_penalty(log_alpha) * base).sum()
            (grad,) = torch.autograd.grad(loss + options.penalty * expected_open, log_alpha)
            log_alpha.grad = grad
            opt.step()
            task, open_gates = float(loss.detach()), float(expected_open.detach())
    probs = (l0_penalty(log_alpha.detach()) * base).double()
    return probs, {"gate_task_loss": task, "expected_open_gates": open_gates}
