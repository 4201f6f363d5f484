"""Relative positions: what a model with rotary, ALiBi or no positions computes depends only on offsets.

- ``relative_position`` (rotary, alibi, none): ``forward(tokens, position_offset=c)`` equals
  ``c = 0``. RoPE scores depend on m - n only (Su et al. 2021 eq. 16), ALiBi biases on
  |i - j| (Press et al. 2022), and without positions nothing depends on position at all.
  Offsets reach ``MAX_OFFSET = 256`` or as far as positions stay < n_ctx (the protocol's
  context): float32 rotary angles at position p carry an absolute error ~p * 2^-24 < 2e-5 rad
  there, far below ``_common.LOGIT_RTOL``.
- ``rotary_norm`` (metamorphic): RoPE rotates pairs by angles set by the position alone, so the same
  layer-0 input at two position offsets gives the same ``|hook_rot_q|``/``|hook_rot_k|`` per head and
  position; with a declared ``cfg.rotary_style`` each rotated pair's norm, with a declared
  ``cfg.rotary_dim`` the pass-through dims unchanged. Comparing two rotations (not rotation vs
  ``hook_q``) lets q/k-norm between ``hook_q`` and the rotation (Qwen3) pass. Relative tolerance 1e-5
  of the head vector's norm (a float32 rotation changes a norm by ~3 * 2^-24).
- ``sinusoidal_shift``: Vaswani et al. 2017 §3.5 chose sinusoids because PE(pos + k) is a
  fixed rotation R(k) of PE(pos); rotations keep inner products, so the Gram matrix of
  ``hook_pos_embed`` is the same at every position offset. This needs no knowledge of the
  sin/cos layout. Offsets up to 64 (positions < n_ctx). Tolerance 1e-4 of ``max(1, max|Gram|)``:
  float32 angles up to position 72 are off by < 5e-6 rad, so a Gram entry (a sum of d_model
  products <= 1) by < 2e-5 relative.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import check_protocol, forward_capture
from properties.checks import design
from properties.checks._common import LOGIT_RTOL, fmt, hook_gap, max_len, prepare, scaled_deviation
from properties.search import PropertyResult, search
from properties.strategies import position_offsets, token_batches

RELATIVE = "relative_position"
ROTARY_NORM = "rotary_norm"
SINUSOIDAL = "sinusoidal_shift"
MAX_OFFSET = 256
NORM_RTOL = 1e-5
GRAM_RTOL = 1e-4


def _tokens_and_offset(cfg, min_offset: int, max_offset: int, max_batch: int = 2, min_len: int = 1):
    """Tokens and an offset in [min_offset, max_offset] with every position below n_ctx."""
    longest = max(min_len, min(max_len(cfg), cfg.n_ctx - min_offset))

    @st.composite
    def build(draw):
        x = draw(token_batches(cfg.d_vocab, max_batch=max_batch, min_len=min_len, max_len=longest))
        top = max(min_offset, min(max_offset, cfg.n_ctx - x.shape[1]))
        return x, draw(position_offsets(top, min_offset=min_offset))

    return build()


def _describe(example) -> str:
    x, offset = example
    return f"tokens={x.tolist()} position_offset={offset}"


def relative_position(model, *, seed: int = 0, max_examples: int | None = None,
                      observed: set[str] | None = None) -> PropertyResult:
    """``forward(tokens, position_offset=c) == forward(tokens)`` for rotary, ALiBi and position-free models."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if cfg.positional_embedding_type not in ("rotary", "alibi", "none") or cfg.n_ctx < 2:
        return PropertyResult.not_applicable(RELATIVE, LOGIT_RTOL)
    strategy = _tokens_and_offset(cfg, 1, MAX_OFFSET)

    def measure(example):
        x, offset = example
        shifted, _ = forward_capture(model, x, position_offset=offset)
        reference, _ = forward_capture(model, x)
        dev, idx = scaled_deviation(shifted, reference)
        return dev, f"logits differ by {fmt(dev)} at (row, pos, vocab)={idx}"

    return search(RELATIVE, LOGIT_RTOL, strategy, measure, _describe, seed=seed, max_examples=max_examples)


def rotary_norm(model, *, seed: int = 0, max_examples: int | None = None,
                observed: set[str] | None = None) -> PropertyResult:
    """The same layer-0 input at two offsets gives equal ``|hook_rot_q|``, ``|hook_rot_k|`` per head and position."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if cfg.positional_embedding_type != "rotary":
        return PropertyResult.not_applicable(ROTARY_NORM, NORM_RTOL, f"positional_embedding_type="
                                             f"{cfg.positional_embedding_type!r}")
    observed = prepare(model, observed)
    names = ["blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"]
    gap = hook_gap(model, names, observed)
    if gap:
        return PropertyResult.unobservable(ROTARY_NORM, NORM_RTOL, gap)
    dim, style = design.rotary_layout(cfg)
    # feeding the second run the first run's layer-0 input makes "the same input" literal, so an
    # absolute position leak (relative_position's business) cannot pose as a norm change
    resid = "blocks.0.hook_resid_pre"
    patchable = hook_gap(model, [resid], observed) is None
    longest = max(1, min(max_len(cfg), cfg.n_ctx - 1))

    @st.composite
    def strategy(draw):
        x = draw(token_batches(cfg.d_vocab, max_batch=2, max_len=longest))
        top = max(1, min(MAX_OFFSET, cfg.n_ctx - x.shape[1]))
        second = draw(position_offsets(top, min_offset=1))
        return x, draw(st.integers(0, second - 1)), second

    def norms(t):
        t = t.double()
        whole = t.norm(dim=-1)  # [batch, pos, heads]
        turned = (design.pair_norms(t, dim, style) if style is not None
                  else t[..., :dim].norm(dim=-1, keepdim=True))
        return whole, turned, t[..., dim:]

    def measure(example):
        x, first, second = example
        _, a = forward_capture(model, x, position_offset=first, capture=names + ([resid] if patchable else []))
        _, b = forward_capture(model, x, position_offset=second, capture=names,
                   patch={resid: a[resid]} if patchable else None)
        worst, where = 0.0, "norms kept"
        for name, which in zip(names, ("q", "k"), strict=True):
            whole, turned_a, kept_a = norms(a[name])
            _, turned_b, kept_b = norms(b[name])
            denom = whole.clamp(min=1e-12)[..., None]
            err = torch.cat(((turned_b - turned_a).abs() / denom, (kept_b - kept_a).abs() / denom), -1)
            err = err.nan_to_num(nan=float("inf")).amax(-1)  # [batch, pos, heads]
            if float(err.max()) > worst:
                worst = float(err.max())
                bi, p, h = (int(i) for i in (err == err.max()).nonzero()[0])
                seen, before = float(b[name][bi, p, h].norm()), float(a[name][bi, p, h].norm())
                where = (f"layer 0 {which}, head {h} pos {p} (row {bi}): |rot_{which}| {fmt(seen)} at offset "
                         f"{second} vs {fmt(before)} at offset {first}")
        return worst, where

    def describe(example):
        x, first, second = example
        return f"tokens={x.tolist()} position_offsets={first},{second}"

    layout = f"rotary_dim={dim}, " + (f"{style} pairs" if style else "pair layout undeclared: whole-vector norms")
    if not patchable:
        layout += "; layer-0 input not patched (hook_resid_pre unobserved)"
    return search(ROTARY_NORM, NORM_RTOL, strategy(), measure, describe, seed=seed, max_examples=max_examples,
                  info=lambda: layout)


def sinusoidal_shift(model, *, seed: int = 0, max_examples: int | None = None,
                     observed: set[str] | None = None) -> PropertyResult:
    """The Gram matrix of ``hook_pos_embed`` does not change with ``position_offset`` (sinusoidal models)."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if cfg.positional_embedding_type != "sinusoidal" or cfg.n_ctx < 3:
        return PropertyResult.not_applicable(SINUSOIDAL, GRAM_RTOL)
    name = "hook_pos_embed"
    gap = hook_gap(model, [name], prepare(model, observed))
    if gap:
        return PropertyResult.unobservable(SINUSOIDAL, GRAM_RTOL, gap)
    strategy = _tokens_and_offset(cfg, 1, 64, max_batch=1, min_len=2)

    def measure(example):
        x, offset = example
        _, at_zero = forward_capture(model, x, capture=[name])
        _, shifted = forward_capture(model, x, position_offset=offset, capture=[name])
        p0, pc = at_zero[name][0].double(), shifted[name][0].double()  # [pos, d_model]
        dev, idx = scaled_deviation(pc @ pc.T, p0 @ p0.T)
        return dev, f"<PE(i), PE(j)> changes by {fmt(dev)} at (i, j)={idx}"

    return search(SINUSOIDAL, GRAM_RTOL, strategy, measure, _describe, seed=seed, max_examples=max_examples)
