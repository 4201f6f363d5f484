"""Every head probe over the three stacks of Hugging Face encoder-decoders (BART, T5, Marian; tiny and random,
built from configs in memory), through HFSeq2SeqAdapter.

Each probe's frame names encoder self-attention, decoder self-attention and cross-attention heads apart (the
``kind`` column, or the ``enc L0H1`` / ``L0H1`` / ``xL0H1`` labels), and exact leave-one-out of every cross-attention
head equals the raw ``PreTrainedModel`` (no adapter, no TransformerLens hook) run with that head's slice of its
cross-attention output projection's input zeroed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import probes
from tests.helpers.hf_models import SEQ2SEQ_KINDS, SEQ2SEQ_VOCAB, seq2seq
from tests.helpers.seq2seq_probe import head_zeroed

pytestmark = pytest.mark.usefixtures("one_thread")

N_HEADS, D_HEAD = 4, 8  # every stack of seq2seq(): 2 layers of 4 heads of width 8
KINDS = ["encoder"] * 8 + ["decoder"] * 8 + ["cross"] * 8
# float32 summation order between the probe's batched, repeated rows and one plain forward, on losses near 5
LOO_TOL = 2e-5


@pytest.fixture(scope="module", params=SEQ2SEQ_KINDS)
def hf(request):
    """The model with its weights perturbed (default inits of 0.02 leave every head's effect near 1e-5) and a batch:
    a source right-padded in two rows (BART and Marian number source positions by index, as the protocol does only
    for right padding), and decoder tokens."""
    model = seq2seq(request.param)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed_positions" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.15)
    g = torch.Generator().manual_seed(0)
    source = torch.randint(3, SEQ2SEQ_VOCAB - 2, (6, 7), generator=g)
    source_mask = torch.ones_like(source)
    source_mask[0, 4:] = 0
    source_mask[3, 2:] = 0
    tokens = torch.randint(3, SEQ2SEQ_VOCAB - 2, (6, 6), generator=g)
    return request.param, model, tokens, dict(source_tokens=source, source_mask=source_mask)


def _cross_out_proj(kind: str, model, layer: int):
    if kind == "t5":
        return model.decoder.block[layer].layer[1].EncDecAttention.o
    return model.model.decoder.layers[layer].encoder_attn.out_proj


def _raw_loss(model, tokens: torch.Tensor, src: dict) -> float:
    """Mean next-token NLL of ``tokens`` from the raw model's own forward (what the probes' loss is with no mask)."""
    with torch.no_grad():
        logits = model(input_ids=src["source_tokens"], attention_mask=src["source_mask"],
                       decoder_input_ids=tokens).logits
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), tokens[:, 1:].flatten()))


def test_every_head_probe_covers_the_three_stacks(hf):
    _, model, tokens, src = hf
    for method in ("ablation", "mean_ablation", "gradient", "attribution", "l0_gates"):
        frame = probes.head_importance(model, tokens, method=method, l0_options=probes.L0Options(steps=3), **src)
        assert frame["kind"].tolist() == KINDS and frame["importance"].notna().all()
        assert frame["layer"].tolist() == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4
    for probe in (probes.head_roles, probes.attention_entropy):
        frame = probe(model, tokens, **src)
        assert frame["kind"].tolist() == KINDS
    entropy = probes.attention_entropy(model, tokens, **src)
    assert entropy[["entropy", "max_prob"]].notna().all().all()
    sim = probes.head_similarity(model, tokens, **src)
    assert list(sim.index[[0, 8, 16]]) == ["enc L0H0", "L0H0", "xL0H0"] and sim.loc["xL1H3", "xL1H3"] == 1
    patterns = probes.attention_patterns(model, tokens, kind="cross", **src)
    assert tuple(patterns.shape) == (2, 6, N_HEADS, 6, 7)
    curve = probes.prune_curve(model, tokens, fractions=(0, 1), seeds=(0,), **src)
    assert curve.attrs["n_heads"] == 24
    summary = probes.redundancy(model, tokens, seeds=(0,), **src)
    assert {"heads_needed_enc L1", "heads_needed_L1", "heads_needed_xL1"} <= set(summary.index)


def test_cross_head_leave_one_out_is_the_raw_model_with_that_head_removed(hf):
    kind, model, tokens, src = hf
    cross = list(range(16, 24))  # flat indices of the cross-attention rows (rows 4 and 5)
    frame = probes.head_importance(model, tokens, heads=cross, **src)
    base = _raw_loss(model, tokens, src)
    assert frame.attrs["baseline_loss"] == pytest.approx(base, abs=LOO_TOL)
    rows = frame[frame["kind"] == "cross"]
    assert len(rows) == 8 and frame[frame["kind"] != "cross"]["loss_delta"].isna().all()
    deltas = []
    for row in rows.itertuples():
        with head_zeroed(_cross_out_proj(kind, model, row.layer), row.head, D_HEAD):
            deltas.append(_raw_loss(model, tokens, src) - base)
        assert row.loss_delta == pytest.approx(deltas[-1], abs=LOO_TOL), (row.layer, row.head)
    assert max(abs(d) for d in deltas) > 100 * LOO_TOL  # the heads matter: the comparison is not of zeros
