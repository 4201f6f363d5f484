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


# --- the declared design: scale, rotary frequencies and factor, per-layer windows -----------------------------


def plain_inv_freq(base: float, dim: int) -> torch.Tensor:
    """Su et al. 2021 eq. 15: theta_i = base^(-2(i-1)/d), i = 1..d/2, in float64."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def llama3_inv_freq(base: float, dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1's frequency scaling (Meta's reference ``apply_scaling``), in float64: wavelengths shorter than
    original / high_freq_factor are kept, longer than original / low_freq_factor divided by ``factor``,
    and those between interpolated by smooth = (original / wavelength - low) / (high - low)."""
    out, old = [], original_max_position_embeddings
    for f in plain_inv_freq(base, dim).tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high_freq_factor:
            out.append(f)
        elif wavelen > old / low_freq_factor:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def _eager_records(module_path: str, build: Callable, tokens: list[list[int]]) -> dict:
    """{layer: (query, key, mask, weights, module)} the modeling module's eager kernel saw and returned."""
    import importlib
    from unittest import mock

    mod = importlib.import_module(module_path)
    original, seen = mod.eager_attention_forward, {}

    def record(module, query, key, value, attention_mask, *args, **kwargs):
        out = original(module, query, key, value, attention_mask, *args, **kwargs)
        seen.setdefault(module.layer_idx, (query, key, attention_mask, out[1], module))
        return out

    with mock.patch.object(mod, "eager_attention_forward", record):
        build()(torch.tensor(tokens))
    return seen


@torch.no_grad()
def weights_at_scale(build: Callable, patch: Patch, module_path: str, declared: float, wrong: float,
                     tokens: list[list[int]]) -> str:
    """Layer 0's attention weights against softmax(cap(s * q.k) + mask) by hand (float64), s the declared scale.

    q, k and the weights are the eager kernel's own inputs and output; the soft-cap is the config's
    ``attn_logit_softcapping`` (Gemma 2). Also reports how well the patched weights fit ``wrong``.
    """
    def error(records, scale: float) -> float:
        q, k, mask, weights, module = records[0]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        scores = q.double() @ k.double().transpose(-1, -2) * scale
        cap = getattr(module.config, "attn_logit_softcapping", None)
        if cap is not None:
            scores = cap * torch.tanh(scores / cap)
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, -math.inf) if mask is None else scores + mask.double()
        return float((scores.softmax(-1) - weights.double()).abs().max())

    clean = error(_eager_records(module_path, build, tokens), declared)
    assert clean < 1e-5, f"the unpatched weights are off the declared scale by {clean:.3g}"
    with patch():
        records = _eager_records(module_path, build, tokens)
    seen, fit = error(records, declared), error(records, wrong)
    assert seen > 1e-3, f"the patch moves the weights by only {seen:.3g}"
    return (f"layer-0 attention weights vs softmax(cap(q.k * {declared:.4g})) by hand: max |diff| {seen:.3g} "
            f"(unpatched {clean:.1g}); with q.k * {wrong:.4g} instead: {fit:.1g}")


@torch.no_grad()
def rotary_against_formula(build: Callable, patch: Patch, cos_sin: Callable, inv_freq: Callable, position: int,
                           what: str) -> str:
    """The rotary module's cos/sin at positions 0 and ``position`` against cos/sin(position * theta) in float64,
    theta = ``inv_freq(config)`` computed by hand from the config's declared rope settings."""
    def worst() -> float:
        model = build()
        pos = torch.tensor([[0, position]])
        cos, sin = cos_sin(model, pos)
        theta = inv_freq(model.config)
        phase = pos[0, :, None].double() * theta
        phase = torch.cat((phase, phase), -1)
        assert cos.shape[-1] == phase.shape[-1], f"cos has {cos.shape[-1]} columns, the formula {phase.shape[-1]}"
        return float(max((cos[0].double() - phase.cos()).abs().max(), (sin[0].double() - phase.sin()).abs().max()))

    clean = worst()
    assert clean < 1e-3, f"the unpatched rotary table is off the formula by {clean:.3g} at position {position}"
    with patch():
        seen = worst()
    assert seen > 1e-2, f"the patch moves cos/sin by only {seen:.3g}"
    return f"max |cos/sin error| at position {position} against {what}: {seen:.3g} (unpatched {clean:.1g})"


@torch.no_grad()
def rotary_factor(build: Callable, patch: Patch, cos_sin: Callable, declared: float) -> str:
    """cos at position 0 is the factor on cos/sin (cos 0 = 1): against the config's explicit ``attention_factor``."""
    def factor() -> tuple[float, float]:
        cos, sin = cos_sin(build(), torch.tensor([[0]]))
        assert float(sin.abs().max()) == 0.0
        return float(cos.min()), float(cos.max())

    lo, hi = factor()
    assert abs(lo - declared) < 1e-6 and abs(hi - declared) < 1e-6, f"unpatched factor {lo}..{hi}, not {declared}"
    with patch():
        lo, hi = factor()
    assert lo == hi and abs(lo - declared) > 1e-2, f"the patch leaves the factor at {lo}..{hi}"
    return f"cos/sin factor (cos at position 0): {lo:.5f}, declared attention_factor {declared:.5f}"


@torch.no_grad()
def pass_through_turns(build: Callable, patch: Patch, cos_sin: Callable, apply: Callable, rotary_dim: int,
                       position: int) -> str:
    """A unit query rotated by the model's own apply_rotary_pos_emb at ``position``: its features past
    ``rotary_dim`` (the config's partial rotary span) must come out unchanged."""
    def moved() -> float:
        model = build()
        cos, sin = cos_sin(model, torch.tensor([[position]]))
        head_dim = model.config.head_dim
        q = torch.randn(1, 1, 1, head_dim, generator=torch.Generator().manual_seed(0))
        q_rot, _ = apply(q, q, cos, sin)
        return float((q_rot - q)[..., rotary_dim:].abs().max())

    clean = moved()
    assert clean == 0.0, f"the unpatched rotation moves the pass-through features by {clean:.3g}"
    with patch():
        seen = moved()
    assert seen > 1e-2, "the patch leaves the pass-through features in place"
    return f"features {rotary_dim}.. of q move by {seen:.3g} at position {position} (unpatched 0)"


@torch.no_grad()
def keys_per_layer(build: Callable, patch: Patch, tokens: list[list[int]], expected: list[list[int]]) -> str:
    """Keys each query's attention weights reach (weight > 0), layer by layer, from the eager model's own
    weights, against ``expected`` (per layer: the counts the config's layer_types / sliding_window say)."""
    def counts() -> list[list[int]]:
        out = build()(torch.tensor(tokens), output_attentions=True).attentions
        return [[int(c) for c in (a[0, 0] > 0).sum(-1)] for a in out]

    assert counts() == expected, f"the unpatched model admits {counts()}, not {expected}"
    with patch():
        seen = counts()
    assert seen != expected, "the patch leaves every layer's keys unchanged"
    wrong = [i for i, (s, e) in enumerate(zip(seen, expected, strict=True)) if s != e]
    return "; ".join(f"layer {i}: keys per query {seen[i]}, declared {expected[i]}" for i in wrong)
