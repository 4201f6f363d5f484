"""Finite outputs: no NaN or inf in the logits or in any hooked activation, for every valid input.

Valid inputs include padded batches: with left padding in a causal model the padded queries
see no real key at all, so a kernel that turns an all-masked row into 0/0 returns NaN there
(PyTorch #103749, #103963 and #109517: ``scaled_dot_product_attention`` on fully masked rows),
and a NaN in a masked-out value still reaches real rows through ``0 * NaN`` at the next layer.
Each input runs twice: without hooks (the model's fast kernel path) and with every hook point
captured (which may switch a model to its explicit path). ``-inf`` is allowed only in
``hook_attn_scores``, where it is how masked scores are written. Deviation: the number of
non-finite entries (tolerance 0); the counterexample names the first hook, in forward order,
where one appears.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from harness.adapters.protocol import forward_capture
from properties.checks._common import max_len
from properties.registry import Case, Plan, model_property
from properties.search import masked_text
from properties.strategies import padded_batches, token_batches


def _bad(name: str, t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return torch.zeros_like(t, dtype=torch.bool)
    if name.endswith("hook_attn_scores"):
        return t.isnan() | (t == math.inf)
    return ~torch.isfinite(t)


@model_property(name="finite_outputs", order=170, tolerance=0.0,
                rule="exact: the number of non-finite entries (-inf allowed only in hook_attn_scores)",
                needs_doc="every hook that fires (none required)")
def finite_outputs(case: Case) -> Plan:
    """Logits and every hooked activation are finite, padded rows (even all-masked queries) included."""
    model, cfg = case.model, case.cfg
    # the hooks that fire on this model (an opt-in point nobody calls is not one of its activations)
    names = [nm for nm in model.hook_dict if nm in case.observed]
    n = max_len(cfg)
    inputs = [token_batches(cfg.d_vocab, max_batch=2, max_len=n).map(lambda x: (x, None))]
    if n >= 2:
        padded = padded_batches(cfg.d_vocab, max_len=max(1, n // 2), max_pad=max(1, n - n // 2))
        inputs.insert(0, padded.map(lambda p: (p.tokens, p.mask)))  # shrinks towards the padded case
    strategy = st.one_of(*inputs)

    def measure(example):
        x, mask = example
        plain, _ = forward_capture(model, x, attention_mask=mask)
        logits, acts = forward_capture(model, x, attention_mask=mask, capture=names)
        found = list(acts.items())  # in the order the hooks first fired: the first bad one is where it starts
        found += [("logits (every hook captured)", logits), ("logits (no hooks attached)", plain)]
        total, where = 0, "all finite"
        for nm, t in found:
            bad = _bad(nm, t)
            count = int(bad.sum())
            if count and total == 0:
                idx = tuple(int(i) for i in bad.nonzero()[0])
                where = f"first non-finite value in {nm}: {float(t[idx])} at index {idx} of shape {tuple(t.shape)}"
            total += count
        return float(total), (where if total == 0 else f"{total} non-finite values; {where}")

    return Plan(strategy, measure, masked_text)
