"""A source -> target task for the encoder-decoder, its training loop and its exact-match metric.

``reverse`` (or ``sort``): the source is 1..``max_len`` random symbols, padded on a random side with
random ids under ``source_mask`` 0, so a model that lets padding through cannot learn it; the target is
the source's real symbols reversed (sorted). The decoder reads ``<bos>`` then the target and predicts
each next target token (teacher forcing); a row's loss covers its own length only. Batches come from a
``torch.Generator`` the caller passes, as every task in :mod:`harness.training.tasks`.

Token ids: 0 is the pad id (any id would do: the mask hides it), 1 is ``<bos>``, symbols are 2.. .
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from harness._checks import check_choice, check_int, check_number
from harness.errors import AttnlabError
from harness.model.seq2seq import EncoderDecoder

PAD, BOS, FIRST_SYMBOL = 0, 1, 2

__all__ = ["Seq2SeqBatch", "Seq2SeqTask", "train_seq2seq", "exact_match"]


@dataclass(frozen=True)
class Seq2SeqBatch:
    """One batch: source ``[batch, max_len]`` and its mask; decoder input and targets ``[batch, max_len + 1]``."""

    source: Tensor
    source_mask: Tensor  # 1 real, 0 padding
    decoder_input: Tensor  # <bos> then the target (padded with PAD after its end)
    target: Tensor  # decoder_input shifted left by one: what each position must predict
    target_mask: Tensor  # True where target is a real target token
    lengths: Tensor  # [batch] real source length = target length

    @property
    def loss_mask(self) -> Tensor:
        """bool ``[batch, max_len + 1]``: decoder positions whose token is a target, predicted from the position
        before (the next-token reading of ``target_mask``, which marks the position that predicts it)."""
        mask = torch.zeros_like(self.decoder_input, dtype=torch.bool)
        mask[:, 1:] = self.target_mask[:, :-1]
        return mask


class Seq2SeqTask:
    """``reverse`` or ``sort`` from a padded source; ``n_symbols`` distinct symbols, sources of 1..``max_len``."""

    KINDS: ClassVar[tuple[str, ...]] = ("reverse", "sort")

    def __init__(self, kind: str = "reverse", *, n_symbols: int = 8, max_len: int = 6, min_len: int = 1):
        check_choice("kind", kind, self.KINDS)
        check_int("n_symbols", n_symbols, 2)
        check_int("max_len", max_len, 1)
        check_int("min_len", min_len, 1, max_len, expected=f"an integer in [1, max_len={max_len}]")
        self.kind, self.n_symbols, self.max_len, self.min_len = kind, n_symbols, max_len, min_len

    @property
    def d_vocab(self) -> int:
        """The vocabulary a model needs: pad, <bos> and the symbols."""
        return FIRST_SYMBOL + self.n_symbols

    def check_model(self, model: EncoderDecoder) -> None:
        cfg = model.config
        if cfg.d_vocab < self.d_vocab or cfg.n_ctx < self.max_len + 1:
            raise AttnlabError(f"seq2seq task {self.kind!r} needs d_vocab >= {self.d_vocab} and n_ctx >= "
                               f"{self.max_len + 1}; the model has d_vocab={cfg.d_vocab}, n_ctx={cfg.n_ctx}")

    def answer(self, symbols: Tensor) -> Tensor:
        return symbols.flip(-1) if self.kind == "reverse" else symbols.sort(-1).values

    def batch(self, batch_size: int, generator: torch.Generator) -> Seq2SeqBatch:
        check_int("batch_size", batch_size, 1)
        n, b = self.max_len, batch_size
        lengths = torch.randint(self.min_len, n + 1, (b,), generator=generator)
        symbols = torch.randint(FIRST_SYMBOL, self.d_vocab, (b, n), generator=generator)
        pad_ids = torch.randint(0, self.d_vocab, (b, n), generator=generator)
        left = torch.rand(b, generator=generator) < 0.5
        source = pad_ids.clone()
        source_mask = torch.zeros(b, n, dtype=torch.long)
        decoder_input = torch.full((b, n + 1), PAD, dtype=torch.long)
        decoder_input[:, 0] = BOS
        target = torch.full((b, n + 1), PAD, dtype=torch.long)
        target_mask = torch.zeros(b, n + 1, dtype=torch.bool)
        for r in range(b):  # rows differ in length and padding side; batches are small
            length = int(lengths[r])
            real = symbols[r, :length]
            start = n - length if bool(left[r]) else 0
            source[r, start:start + length] = real
            source_mask[r, start:start + length] = 1
            answer = self.answer(real)
            decoder_input[r, 1:length + 1] = answer
            target[r, :length] = answer
            target_mask[r, :length] = True
        return Seq2SeqBatch(source, source_mask, decoder_input, target, target_mask, lengths)


def loss_of(model: EncoderDecoder, batch: Seq2SeqBatch) -> Tensor:
    logits = model(batch.decoder_input, source_tokens=batch.source, source_mask=batch.source_mask)
    return F.cross_entropy(logits[batch.target_mask].float(), batch.target[batch.target_mask])


def train_seq2seq(model: EncoderDecoder, task: Seq2SeqTask, *, steps: int = 400, batch_size: int = 64,
                  lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train ``model`` in place with AdamW (teacher forcing); the loss of every step."""
    task.check_model(model)
    check_int("steps", steps, 1)
    check_int("batch_size", batch_size, 1)
    check_number("lr", lr, 0.0)
    check_int("seed", seed, 0)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        loss = loss_of(model, task.batch(batch_size, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def exact_match(model: EncoderDecoder, task: Seq2SeqTask, *, n: int = 256, seed: int = 1) -> float:
    """The fraction of ``n`` fresh sources whose greedy decoding (through the cache) equals the target exactly."""
    task.check_model(model)
    check_int("n", n, 1)
    batch = task.batch(n, torch.Generator().manual_seed(seed))
    out = model.generate(batch.decoder_input[:, :1], task.max_len, temperature=0.0, source_tokens=batch.source,
                         source_mask=batch.source_mask)[:, 1:]
    hits = [bool(torch.equal(out[r, :int(length)], batch.target[r, :int(length)]))
            for r, length in enumerate(batch.lengths)]
    return sum(hits) / n
