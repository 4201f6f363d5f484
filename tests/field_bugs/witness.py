"""Witnesses: evidence, independent of the property suite, that a patched model really is wrong.

Each returns a one-line finding and raises AssertionError when the patch did not make the model
wrong (so a patch that stopped biting, e.g. after a transformers upgrade, is caught). They use
the Hugging Face model directly (its own ``forward``, masks and rotary module), never an adapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from transformers import masking_utils

Patch = Callable[[], AbstractContextManager]


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def logits_move(build: Callable, patch: Patch, tokens: list[list[int]], mask: list[list[int]] | None = None,
                atol: float = 1e-3) -> str:
    """The patched model's logits at real positions differ from the unpatched model's (same weights)."""
    x = torch.tensor(tokens)
    m = torch.ones_like(x) if mask is None else torch.tensor(mask)
    kwargs = dict(attention_mask=m, position_ids=_positions(m))
    clean = build()(x, **kwargs).logits
    with patch():
        broken = build()(x, **kwargs).logits
    real = m.bool()
    diff = float((broken - clean)[real].abs().nan_to_num(nan=math.inf).max())
    assert diff > atol, f"the patch does not change the logits (max |diff| {diff:.3g})"
    where = f"tokens={tokens}" + ("" if mask is None else f" mask={mask}")
    return f"max |logit change| at real tokens {diff:.3g} on {where}"


def window_counts(patch: Patch, window: int, n: int = 6) -> str:
    """Keys each query admits in the causal sliding-window mask transformers builds, against w by hand."""
    def counts() -> list[int]:
        mask = masking_utils.sdpa_mask(batch_size=1, q_length=n, kv_length=n, allow_is_causal_skip=False,
                                       mask_function=masking_utils.sliding_window_causal_mask_function(window))
        return [int(c) for c in mask[0, 0].sum(-1)]

    expected = [min(i + 1, window) for i in range(n)]  # query i sees keys max(0, i - w + 1) .. i
    assert counts() == expected, f"the unpatched mask is not the convention: {counts()} vs {expected}"
    with patch():
        seen = counts()
    assert seen != expected, "the patch leaves the window unchanged"
    return f"keys per query for w={window}: {seen}, expected {expected}"


def slopes(patch: Patch, n_heads: int, expected: list[float]) -> str:
    """Bloom's slopes under the patch, against Press et al.'s values written out by hand."""
    from transformers.models.bloom import modeling_bloom

    clean = [round(float(s), 8) for s in modeling_bloom._get_alibi_slopes(n_heads, torch.device("cpu"))]
    assert clean == [round(s, 8) for s in expected], f"unpatched Bloom slopes {clean} are not {expected}"
    with patch():
        seen = [round(float(s), 6) for s in modeling_bloom._get_alibi_slopes(n_heads, torch.device("cpu"))]
    assert seen != [round(s, 6) for s in expected], "the patch leaves the slopes unchanged"
    return f"{n_heads}-head slopes {seen}, Press et al. {[round(s, 6) for s in expected]}"


@torch.no_grad()
def nan_logits(build: Callable, patch: Patch, tokens: list[list[int]], mask: list[list[int]]) -> str:
    """NaN in the patched model's logits on a left-padded batch; none in the unpatched model's."""
    x, m = torch.tensor(tokens), torch.tensor(mask)
    kwargs = dict(attention_mask=m, position_ids=_positions(m))
    assert bool(torch.isfinite(build()(x, **kwargs).logits).all()), "the unpatched model is not finite"
    with patch():
        logits = build()(x, **kwargs).logits
    bad = ~torch.isfinite(logits)
    assert bool(bad.any()), "the patch leaves the logits finite"
    real_bad = int(bad[m.bool()].any(-1).sum())
    return (f"{int(bad.any(-1).sum())} of {m.numel()} positions have NaN logits, {real_bad} of them real tokens, "
            f"on tokens={tokens} mask={mask}")


@torch.no_grad()
def rotary_tables(build: Callable, patch: Patch, rotary: Callable[[torch.nn.Module], torch.nn.Module],
                  position: int) -> str:
    """cos of the rotary module at ``position`` against a float64 cos of ``position * theta``."""
    def worst() -> float:
        model = build()
        module = rotary(model)
        pos = torch.tensor([[position]])
        cos, _ = module(torch.zeros(1, 1, 8), pos)
        theta = module.original_inv_freq.double()  # float32 1 / base^(2i/d), computed before any patch
        ref = torch.cat((position * theta, position * theta)).cos()
        return float((cos[0, 0].double() - ref).abs().max())

    clean = worst()
    assert clean < 1e-4, f"the unpatched rotary table is off by {clean:.3g} at position {position}"
    with patch():
        seen = worst()
    assert seen > 1e-2, f"the patch moves cos by only {seen:.3g}"
    return f"max |cos error| at position {position}: {seen:.3g} (unpatched {clean:.1g})"


@torch.no_grad()
def eval_not_deterministic(build: Callable, patch: Patch, tokens: list[list[int]]) -> str:
    """Two eval-mode forward passes of the patched model disagree; the unpatched model's agree."""
    x = torch.tensor(tokens)
    model = build().eval()
    assert torch.equal(model(x).logits, model(x).logits), "the unpatched model is not deterministic"
    with patch():
        model = build().eval()
        diff = float((model(x).logits - model(x).logits).abs().max())
    assert diff > 1e-3, "the patch leaves eval deterministic"
    return f"two eval forwards of tokens={tokens} differ by {diff:.3g}"


@torch.no_grad()
def future_moves_past(build: Callable, patch: Patch, tokens: list[list[int]]) -> str:
    """Changing the last token moves the patched model's earlier logits; the unpatched model's stay put."""
    x = torch.tensor(tokens)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 64

    def leak() -> float:
        model = build()
        return float((model(x).logits[:, :-1] - model(y).logits[:, :-1]).abs().max())

    clean = leak()
    assert clean == 0.0, f"the unpatched model already leaks the future ({clean:.3g})"
    with patch():
        seen = leak()
    assert seen > 1e-3, "the patch leaves the model causal"
    return f"changing the last of tokens={tokens} moves earlier logits by {seen:.3g} (unpatched 0)"
