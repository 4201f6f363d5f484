"""Padding changes nothing for real tokens.

With random left or right padding of random length and random pad ids (``attention_mask``
0 on pads), ``padding_outputs``: the logits at real positions equal each row run alone
unpadded (scaled logit difference, ``_common.LOGIT_RTOL``); ``padding_pattern``: no real
query puts any weight on a padded key (tolerance 0, see ``_common``). By the protocol a
token's position counts only the real tokens before it, so left padding moves no position.
"""

from __future__ import annotations

from harness.adapters.protocol import check_protocol, forward_capture
from properties.checks._common import LOGIT_RTOL, fmt, hook_gap, max_len, prepare, scaled_deviation
from properties.search import PropertyResult, search
from properties.strategies import padded_batches

OUTPUTS = "padding_outputs"
PATTERN = "padding_pattern"


def _strategy(cfg):
    n = max_len(cfg, cap=10)
    return padded_batches(cfg.d_vocab, max_batch=2, max_len=max(1, n * 3 // 5), max_pad=max(1, n - n * 3 // 5))


def padding_outputs(model, *, seed: int = 0, max_examples: int | None = None,
                    observed: set[str] | None = None) -> PropertyResult:
    """Logits at real positions of a padded batch equal each row's unpadded logits."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if cfg.n_ctx < 2:
        return PropertyResult.not_applicable(OUTPUTS, LOGIT_RTOL, "n_ctx < 2")

    def measure(batch):
        padded, _ = forward_capture(model, batch.tokens, attention_mask=batch.mask)
        worst, where = 0.0, "real-token logits unchanged"
        for r, row in enumerate(batch.rows):
            alone, _ = forward_capture(model, batch.tokens.new_tensor([row]))
            dev, idx = scaled_deviation(padded[r, batch.real_positions(r)], alone[0])
            if dev >= worst:
                worst = dev
                where = (f"row {r} ({batch.sides[r]}-padded): logits differ by {fmt(dev)} "
                         f"at (real pos, vocab)={idx}")
        return worst, where

    return search(OUTPUTS, LOGIT_RTOL, _strategy(cfg), measure, lambda b: b.describe(),
                  seed=seed, max_examples=max_examples)


def padding_pattern(model, *, seed: int = 0, max_examples: int | None = None,
                    observed: set[str] | None = None) -> PropertyResult:
    """No real query's ``hook_pattern`` row puts weight on a padded key, in any layer or head."""
    check_protocol(model, hooks=False)
    cfg = model.cfg
    if cfg.n_ctx < 2:
        return PropertyResult.not_applicable(PATTERN, 0.0, "n_ctx < 2")
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
    gap = hook_gap(model, names, prepare(model, observed))
    if gap:
        return PropertyResult.unobservable(PATTERN, 0.0, gap)

    def measure(batch):
        _, acts = forward_capture(model, batch.tokens, attention_mask=batch.mask, capture=names)
        real = batch.mask.bool()
        worst, where = 0.0, "no weight on padded keys"
        for layer, name in enumerate(names):
            p = acts[name].double().abs().nan_to_num(nan=float("inf"))  # [batch, n_heads, q, k]
            leak = p.where(real[:, None, :, None] & ~real[:, None, None, :], p.new_zeros(()))
            if float(leak.max()) > worst:
                worst = float(leak.max())
                b, h, q, k = (int(i) for i in (leak == leak.max()).nonzero()[0])
                where = f"layer {layer} head {h}: real query {q} puts weight {fmt(worst)} on padded key {k} (row {b})"
        return worst, where

    return search(PATTERN, 0.0, _strategy(cfg), measure, lambda b: b.describe(),
                  seed=seed, max_examples=max_examples)
