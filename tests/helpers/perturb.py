"""Move every 1-D parameter (norm gains, biases) off its init, for tests against an independent reference.

Hugging Face and harness both initialise gains to exactly 1 and biases to exactly 0, so a swapped
bias or a forgotten norm gain would change nothing; after this it changes the output visibly.
"""

from __future__ import annotations

import torch


def perturb_vectors(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` in eval mode with 0.2 * N(0, 1) added to every 1-D parameter (drawn from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()
