"""The encoder-decoder properties (properties/checks/{encoder,cross_mask,source_padding,cross_cache}.py).

The unbroken EncoderDecoder passes every row in several designs; a decoder-only model gets n/a with the
reason; key coverage tells a masked key from one whose weight underflowed; the mutants in
tests/mutants/cross_attention.py are killed by tests/test_mutants.py, and their reports name the bug.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness import ModelConfig, Transformer
from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig
from properties import check_model
from properties.checks._seq2seq import HIDDEN, NOT_SEQ2SEQ, key_coverage
from tests.mutants import cross_attention as xa

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = ["encoder_bidirectional", "cross_attention_pattern", "source_padding_outputs", "cross_kv_cache"]
MAX_EXAMPLES = 10


@pytest.mark.parametrize("design", [
    {"positional_embedding_type": "standard"},
    {"positional_embedding_type": "rotary", "norm_placement": "post", "n_key_value_heads": 2},
    {"positional_embedding_type": "alibi", "normalization_type": "RMS", "n_encoder_layers": 1},
], ids=["standard", "rotary-post-gqa", "alibi-rms"])
def test_the_reference_encoder_decoder_passes_every_row(design):
    cfg = Seq2SeqConfig(**{"n_layers": 2, "d_model": 32, "n_heads": 4, "d_vocab": 24, "n_ctx": 16, **design})
    frame = check_model(EncoderDecoder(cfg), max_examples=MAX_EXAMPLES).set_index("property")
    failed = frame[frame.passed == False]  # noqa: E712
    assert failed.empty, failed.to_dict("records")
    assert (frame.loc[NEW, "status"] == "pass").all(), frame.loc[NEW, ["status", "reason"]]
    assert frame.loc["causal_pattern", "status"] == "pass"  # the decoder-only rows read the decoder


def test_decoder_only_models_get_n_a_with_the_reason():
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=16, n_ctx=8))
    frame = check_model(model, properties=NEW, max_examples=2)
    assert (frame.status == "n/a").all() and (frame.reason == NOT_SEQ2SEQ).all()


def test_key_coverage_tells_a_mask_from_underflow():
    real = torch.tensor([[True, True, False]])
    queries = torch.tensor([[True]])
    pattern = torch.tensor([[[[1.0, 0.0, 0.0]]]])
    # key 1's score is 200 below the maximum: exp(-200) underflows to 0 in float32, not a mask
    assert key_coverage(pattern, torch.tensor([[[[0.0, -200.0, -math.inf]]]]), queries, real) == (0.0, "")
    dev, where = key_coverage(pattern, torch.tensor([[[[0.0, -math.inf, -math.inf]]]]), queries, real)
    assert dev == HIDDEN and "real key 1" in where and "masked out" in where
    dev, where = key_coverage(torch.tensor([[[[0.5, 0.25, 0.25]]]]), torch.zeros(1, 1, 1, 3), queries, real)
    assert dev == 0.25 and "padded key 2" in where


@pytest.mark.parametrize("mutant, prop, words", [
    (xa.CausalEncoder, "encoder_bidirectional", "encoder layer"),
    (xa.CrossIgnoresSourceMask, "cross_attention_pattern", "on padded key"),
    (xa.CrossKVRecomputed, "cross_kv_cache", "cross_attn.hook_k fired"),
    (xa.CrossKVFromUnmaskedEncoder, "cross_kv_cache", "differ from a full recompute"),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_the_failure_report_names_the_bug(mutant, prop, words):
    row = check_model(mutant(xa.CFG), properties=[prop], max_examples=MAX_EXAMPLES).iloc[0]
    assert row.status == "fail" and words in row.counterexample, row.counterexample
    assert row.counterexample.startswith("tokens=") and "source_mask=" in row.counterexample
