"""KV cache: incremental decoding gives the logits a full recompute gives.

Decodes through the model's own cache, the one people actually run:

- a model with ``forward_with_cache(tokens, attention_mask=None, past=None) -> (logits, past)``
  (the optional :class:`harness.adapters.protocol.CachedDecoding` method; ``harness.Transformer``
  has it, an HF adapter maps it onto ``past_key_values``) prefills a prompt, optionally
  left-padded, then feeds drawn continuation tokens in chunks of 1-2 (a chunk of two after a
  prefill exercises the causal mask inside a cached step);
- otherwise a model with ``generate(tokens, max_new_tokens, *, temperature, attention_mask,
  return_logits)`` decodes greedily (temperature 0) and returns the logits that chose each token;
- a causal model with neither is marked not applicable.

The same logits must come out of one forward pass over the whole sequence; a left-padded row is
recomputed alone without its padding (:func:`_recomputed` says why). Deviation: scaled logit
difference (``_common.LOGIT_RTOL``). Needs only the model's outputs, no hook.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import CACHED_DECODING, call_model, has_cached_decoding, model_device
from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, draw_chunks, fmt, max_len, scaled_deviation
from properties.cost import one_pass
from properties.precision import forward_capture, twinned
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import padded_batches, token_batches

GENERATE_ARGS = ("max_new_tokens", "temperature", "attention_mask", "return_logits")
MAX_NEW = 4
MAX_CHUNK = 2


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


def _prompts(cfg, n: int):
    prompts = [token_batches(cfg.d_vocab, max_batch=2, max_len=n).map(lambda x: (x, None))]
    if n >= 2:  # prompts pad on the left, so the last prompt position is a real token
        prompts.append(padded_batches(cfg.d_vocab, max_len=max(1, n // 2), max_pad=max(1, n - n // 2),
                                      sides=("left",)).map(lambda p: (p.tokens, p.mask)))
    return st.one_of(*prompts)


def _describe_prompt(x, mask) -> str:
    return f"prompt={x.tolist()}" + ("" if mask is None else f" mask={mask.tolist()}")


def _recomputed(model: Any, tokens: torch.Tensor, mask: Optional[torch.Tensor], cached: torch.Tensor) -> torch.Tensor:
    """The full forward's logits at the positions of ``cached`` ``[batch, steps, d_vocab]``, the last of ``tokens``.

    A left-padded prompt's row is recomputed alone, without its padding: under the protocol its
    tokens keep their positions (a position counts the real tokens before it), so in exact arithmetic
    these are the logits cached decoding of the padded batch must give, and the pass the floor is
    measured on holds only real tokens. A padded query's logits are not compared, and their rounding
    is not this check's: measured in the floor, they took SmolLM2-135M's bfloat16 floor from 0.030
    (the row alone) to 0.13 (allowance 0.51), under which a decoding step numbered one position too
    high (0.27 of the logits' scale) passed (docs/precision.md, "Detection power").
    """
    steps = cached.shape[1]
    if mask is None or bool(mask.all()):
        return forward_capture(model, tokens)[0][:, -steps:]
    if not bool(torch.isfinite(cached).all()):
        # a padded prompt whose decoding went non-finite: the padded pass shows whether the padding itself
        # does (an all-masked row: finite_outputs' finding, this row then "not comparable"), which the rows
        # alone cannot
        full_mask = torch.cat((mask, mask.new_ones(mask.shape[0], tokens.shape[1] - mask.shape[1])), 1)
        forward_capture(model, tokens, attention_mask=full_mask)
    rows = []
    for row, real in zip(tokens, mask.bool(), strict=True):
        keep = torch.cat((real, real.new_ones(tokens.shape[1] - real.shape[0])))
        rows.append(forward_capture(model, row[keep][None])[0][:, -steps:])
    return torch.cat(rows, 0)


def _decodes(model: Any) -> Optional[str]:
    if has_cached_decoding(model) or has_cache_interface(model):
        return None
    return f"no {CACHED_DECODING} or generate method"


@model_property(name="kv_cache", order=120, calibrated=True, tolerance=LOGIT_RTOL,
                rule=LOGIT_RULE,
                applies=Applies(attention=("causal",), min_ctx=2, reason="attention_dir={cfg.attention_dir!r}",
                                when=_decodes, when_doc=f"has {CACHED_DECODING} or generate"))
def kv_cache(case: Case) -> Plan:
    """Cached decoding (``forward_with_cache``, else greedy ``generate``) equals a full forward pass."""
    model, cfg = case.model, case.cfg
    new_max = min(MAX_NEW, cfg.n_ctx - 1)
    n = max(1, min(max_len(cfg), cfg.n_ctx - new_max))  # prompt tokens + new tokens fit the context
    if has_cached_decoding(model):
        return _through_cache(model, cfg, n, new_max)
    return _through_generate(model, cfg, n, new_max)


@st.composite  # at module level: see properties/strategies.py's token_batches
def _prompt_and_chunks(draw, prompts, d_vocab: int, new_max: int):
    x, mask = draw(prompts)
    return x, mask, draw_chunks(draw, d_vocab, x.shape[0], new_max, MAX_CHUNK)


def _through_cache(model, cfg, n: int, new_max: int) -> Plan:
    strategy = _prompt_and_chunks(_prompts(cfg, n), cfg.d_vocab, new_max)

    def decode(m: Any, x: torch.Tensor, mask: Optional[torch.Tensor], chunks: list) -> torch.Tensor:
        """The logits of ``m``'s cached decoding: the prompt's last token, then every chunk's."""
        device = model_device(m)
        with torch.no_grad():
            with one_pass():  # a decoding step runs the network, maybe not through forward: counted (cost.py)
                logits, past = call_model(getattr(m, CACHED_DECODING), x.to(device),
                                          attention_mask=None if mask is None else mask.to(device), past=None)
            outs = [logits[:, -1:]]
            for chunk in chunks:
                with one_pass():
                    step, past = call_model(getattr(m, CACHED_DECODING), x.new_tensor(chunk).to(device),
                                            attention_mask=None, past=past)
                outs.append(step)
        return torch.cat([o.detach().to("cpu", torch.float64) for o in outs], 1)

    def measure(example):
        x, mask, chunks = example
        # the cached path's rounding is in the floor too (twinned): the comparison has two sides
        cached = twinned(model, lambda m: decode(m, x, mask, chunks))
        tokens = torch.cat([x] + [x.new_tensor(c) for c in chunks], 1)
        dev, idx = scaled_deviation(cached, _recomputed(model, tokens, mask, cached))
        return dev, (f"cached logits differ from a full recompute by {fmt(dev)} at (row, step, vocab)={idx} "
                     f"(step 0 = the prompt's last token)")

    def describe(example):
        x, mask, chunks = example
        return _describe_prompt(x, mask) + f" then chunks={chunks}"

    return Plan(strategy, measure, describe, info=lambda: f"decoded through {CACHED_DECODING}")


def _through_generate(model, cfg, n: int, new_max: int) -> Plan:
    strategy = st.tuples(_prompts(cfg, n), st.integers(1, new_max))
    kwargs = {"use_cache": True} if "use_cache" in inspect.signature(model.generate).parameters else {}

    def measure(example):
        (x, mask), n_new = example
        device = model_device(model)
        with torch.no_grad():
            out, steps = call_model(model.generate, x.to(device), n_new, temperature=0.0,
                                    attention_mask=None if mask is None else mask.to(device),
                                    return_logits=True, **kwargs)
        out, steps = out.cpu(), steps.cpu().double()
        dev, idx = scaled_deviation(steps, _recomputed(model, out[:, : x.shape[1] + n_new - 1], mask, steps))
        return dev, f"cached logits differ from a full recompute by {fmt(dev)} at (row, step, vocab)={idx}"

    def describe(example):
        (x, mask), n_new = example
        return _describe_prompt(x, mask) + f" new tokens={n_new}"

    return Plan(strategy, measure, describe, info=lambda: "decoded through generate (greedy)")
