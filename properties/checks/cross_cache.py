"""Cross-attention's KV cache: computed once, and cached decoding equals recomputation.

Through the model's ``forward_with_cache`` (harness.adapters.protocol.CachedDecoding), with the source
given at the first call only (docs/architecture.md, "Encoder-decoders"): a prompt of decoder tokens is
prefilled against a padded source, then drawn continuation tokens follow in chunks of 1-2. Cross-
attention's keys and values depend on the source alone, so after the first call no layer may compute
them again (``blocks.{l}.cross_attn.hook_k`` must not fire), and the logits of every step must equal one
forward pass over the whole target with the same source (scaled logit difference, measured allowance).
A recomputation is reported with deviation 1, far above any allowance.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import CACHED_DECODING, call_model, has_cached_decoding, model_device
from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, draw_chunks, fmt, max_len, scaled_deviation
from properties.checks._seq2seq import HIDDEN, seq2seq_only, source_examples
from properties.precision import forward_capture
from properties.registry import Applies, Case, Plan, model_property

MAX_NEW = 3
MAX_CHUNK = 2


def _decodes(model: Any) -> Optional[str]:
    reason = seq2seq_only(model)
    if reason is None and not has_cached_decoding(model):
        reason = f"no {CACHED_DECODING} method"
    return reason


@st.composite  # at module level: see properties/strategies.py's token_batches
def _source_and_chunks(draw, prompts, d_vocab: int, new_max: int):
    ex = draw(prompts)
    return ex, draw_chunks(draw, d_vocab, ex.tokens.shape[0], new_max, MAX_CHUNK)


@model_property(name="cross_kv_cache", order=210, calibrated=True, tolerance=LOGIT_RTOL, rule=LOGIT_RULE,
                applies=Applies(min_ctx=2, reason="n_ctx < 2", when=_decodes,
                                when_doc=f"encoder-decoders (cfg.is_encoder_decoder) with {CACHED_DECODING}"),
                needs=("blocks.{layer}.cross_attn.hook_k",))
def cross_kv_cache(case: Case) -> Plan:
    """Cached decoding computes cross-attention's keys once, at the first call, and equals recomputation."""
    model, cfg, names = case.model, case.cfg, list(case.hooks)
    new_max = min(MAX_NEW, cfg.n_ctx - 1)
    prompts = source_examples(cfg).filter(lambda ex: ex.tokens.shape[1] + new_max <= max_len(cfg))

    strategy = _source_and_chunks(prompts, cfg.d_vocab, new_max)

    def measure(example):
        ex, chunks = example
        device = model_device(model)
        fired: list[str] = []
        counting = [(name, lambda t, hook, name=name: fired.append(name)) for name in names]
        decode = getattr(model, CACHED_DECODING)
        source = {k: v.to(device) for k, v in ex.inputs().items()}
        with torch.no_grad():
            logits, past = call_model(decode, ex.tokens.to(device), attention_mask=None, past=None, **source)
            outs = [logits]
            with model.hooks(fwd_hooks=counting):
                for step, chunk in enumerate(chunks, 1):
                    logits, past = call_model(decode, ex.tokens.new_tensor(chunk).to(device), attention_mask=None,
                                              past=past)
                    outs.append(logits)
                    if fired:
                        return HIDDEN, (f"{fired[0]} fired {len(fired)} time(s) at cached step {step}: cross-"
                                        f"attention's keys are computed again instead of read from the cache")
        cached = torch.cat([o.detach().to("cpu", torch.float64) for o in outs], 1)
        tokens = torch.cat([ex.tokens] + [ex.tokens.new_tensor(c) for c in chunks], 1)
        full, _ = forward_capture(model, tokens, inputs=ex.inputs())
        dev, idx = scaled_deviation(cached, full)
        return dev, f"cached logits differ from a full recompute by {fmt(dev)} at (row, pos, vocab)={idx}"

    def describe(example):
        ex, chunks = example
        return ex.describe() + f" then chunks={chunks}"

    return Plan(strategy, measure, describe, info=lambda: f"decoded through {CACHED_DECODING}")
