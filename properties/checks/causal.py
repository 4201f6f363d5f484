"""Causal masking: a position never sees the future.

``causal_outputs``: changing the tokens at positions >= i leaves the logits at positions < i
unchanged (scaled logit difference, ``_common.LOGIT_RTOL``); it needs only ``forward``.
``causal_pattern``: every layer's ``hook_pattern`` is exactly 0 above the diagonal and, where the
model declares a sliding window, outside it (tolerance 0, see ``_common``).
"""

from __future__ import annotations

from hypothesis import strategies as st

from harness.adapters.protocol import check_protocol, forward_capture
from properties.checks import design
from properties.checks._common import LOGIT_RTOL, fmt, hook_gap, max_len, prepare, scaled_deviation
from properties.search import PropertyResult, search
from properties.strategies import token_batches

OUTPUTS = "causal_outputs"
PATTERN = "causal_pattern"


def _applicable(cfg) -> bool:
    return cfg.attention_dir == "causal" and cfg.n_ctx >= 2


def causal_outputs(model, *, seed: int = 0, max_examples: int | None = None,
                   observed: set[str] | None = None) -> PropertyResult:
    """Logits at positions < i do not depend on tokens at positions >= i (causal models)."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if not _applicable(cfg) or cfg.d_vocab < 2:  # a change of token needs two ids
        return PropertyResult.not_applicable(OUTPUTS, LOGIT_RTOL, f"attention_dir={cfg.attention_dir!r}")
    vocab = cfg.d_vocab

    @st.composite
    def strategy(draw):
        x = draw(token_batches(vocab, max_batch=2, min_len=2, max_len=max_len(cfg)))
        n = x.shape[1]
        cut = draw(st.integers(1, n - 1))
        # each changed token moves by 1..vocab-1 ids, so it really changes; shrinks towards +1
        shifts = draw(st.lists(st.integers(1, vocab - 1), min_size=n - cut, max_size=n - cut))
        return x, cut, shifts

    def changed(example):
        x, cut, shifts = example
        y = x.clone()
        y[:, cut:] = (x[:, cut:] + x.new_tensor(shifts)) % vocab
        return y

    def measure(example):
        x, cut, _ = example
        a, _ = forward_capture(model, x)
        b, _ = forward_capture(model, changed(example))
        dev, idx = scaled_deviation(b[:, :cut], a[:, :cut])
        return dev, f"logits before the cut differ by {fmt(dev)} at (row, pos, vocab)={idx}"

    def describe(example):
        x, cut, _ = example
        return f"tokens={x.tolist()} changed from pos {cut} to {changed(example).tolist()}"

    return search(OUTPUTS, LOGIT_RTOL, strategy(), measure, describe, seed=seed, max_examples=max_examples)


def causal_pattern(model, *, seed: int = 0, max_examples: int | None = None,
                   observed: set[str] | None = None) -> PropertyResult:
    """``hook_pattern`` is exactly 0 on every key a query may not see (causal models).

    Future keys, and with a declared ``cfg.sliding_window`` the keys at ``i - j >= w`` too
    (``design.allowed_keys``); weight inside the window is allowed.
    """
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if not _applicable(cfg):
        return PropertyResult.not_applicable(PATTERN, 0.0, f"attention_dir={cfg.attention_dir!r}")
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
    gap = hook_gap(model, names, prepare(model, observed))
    if gap:
        return PropertyResult.unobservable(PATTERN, 0.0, gap)
    windows = [design.window(cfg, layer) for layer in range(cfg.n_layers)]

    def measure(x):
        _, acts = forward_capture(model, x, capture=names)
        worst, where = 0.0, "no weight on a key outside the causal window"
        for layer, name in enumerate(names):
            p = acts[name].double()  # [batch, n_heads, q, k]
            hidden = ~design.allowed_keys(cfg, layer, x.shape[1])
            outside = p.abs().where(hidden, p.new_zeros(())).nan_to_num(nan=float("inf"))
            if float(outside.max()) > worst:
                worst = float(outside.max())
                b, h, q, k = (int(i) for i in (outside == outside.max()).nonzero()[0])
                kind = "future key" if k > q else f"key outside its window of {windows[layer]}"
                where = f"layer {layer} head {h}: query {q} puts weight {fmt(worst)} on {kind} {k} (row {b})"
        return worst, where

    strategy = token_batches(cfg.d_vocab, max_batch=2, min_len=2, max_len=max_len(cfg))
    return search(PATTERN, 0.0, strategy, measure, lambda x: f"tokens={x.tolist()}",
                  seed=seed, max_examples=max_examples, info=lambda: design.design_summary(cfg))
