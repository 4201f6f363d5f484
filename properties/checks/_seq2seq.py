"""Shared pieces of the encoder-decoder properties: when they apply, their inputs, and key coverage.

An encoder-decoder declares ``cfg.is_encoder_decoder`` (docs/architecture.md, "Encoder-decoders"); its
forward takes ``source_tokens``/``source_mask`` by keyword, and ``tokens`` is the decoder's input. The
inputs here are a padded source (``padding_logits``'s proportions: about 3/5 of the positions real, random
side, random pad ids) and all-real decoder tokens of the same batch.

Key coverage (exact): a real query's pattern puts weight exactly 0 on every padded key (a masked weight is
``exp(-inf) = 0``, see ``_common``) and weight > 0 on every real key, unless that key's score is so far
below the row's maximum that ``exp(score - max)`` underflows below the dtype's smallest normal number:
then a 0 is arithmetic, not a mask. A real key whose score is ``-inf`` is hidden by a mask: a failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from hypothesis import strategies as st
from torch import Tensor

from harness.adapters.protocol import is_encoder_decoder
from properties.checks._common import fmt, max_len
from properties.strategies import PaddedBatch, padded_batches

NOT_SEQ2SEQ = "not an encoder-decoder (cfg.is_encoder_decoder is not True)"
WHEN_DOC = "encoder-decoders (cfg.is_encoder_decoder)"
HIDDEN = 1.0  # the deviation of a real key that gets no weight: far above the exact tolerance 0


def seq2seq_only(model: Any) -> Optional[str]:
    """None for an encoder-decoder that declares its encoder's depth, else the n/a reason."""
    if not is_encoder_decoder(model):
        return NOT_SEQ2SEQ
    if not isinstance(getattr(model.cfg, "n_encoder_layers", None), int):
        return "cfg.is_encoder_decoder is True but cfg.n_encoder_layers is not an integer"
    return None


@dataclass(frozen=True)
class SourceExample:
    """A padded source and the decoder tokens ``[batch, pos]`` (all real) read against it."""

    source: PaddedBatch
    tokens: Tensor

    def inputs(self, row: Optional[int] = None) -> dict[str, Tensor]:
        """The forward's source keywords: the padded batch, or row ``row``'s real tokens alone."""
        if row is None:
            return {"source_tokens": self.source.tokens, "source_mask": self.source.mask}
        return {"source_tokens": self.source.tokens.new_tensor([self.source.rows[row]])}

    def describe(self) -> str:
        return (f"tokens={self.tokens.tolist()} source={self.source.tokens.tolist()} "
                f"source_mask={self.source.mask.tolist()}")


def source_examples(cfg: Any, min_len: int = 1):
    """Padded sources of up to 10 positions and decoder tokens of ``min_len``..8; shrinks towards one of each."""
    n = max_len(cfg, cap=10)
    sources = padded_batches(cfg.d_vocab, max_batch=2, max_len=max(1, n * 3 // 5), max_pad=max(1, n - n * 3 // 5))
    return _source_examples(cfg.d_vocab, sources, min(min_len, max_len(cfg)), max_len(cfg))


@st.composite  # at module level: see properties/strategies.py's token_batches
def _source_examples(draw, d_vocab: int, sources, shortest: int, longest: int) -> SourceExample:
    source = draw(sources)
    length = draw(st.integers(shortest, longest))
    row = st.lists(st.integers(0, d_vocab - 1), min_size=length, max_size=length)
    rows = draw(st.lists(row, min_size=len(source.rows), max_size=len(source.rows)))
    return SourceExample(source, torch.tensor(rows, dtype=torch.long))


def key_coverage(pattern: Tensor, scores: Tensor, query_real: Tensor, key_real: Tensor
                 ) -> tuple[float, str]:
    """The worst breach of key coverage in one layer and where: (weight on a padded key, or HIDDEN, text).

    ``pattern``/``scores`` ``[batch, n_heads, query_pos, key_pos]``; ``query_real``/``key_real`` bool
    ``[batch, query_pos]``/``[batch, key_pos]``. Returns (0.0, "") when coverage holds.
    """
    tiny = math.log(torch.finfo(pattern.dtype).tiny) if pattern.dtype.is_floating_point else -math.inf
    p, s = pattern.double().nan_to_num(nan=math.inf), scores.double()
    rows = query_real[:, None, :, None]
    padded, real = ~key_real[:, None, None, :], key_real[:, None, None, :]
    leak = p.abs().where(rows & padded, p.new_zeros(()))
    if float(leak.max()) > 0:
        b, h, q, k = (int(i) for i in (leak == leak.max()).nonzero()[0])
        worst = float(leak.max())
        return worst, f"head {h}: real query {q} puts weight {fmt(worst)} on padded key {k} (row {b})"
    row_max = s.masked_fill(~real, -math.inf).amax(-1, keepdim=True)
    underflow = torch.isfinite(s) & (s - row_max < tiny)
    hidden = rows & real & (p == 0) & ~underflow
    if bool(hidden.any()):
        b, h, q, k = (int(i) for i in hidden.nonzero()[0])
        return HIDDEN, (f"head {h}: real query {q} puts weight 0 on real key {k} (row {b}), whose score "
                        f"{fmt(float(s[b, h, q, k]))} does not underflow: the key is masked out")
    return 0.0, ""


def worst_coverage(acts: dict[str, Tensor], names: list[str], query_real: Tensor, key_real: Tensor,
                   label: str) -> tuple[float, str]:
    """The largest :func:`key_coverage` deviation over the layers whose (scores, pattern) hooks ``names`` pairs."""
    worst, where = 0.0, ""
    for layer in range(len(names) // 2):
        dev, text = key_coverage(acts[names[2 * layer + 1]], acts[names[2 * layer]], query_real, key_real)
        if dev > worst:
            worst, where = dev, f"{label.format(layer=layer)} {text}"
    return worst, where
