"""Relative positions: what a model with rotary, ALiBi or no positions computes depends only on offsets.

- ``relative_position`` (rotary, alibi, none): ``forward(tokens, position_offset=c)`` equals
  ``c = 0``. RoPE scores depend on m - n only (Su et al. 2021 eq. 16), ALiBi biases on
  |i - j| (Press et al. 2022), and without positions nothing depends on position at all.
  Offsets reach ``MAX_OFFSET = 256`` or as far as positions stay < n_ctx (the protocol's
  context): float32 rotary angles at position p carry an absolute error ~p * 2^-24 < 2e-5 rad
  there, far below ``_common.LOGIT_RTOL``.
- ``rotary_norm``: RoPE rotates pairs, so ``|rot_q| == |q|`` and ``|rot_k| == |k|`` for every head
  and position; relative tolerance 1e-5 (a float32 rotation changes a norm by ~3 * 2^-24).
- ``sinusoidal_shift``: Vaswani et al. 2017 §3.5 chose sinusoids because PE(pos + k) is a
  fixed rotation R(k) of PE(pos); rotations keep inner products, so the Gram matrix of
  ``hook_pos_embed`` is the same at every position offset. This needs no knowledge of the
  sin/cos layout. Offsets up to 64 (positions < n_ctx). Tolerance 1e-4 of ``max(1, max|Gram|)``:
  float32 angles up to position 72 are off by < 5e-6 rad, so a Gram entry (a sum of d_model
  products <= 1) by < 2e-5 relative.
"""

from __future__ import annotations

from hypothesis import strategies as st

from harness.adapters.protocol import check_protocol, run
from properties.checks._common import LOGIT_RTOL, fmt, max_len, scaled_deviation
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


def relative_position(model, *, seed: int = 0, max_examples: int | None = None) -> PropertyResult:
    """``forward(tokens, position_offset=c) == forward(tokens)`` for rotary, ALiBi and position-free models."""
    check_protocol(model)
    cfg = model.cfg
    if cfg.positional_embedding_type not in ("rotary", "alibi", "none") or cfg.n_ctx < 2:
        return PropertyResult.not_applicable(RELATIVE, LOGIT_RTOL)
    strategy = _tokens_and_offset(cfg, 1, MAX_OFFSET)

    def measure(example):
        x, offset = example
        shifted, _ = run(model, x, position_offset=offset)
        reference, _ = run(model, x)
        dev, idx = scaled_deviation(shifted, reference)
        return dev, f"logits differ by {fmt(dev)} at (row, pos, vocab)={idx}"

    return search(RELATIVE, LOGIT_RTOL, strategy, measure, _describe, seed=seed, max_examples=max_examples)


def rotary_norm(model, *, seed: int = 0, max_examples: int | None = None) -> PropertyResult:
    """``|hook_rot_q| == |hook_q|`` and ``|hook_rot_k| == |hook_k|`` per head and position (rotary models)."""
    check_protocol(model)
    cfg = model.cfg
    if cfg.positional_embedding_type != "rotary":
        return PropertyResult.not_applicable(ROTARY_NORM, NORM_RTOL)
    pairs = [(f"blocks.{layer}.attn.hook_{a}", f"blocks.{layer}.attn.hook_rot_{a}", layer, a)
             for layer in range(cfg.n_layers) for a in ("q", "k")]
    strategy = _tokens_and_offset(cfg, 0, MAX_OFFSET)

    def measure(example):
        x, offset = example
        _, acts = run(model, x, position_offset=offset, capture=[n for p in pairs for n in p[:2]])
        worst, where = 0.0, "norms kept"
        for plain, rotated, layer, which in pairs:
            before = acts[plain].double().norm(dim=-1)  # [batch, pos, heads]
            after = acts[rotated].double().norm(dim=-1)
            err = ((after - before).abs() / before.clamp(min=1e-12)).nan_to_num(nan=float("inf"))
            if float(err.max()) > worst:
                worst = float(err.max())
                b, p, h = (int(i) for i in (err == err.max()).nonzero()[0])
                where = (f"layer {layer} {which}, head {h} pos {p} (row {b}): |rot| {fmt(float(after[b, p, h]))} "
                         f"vs |{which}| {fmt(float(before[b, p, h]))}")
        return worst, where

    return search(ROTARY_NORM, NORM_RTOL, strategy, measure, _describe, seed=seed, max_examples=max_examples)


def sinusoidal_shift(model, *, seed: int = 0, max_examples: int | None = None) -> PropertyResult:
    """The Gram matrix of ``hook_pos_embed`` does not change with ``position_offset`` (sinusoidal models)."""
    check_protocol(model)
    cfg = model.cfg
    if cfg.positional_embedding_type != "sinusoidal" or cfg.n_ctx < 3:
        return PropertyResult.not_applicable(SINUSOIDAL, GRAM_RTOL)
    name = "hook_pos_embed"
    strategy = _tokens_and_offset(cfg, 1, 64, max_batch=1, min_len=2)

    def measure(example):
        x, offset = example
        _, at_zero = run(model, x, capture=[name])
        _, shifted = run(model, x, position_offset=offset, capture=[name])
        p0, pc = at_zero[name][0].double(), shifted[name][0].double()  # [pos, d_model]
        dev, idx = scaled_deviation(pc @ pc.T, p0 @ p0.T)
        return dev, f"<PE(i), PE(j)> changes by {fmt(dev)} at (i, j)={idx}"

    return search(SINUSOIDAL, GRAM_RTOL, strategy, measure, _describe, seed=seed, max_examples=max_examples)
