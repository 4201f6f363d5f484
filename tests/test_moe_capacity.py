"""MoE routers and batch independence: a batch-wide expert capacity is a declared design.

NLLB-MoE's router counts each expert's capacity over the flattened batch (Fedus et al. 2021, Switch Transformers
§2.2; fairseq's top-2 gating): past it a token is dropped, so one row's tokens change another row's output. The
witness is the raw Hugging Face model in float64. The adapter declares it (``DesignFacts.expert_capacity``, read
off the router by harness/adapters/hf_design.py) and batch_independence then draws batches the capacity holds;
the same model with the fact removed, a router normalising over the batch, or a capacity declared larger than the
router's must still fail. Switch Transformers counts its capacity per sequence: rows stay independent, undeclared.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import (
    NllbMoeConfig,
    NllbMoeForConditionalGeneration,
    SwitchTransformersConfig,
    SwitchTransformersForConditionalGeneration,
)

from harness.adapters import adapt
from properties.checks.batch import batch_independence
from tests.mutants.base import RefConfig
from tests.mutants.moe import BatchSoftmaxMoeModel, MoeConfig, MoeModel

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 96


def nllb(capacity: int = 64, fraction: float = 1.0) -> NllbMoeForConditionalGeneration:
    """Every layer sparse (the census's tiny NLLB-MoE, sparse step 4 over 2 layers, has no router at all)."""
    torch.manual_seed(0)
    return NllbMoeForConditionalGeneration(NllbMoeConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=4, encoder_sparse_step=1,
        decoder_sparse_step=1, max_position_embeddings=64, expert_capacity=capacity,
        moe_eval_capacity_token_fraction=fraction)).eval()


def switch(capacity: int = 64) -> SwitchTransformersForConditionalGeneration:
    torch.manual_seed(0)
    return SwitchTransformersForConditionalGeneration(SwitchTransformersConfig(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=4,
        num_sparse_encoder_layers=2, num_sparse_decoder_layers=2, expert_capacity=capacity)).eval()


def row_deviation(model, tok: torch.Tensor) -> float:
    """max over rows of max|f(batch)[i] - f(row i)| / max|f(batch)[i]| on the raw model (one source token a row)."""
    def run(t):
        with torch.no_grad():
            return model(input_ids=torch.zeros(t.shape[0], 1, dtype=torch.long), decoder_input_ids=t).logits
    full = run(tok)
    return max(((full[r] - run(tok[r:r + 1])[0]).abs().max() / full[r].abs().max()).item() for r in range(len(tok)))


TOKENS = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(0))


def test_witness_a_batch_wide_capacity_couples_rows_in_float64():
    # NLLB-MoE at a fixed capacity (eval fraction <= 0): 18 tokens over 4 experts of capacity 2 drop tokens
    assert row_deviation(nllb(2, -1.0).double(), TOKENS) > 1e-3  # measured 0.022
    assert row_deviation(nllb(64, -1.0).double(), TOKENS) < 1e-9  # nothing dropped: 2.5e-11 (its float32 router)
    assert row_deviation(nllb(2, -1.0).double(), TOKENS[:2, :1]) < 1e-9  # 2 tokens: within the capacity


def test_witness_switch_counts_its_capacity_per_sequence():
    small, large = switch(1).double(), switch(64).double()
    with torch.no_grad():
        src = torch.zeros(3, 1, dtype=torch.long)
        dropped = (small(input_ids=src, decoder_input_ids=TOKENS).logits
                   - large(input_ids=src, decoder_input_ids=TOKENS).logits).abs().max()
    assert dropped > 1e-3  # capacity 1 drops tokens ...
    assert row_deviation(small, TOKENS) < 1e-6  # ... of each row alone: rows independent (float32 router, 1e-7)


@pytest.mark.parametrize("model, declared", [
    (lambda: nllb(4, -1.0), 4),  # a fixed capacity
    (lambda: nllb(64, 1.0), None),  # eval capacity = every token of the pass: nothing dropped
    (lambda: nllb(64, 0.9), 9),  # ceil(0.9 N) >= N up to N = 9
    (lambda: nllb(64, 0.5), 1),
    (lambda: switch(1), None),  # per sequence
], ids=["nllb-fixed", "nllb-fraction-1", "nllb-fraction-0.9", "nllb-fraction-0.5", "switch"])
def test_the_adapter_declares_a_batch_wide_capacity(model, declared):
    assert adapt(model()).cfg.expert_capacity == declared


def test_batch_independence_follows_the_declared_capacity():
    adapter = adapt(nllb(4, -1.0))
    result = batch_independence(adapter, max_examples=10)
    assert result.status == "pass" and "expert_capacity=4" in result.reason
    adapter._cfg = dataclasses.replace(adapter._cfg, expert_capacity=None)  # the fact not declared: a red row
    assert batch_independence(adapter, max_examples=10).status == "fail"
    result = batch_independence(adapt(nllb(64, 0.5)), max_examples=10)  # no batch of 2 tokens is safe
    assert result.status == "n/a" and "expert_capacity=1" in result.reason


def test_a_declared_capacity_excuses_nothing_else():
    assert batch_independence(MoeModel(MoeConfig()), max_examples=10).status == "pass"  # the design, declared
    assert batch_independence(MoeModel(RefConfig()), max_examples=10).status == "fail"  # undeclared (catalogue)
    # a router normalising its logits over the batch fails within any capacity
    assert batch_independence(BatchSoftmaxMoeModel(MoeConfig()), max_examples=10).status == "fail"
    # a capacity declared larger than the router's (2): batches of 3 tokens drop one
    assert batch_independence(MoeModel(MoeConfig(expert_capacity=24)), max_examples=10).status == "fail"
