"""Finite outputs: no NaN or inf in the logits or in any hooked activation, for every valid input.

Valid inputs include padded batches: with left padding in a causal model the padded queries
see no real key at all, so a kernel that turns an all-masked row into 0/0 returns NaN there
(PyTorch #103749, #103963 and #109517: ``scaled_dot_product_attention`` on fully masked rows),
and a NaN in a masked-out value still reaches real rows through ``0 * NaN`` at the next layer.
It searches where the other properties search: padded batches, plain ones, and position offsets
up to ``MAX_OFFSET`` (where a rotary or learned table, or a bfloat16/float16 activation, may
overflow), with sequences as long as the windowed checks draw. Each input runs twice: without
hooks (the model's fast kernel path) and with every hook point
captured (which may switch a model to its explicit path). ``-inf`` is allowed only in
``hook_attn_scores`` and in hooks of additive masks and biases (names ending ``_bias``/``_mask``), where it is
how masked scores are written. Deviation: the number of
non-finite entries (tolerance 0); the counterexample names the first hook, in forward order,
where one appears, and its layer. Other calibrated rows on a model that goes non-finite say
"not comparable" and point here (properties/precision.py).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import forward_capture
from properties.checks._common import max_len, tokens_and_offset
from properties.checks.window import MAX_WINDOW_LEN
from properties.precision import nonfinite_mask
from properties.registry import Case, Plan, model_property
from properties.search import masked_text
from properties.strategies import padded_batches, token_batches

MAX_OFFSET = 256  # as far as relative_position and rotary_norm move positions


@model_property(name="finite_outputs", order=170, tolerance=0.0, judges_nonfinite=True,
                rule="exact: the number of non-finite entries (-inf allowed only in hook_attn_scores and additive "
                     "mask/bias hooks)",
                needs_doc="every hook that fires (none required)")
def finite_outputs(case: Case) -> Plan:
    """Logits and every hooked activation are finite, padded rows (even all-masked queries) included."""
    model, cfg = case.model, case.cfg
    # the hooks that fire on this model (an opt-in point nobody calls is not one of its activations)
    names = [nm for nm in model.hook_dict if nm in case.observed]
    n = max_len(cfg)
    inputs = [token_batches(cfg.d_vocab, max_batch=2, max_len=n).map(lambda x: (x, None, 0))]
    if n >= 2:
        padded = padded_batches(cfg.d_vocab, max_len=max(1, n // 2), max_pad=max(1, n - n // 2))
        inputs.insert(0, padded.map(lambda p: (p.tokens, p.mask, 0)))  # shrinks towards the padded case
    if cfg.n_ctx > 1:  # far positions and longer sequences, as relative_position and sliding_window draw
        longer = min(cfg.n_ctx, MAX_WINDOW_LEN)
        inputs.append(tokens_and_offset(cfg, 1, MAX_OFFSET).map(lambda e: (e[0], None, e[1])))
        inputs.append(token_batches(cfg.d_vocab, max_batch=1, min_len=1, max_len=longer).map(lambda x: (x, None, 0)))
    strategy = st.one_of(*inputs)

    bos = getattr(cfg, "bos_token_id", None)

    def measure(example):
        x, mask, offset = example
        if bos is not None and x.shape[1] > 1:
            # as a real prompt reads: <bos> as each row's first real token (a trained model's largest
            # activations can sit on it: Gemma-3's residual passes float16's range only after <bos>)
            first_real = torch.zeros(x.shape[0], dtype=torch.long) if mask is None else mask.long().argmax(dim=1)
            prompted = x.clone()
            prompted[torch.arange(x.shape[0]), first_real] = bos
            if not torch.equal(prompted, x):
                total, where = _count(prompted, mask, offset)
                if total:
                    return total, f"{where} (with <bos>={bos} as the first real token: {prompted.tolist()})"
        return _count(x, mask, offset)

    def _count(x, mask, offset):
        plain, _ = forward_capture(model, x, attention_mask=mask, position_offset=offset)
        logits, acts = forward_capture(model, x, attention_mask=mask, position_offset=offset, capture=names)
        found = list(acts.items())  # in the order the hooks first fired: the first bad one is where it starts
        found += [("logits (every hook captured)", logits), ("logits (no hooks attached)", plain)]
        total, where = 0, "all finite"
        for nm, t in found:
            bad = nonfinite_mask(nm, t)
            count = int(bad.sum())
            if count and total == 0:
                idx = tuple(int(i) for i in bad.nonzero()[0])
                where = (f"first non-finite value in {_layer(nm)}{nm}: {float(t[idx])} at index {idx} of shape "
                         f"{tuple(t.shape)} ({t.dtype})")
            total += count
        return float(total), (where if total == 0 else f"{total} non-finite values; {where}")

    def describe(example):
        x, mask, offset = example
        return masked_text((x, mask)) + (f" position_offset={offset}" if offset else "")

    return Plan(strategy, measure, describe)


def _layer(name: str) -> str:
    parts = name.split(".")
    return f"layer {parts[1]}, " if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else ""
