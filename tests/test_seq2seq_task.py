"""The seq2seq task (harness/training/seq2seq_task.py): batches are what they claim; a tiny EncoderDecoder learns it."""

from __future__ import annotations

import pytest
import torch

from harness.errors import AttnlabError
from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig
from harness.training.seq2seq_task import BOS, Seq2SeqTask, exact_match, train_seq2seq

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kind", ["reverse", "sort"])
def test_batches_pair_each_real_source_with_its_answer(kind):
    task = Seq2SeqTask(kind, n_symbols=6, max_len=5)
    b = task.batch(16, torch.Generator().manual_seed(0))
    assert b.source.shape == (16, 5) and b.decoder_input.shape == b.target.shape == (16, 6)
    assert set(b.source_mask.sum(-1).tolist()) <= set(range(1, 6)) and bool((b.decoder_input[:, 0] == BOS).all())
    for r in range(16):
        real = b.source[r][b.source_mask[r].bool()]
        n = int(b.lengths[r])
        want = real.flip(0) if kind == "reverse" else real.sort().values
        assert torch.equal(b.target[r, :n], want) and torch.equal(b.decoder_input[r, 1:n + 1], want)
        assert int(b.target_mask[r].sum()) == n
    assert torch.equal(b.source, task.batch(16, torch.Generator().manual_seed(0)).source)  # seeded


@pytest.mark.slow  # a learning run (tests/README.md)
def test_a_tiny_encoder_decoder_learns_to_reverse():
    # 400 AdamW steps of batch 64: ~27 s on one loaded CPU core, 0.996 exact match at seed 0 (300 steps: 0.88)
    task = Seq2SeqTask("reverse", n_symbols=8, max_len=5)
    model = EncoderDecoder(Seq2SeqConfig(n_layers=2, n_encoder_layers=2, d_model=64, n_heads=4,
                                         d_vocab=task.d_vocab, n_ctx=8, seed=0))
    before = exact_match(model, task)
    losses = train_seq2seq(model, task, steps=400)
    after = exact_match(model, task)
    assert before < 0.2 and losses[-1] < losses[0] / 5
    assert after > 0.9, after


def test_bad_arguments_are_named():
    with pytest.raises(AttnlabError, match="kind"):
        Seq2SeqTask("copy")
    with pytest.raises(AttnlabError, match="min_len"):
        Seq2SeqTask(max_len=3, min_len=4)
    model = EncoderDecoder(Seq2SeqConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=5, n_ctx=4))
    with pytest.raises(AttnlabError, match="needs d_vocab >= 10 and n_ctx >= 7"):
        train_seq2seq(model, Seq2SeqTask(max_len=6), steps=1)
