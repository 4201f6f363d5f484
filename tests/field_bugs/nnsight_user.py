"""nnsight #672 as a user meets it: one batched ``trace`` with an invoke per prompt, which nnsight left-pads.

The bug lived in nnsight's batching: it padded the prompts on the left and called the model's bare
forward without ``position_ids``, so GPT-2's learned positions of every shorter prompt were shifted
by its pad count (fixed in ndif-team/nnsight#673 by ``processing.supply_position_ids``). The suite
sees the user's function as a plain function with a config: each protocol row's real tokens become
one invoke, and the logits nnsight returns for them go back to the row's real positions.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Optional
from unittest import mock

import torch
from torch import Tensor

from harness.adapters import FunctionModel
from harness.adapters.protocol import UnsupportedInput


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}  # token ids pass through unchanged; t0 pads
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tokenizer_models.WordLevel(words, unk_token="t0")),
                                   pad_token="t0", padding_side="left")


def nnsight_function_model(hf_model: torch.nn.Module) -> FunctionModel:
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LanguageModel's deprecation notice
        lm = LanguageModel(hf_model, tokenizer=_tokenizer(hf_model.config.vocab_size))
    c = hf_model.config

    def forward(tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0) -> Tensor:
        if position_offset:
            # a valid protocol input this wrapper cannot pass on: the suite reports it unobservable
            raise UnsupportedInput(f"position_offset={position_offset}: this wrapper takes 0 only")
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        rows = [tokens[r][mask[r].bool()] for r in range(tokens.shape[0])]
        outs = []
        with torch.no_grad(), lm.trace() as tracer:
            for row in rows:
                with tracer.invoke(row.tolist()):
                    outs.append(lm.lm_head.output.save())
        logits = torch.zeros(*tokens.shape, c.vocab_size)
        for r, (row, out) in enumerate(zip(rows, outs, strict=True)):
            logits[r, mask[r].bool()] = out[0, out.shape[1] - len(row):].float()
        return logits

    cfg = dict(n_layers=c.n_layer, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_model=c.n_embd,
               d_vocab=c.vocab_size, n_ctx=c.n_positions, positional_embedding_type="standard",
               attention_dir="causal")
    return FunctionModel(forward, cfg)


@contextlib.contextmanager
def no_left_pad_positions() -> Iterator[None]:
    """Revert ndif-team/nnsight#673: the batcher supplies no ``position_ids`` for left-padded prompts."""
    from nnsight.modeling import processing

    with mock.patch.object(processing, "supply_position_ids", lambda model, encoding: None):
        yield


@torch.no_grad()
def short_prompt_moves(build, patch) -> str:
    """A prompt batched with a longer one against the same prompt alone (the issue's own measure)."""
    tokens = torch.tensor([[5, 9, 3, 7], [0, 0, 4, 8]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])

    def drift() -> float:
        hf = build()
        batched = nnsight_function_model(hf)(tokens, attention_mask=mask)
        return float((batched[1, 2:] - hf(torch.tensor([[4, 8]])).logits[0]).abs().max())

    clean = drift()
    assert clean < 1e-4, f"the unpatched batch already moves the short prompt by {clean:.3g}"
    with patch():
        seen = drift()
    assert seen > 1e-2, "the patch leaves the short prompt's logits unchanged"
    return f"the shorter prompt's logits move by {seen:.3g} when batched (unpatched {clean:.1g})"
