"""KV cache: incremental decoding gives the logits a full recompute gives.

Applies to causal models with a ``generate(tokens, max_new_tokens, *, temperature,
attention_mask, return_logits)`` method (``harness.Transformer`` has one); a model without
a cache interface is marked not applicable. Greedy decoding (temperature 0) from a prompt,
optionally left-padded, returns the logits that chose each new token; the same logits must
come out of one forward pass over the whole generated sequence. Deviation: scaled logit
difference (``_common.LOGIT_RTOL``).
"""

from __future__ import annotations

import inspect

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import check_protocol, model_device, run
from properties.checks._common import LOGIT_RTOL, fmt, max_len, scaled_deviation
from properties.search import PropertyResult, search
from properties.strategies import padded_batches, token_batches

NAME = "kv_cache"
GENERATE_ARGS = ("max_new_tokens", "temperature", "attention_mask", "return_logits")
MAX_NEW = 4


def has_cache_interface(model) -> bool:
    """Whether ``model.generate`` takes the arguments this check passes."""
    generate = getattr(model, "generate", None)
    if not callable(generate):
        return False
    try:
        params = inspect.signature(generate).parameters
    except (TypeError, ValueError):
        return False
    return all(a in params for a in GENERATE_ARGS)


def kv_cache(model, *, seed: int = 0, max_examples: int | None = None) -> PropertyResult:
    """Greedy ``generate`` logits (cached decoding) equal a full forward pass over the generated tokens."""
    check_protocol(model)
    cfg = model.cfg
    if cfg.attention_dir != "causal" or not has_cache_interface(model) or cfg.n_ctx < 2:
        return PropertyResult.not_applicable(NAME, LOGIT_RTOL)
    new_max = min(MAX_NEW, cfg.n_ctx - 1)
    n = max(1, min(max_len(cfg), cfg.n_ctx - new_max))  # prompt tokens + new tokens fit the context
    prompts = [token_batches(cfg.d_vocab, max_batch=2, max_len=n).map(lambda x: (x, None))]
    if n >= 2:  # generation pads on the left, so the last prompt position is a real token
        prompts.append(padded_batches(cfg.d_vocab, max_len=max(1, n // 2), max_pad=max(1, n - n // 2),
                                      sides=("left",)).map(lambda p: (p.tokens, p.mask)))
    strategy = st.tuples(st.one_of(*prompts), st.integers(1, new_max))
    kwargs = {"use_cache": True} if "use_cache" in inspect.signature(model.generate).parameters else {}

    def measure(example):
        (x, mask), n_new = example
        device = model_device(model)
        with torch.no_grad():
            out, steps = model.generate(x.to(device), n_new, temperature=0.0,
                                        attention_mask=None if mask is None else mask.to(device),
                                        return_logits=True, **kwargs)
        out, steps = out.cpu(), steps.cpu().double()
        full_mask = torch.ones_like(out) if mask is None else torch.cat((mask, torch.ones_like(out[:, x.shape[1]:])), 1)
        full, _ = run(model, out, attention_mask=full_mask)
        p = x.shape[1]
        dev, idx = scaled_deviation(steps, full[:, p - 1:p - 1 + n_new])
        return dev, f"cached logits differ from a full recompute by {fmt(dev)} at (row, step, vocab)={idx}"

    def describe(example):
        (x, mask), n_new = example
        return f"prompt={x.tolist()}" + ("" if mask is None else f" mask={mask.tolist()}") + f" new tokens={n_new}"

    return search(NAME, LOGIT_RTOL, strategy, measure, describe, seed=seed, max_examples=max_examples)
