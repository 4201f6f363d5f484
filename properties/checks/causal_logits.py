"""Causal masking, seen in the outputs: a position never sees the future.

Changing the tokens at positions >= i leaves the logits at positions < i unchanged (scaled
logit difference, ``_common.LOGIT_RTOL``); it needs only ``forward``. ``causal_pattern``
(causal_mask.py) checks the same mask where it is applied.
"""

from __future__ import annotations

from hypothesis import strategies as st

from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, max_len, scaled_deviation
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import token_batches


@st.composite  # at module level: see properties/strategies.py's token_batches
def _cut_and_shifts(draw, vocab: int, longest: int):
    x = draw(token_batches(vocab, max_batch=2, min_len=2, max_len=longest))
    n = x.shape[1]
    cut = draw(st.integers(1, n - 1))
    # each changed token moves by 1..vocab-1 ids, so it really changes; shrinks towards +1
    shifts = draw(st.lists(st.integers(1, vocab - 1), min_size=n - cut, max_size=n - cut))
    return x, cut, shifts


@model_property(name="causal_outputs", order=20, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE,
                applies=Applies(attention=("causal",), min_ctx=2, min_vocab=2,  # a change of token needs two ids
                                reason="attention_dir={cfg.attention_dir!r}"))
def causal_outputs(case: Case) -> Plan:
    """Logits at positions < i do not depend on tokens at positions >= i (causal models)."""
    model, cfg = case.model, case.cfg
    vocab = cfg.d_vocab

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

    return Plan(_cut_and_shifts(vocab, max_len(cfg)), measure, describe)
