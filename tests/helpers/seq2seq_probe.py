"""What the encoder-decoder probe tests share: a small EncoderDecoder whose heads all matter, the probes' keywords
for a batch of the reverse task, and an independent way to remove one head (no TransformerLens hook involved).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig
from harness.training.seq2seq_task import Seq2SeqBatch, Seq2SeqTask

TASK = Seq2SeqTask("reverse", n_symbols=8, max_len=6)


def encoder_decoder(d_model: int = 16, seed: int = 0) -> EncoderDecoder:
    """2 encoder + 2 decoder layers of 2 heads, weights perturbed so that every head matters."""
    model = EncoderDecoder(Seq2SeqConfig(n_layers=2, n_encoder_layers=2, d_model=d_model, n_heads=2,
                                         d_vocab=TASK.d_vocab, n_ctx=TASK.max_len + 1, seed=seed))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # an initialised model's biases are 0 and its heads alike: make every head matter
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


def probe_keywords(batch: Seq2SeqBatch) -> dict:
    """The probes' keywords for a batch: its decoder positions holding a target (``Seq2SeqBatch.loss_mask``), so the
    probe's loss is the task's loss, and its source."""
    return dict(loss_mask=batch.loss_mask, source_tokens=batch.source, source_mask=batch.source_mask)


@contextmanager
def head_zeroed(out_proj: nn.Module, head: int, d_head: int) -> Iterator[None]:
    """Inside the block, head ``head``'s slice of the input of an attention layer's output projection is zero: the
    head's output removed before the projection, which is what zeroing its ``hook_z`` means, done on the module."""
    def zero(module: nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x, *args[1:])

    handle = out_proj.register_forward_pre_hook(zero)
    try:
        yield
    finally:
        handle.remove()
