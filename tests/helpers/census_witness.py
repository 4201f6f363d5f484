"""Witnesses for the census's findings (reports/census/findings.py FINDINGS), each independent of the property suite.

Each rebuilds the census's own tiny model (``reports.census.shrink.build``) and shows the bug on the
raw Hugging Face model; it raises AssertionError once the bug no longer reproduces.
"""

from __future__ import annotations

import inspect

import torch

from reports.census.enumerate import by_name
from reports.census.shrink import build
from tests.helpers.zoo_witness import falcon_output_attentions_leaks_future


def _tiny(model_type: str):
    mt = by_name()[model_type]
    return build(mt.name, mt.class_name)


def falcon_census(model_type: str = "falcon") -> str:
    """Falcon's eager branch under output_attentions=True adds sdpa's boolean mask to the scores (the zoo's finding)."""
    return falcon_output_attentions_leaks_future(_tiny(model_type))


def _real_logits(model, tokens, mask, **kw):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask), **kw).logits


def left_padding_moves_positions(model_type: str) -> str:
    """The model's forward takes no ``position_ids`` and numbers its learned positions by index, so a left pad
    moves every real token one position on: the same real tokens give other logits, though the mask hides the pad.

    Witness: the raw model. ``[5, 7]`` against ``[pad, 5, 7]`` with the pad masked: the real tokens' logits
    differ; changing the pad's id changes nothing (the mask works; only the positions moved).
    """
    model = _tiny(model_type)
    assert "position_ids" not in inspect.signature(model.forward).parameters, model_type
    plain = _real_logits(model, [[5, 7]], [[1, 1]])
    padded = _real_logits(model, [[0, 5, 7]], [[0, 1, 1]])[:, 1:]
    other_pad = _real_logits(model, [[1, 5, 7]], [[0, 1, 1]])[:, 1:]
    moved, pad_seen = float((plain - padded).abs().max()), float((padded - other_pad).abs().max())
    assert moved > 1e-4 and pad_seen < 1e-6, (moved, pad_seen)
    return (f"{type(model).__name__}.forward takes no position_ids; one masked left pad moves the real tokens' "
            f"logits by {moved:.3g}; the pad's id moves them by {pad_seen:.3g}")


def padding_leaks_into_real_tokens(model_type: str) -> str:
    """A masked pad's token id reaches the real tokens (a convolution over neighbouring embeddings or an unmasked
    mixer): with the pad masked and positions given as the protocol counts them, its id still moves the logits.

    Witness: the raw model, ``[pad, 5, 7]`` with the pad masked, pad id 0 against 1.
    """
    model = _tiny(model_type)
    kw = {"position_ids": torch.tensor([[0, 0, 1]])} if "position_ids" in \
        inspect.signature(model.forward).parameters else {}
    a = _real_logits(model, [[0, 5, 7]], [[0, 1, 1]], **kw)[:, 1:]
    b = _real_logits(model, [[1, 5, 7]], [[0, 1, 1]], **kw)[:, 1:]
    leak = float((a - b).abs().max())
    assert leak > 1e-5, leak
    return f"{type(model).__name__}: the masked pad's id moves the real tokens' logits by {leak:.3g}"


def window_ignored(model_type: str) -> str:
    """The config declares ``sliding_window`` but the model masks with plain ``create_causal_mask`` (no window
    overlay, no ``sliding_window`` passed to the attention function): every query sees every earlier key.

    Witness: the raw model under eager attention, ``output_attentions=True``, on w + 2 tokens: the last query's
    weight on key 0, at distance w + 1, is positive, though a window of w admits no key that far back
    (under transformers' convention ``i - w < j``, nor under the looser ``i - j <= w``).
    """
    model = _tiny(model_type)
    model.set_attn_implementation("eager")
    w = int(model.config.sliding_window)
    tokens = torch.arange(w + 2)[None] % model.config.vocab_size
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_attentions=True)
    seen = min(float(a[0, :, w + 1, 0].min()) for a in out.attentions)
    assert seen > 1e-3, seen
    return (f"{type(model).__name__}: config.sliding_window={w}, yet query {w + 1} puts weight >= {seen:.3g} "
            f"on key 0 (distance {w + 1}) in every layer and head")


# witness name -> function of the model type (reports/census/findings.py names them)
WITNESSES = {f.__name__: f for f in (falcon_census, left_padding_moves_positions, padding_leaks_into_real_tokens,
                                     window_ignored)}
