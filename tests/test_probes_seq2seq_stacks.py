"""Every head probe over an encoder-decoder's three stacks: encoder self-attention, decoder self-attention and
cross-attention (Vaswani et al. 2017, Fig. 1), on harness.model.seq2seq.EncoderDecoder.

The references are computed here from one ``run_with_cache`` of every pattern, no probe code involved: which
queries count (real ones seeing two or more real keys: the source's in the encoder and in cross-attention), the
roles' key sets, the Jensen-Shannon divergence of two heads. Exact leave-one-out of each cross-attention head is
checked against a plain forward with that head's slice of the cross-attention output projection's input zeroed (a
torch pre-hook on the module: no TransformerLens hook).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import probes
from harness import ModelConfig, Transformer
from harness.errors import AttnlabError
from harness.model.seq2seq import EncoderDecoder
from harness.training.seq2seq_task import Seq2SeqBatch
from tests.helpers.seq2seq_probe import TASK, encoder_decoder, head_zeroed, probe_keywords

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ["encoder"] * 4 + ["decoder"] * 4 + ["cross"] * 4  # 2 layers x 2 heads of each stack, in row order
# The probe's passes stop after the last pattern they read, so the layers they do not hook run SDPA where the
# reference (every pattern hooked) runs the explicit softmax: float32 rounding apart, 1e-6 on values in [0, log 8].
TOL = 1e-6
LOO_TOL = 1e-5  # as tests/test_probes_seq2seq.py: float32 summation order on losses near 2


@pytest.fixture(scope="module")
def setup() -> tuple[EncoderDecoder, Seq2SeqBatch, dict]:
    batch = TASK.batch(10, torch.Generator().manual_seed(11))
    assert int(batch.lengths.min()) == 1  # a one-token source: its encoder and cross queries must not count
    return encoder_decoder(), batch, dict(source_tokens=batch.source, source_mask=batch.source_mask)


def _hook(kind: str, layer: int) -> str:
    return {"encoder": f"encoder.blocks.{layer}.attn.hook_pattern", "decoder": f"blocks.{layer}.attn.hook_pattern",
            "cross": f"blocks.{layer}.cross_attn.hook_pattern"}[kind]


def _patterns(model: EncoderDecoder, batch: Seq2SeqBatch) -> dict:
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.decoder_input, source_tokens=batch.source, source_mask=batch.source_mask,
                                        names_filter=lambda name: name.endswith("hook_pattern"))
    return {name: cache[name].double() for name in cache.keys()}


def _queries(kind: str, batch: Seq2SeqBatch) -> torch.Tensor:
    """bool [b, q]: the queries a probe counts, written out per stack."""
    src = batch.source_mask.bool()
    if kind == "decoder":  # causal, every decoder token real: position t sees t + 1 keys
        return torch.arange(batch.decoder_input.shape[1])[None].expand(batch.decoder_input.shape) >= 1
    enough = src.sum(1, keepdim=True) >= 2  # a query over the source sees every real source token
    return (src if kind == "encoder" else torch.ones_like(batch.decoder_input, dtype=torch.bool)) & enough


def test_attention_patterns_reads_the_stack_it_is_asked_for(setup):
    model, batch, src = setup
    cache = _patterns(model, batch)
    for kind in ("encoder", "decoder", "cross"):
        got = probes.attention_patterns(model, batch.decoder_input, kind=kind, layers=[1, 0], **src)
        torch.testing.assert_close(got.double(), torch.stack([cache[_hook(kind, 1)], cache[_hook(kind, 0)]]),
                                   rtol=0, atol=TOL)
    assert tuple(got.shape[-2:]) == (TASK.max_len + 1, TASK.max_len)  # cross: decoder queries, source keys
    with pytest.raises(AttnlabError, match=r"encoder-decoder, whose stacks' patterns differ in shape: expected kind="):
        probes.attention_patterns(model, batch.decoder_input, **src)
    with pytest.raises(AttnlabError, match="kind='self' is invalid"):
        probes.attention_patterns(model, batch.decoder_input, kind="self", **src)
    plain = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=10, n_ctx=8))
    with pytest.raises(AttnlabError, match="kind='cross' is for an encoder-decoder"):
        probes.attention_patterns(plain, torch.zeros(1, 4, dtype=torch.long), kind="cross")


def test_entropy_covers_every_stack_over_its_own_queries(setup):
    model, batch, src = setup
    frame = probes.attention_entropy(model, batch.decoder_input, **src)
    assert frame["kind"].tolist() == KINDS and frame["layer"].tolist() == [0, 0, 1, 1] * 3
    assert frame[["entropy", "max_prob", "saturated_fraction"]].notna().all().all()
    cache = _patterns(model, batch)
    for row in frame.itertuples():
        p = cache[_hook(row.kind, row.layer)][:, row.head]  # [b, q, k]
        w = _queries(row.kind, batch).double()
        entropy = float((-torch.special.xlogy(p, p).sum(-1) * w).sum() / w.sum())
        assert row.entropy == pytest.approx(entropy, abs=TOL)
        assert row.max_prob == pytest.approx(float((p.max(-1).values * w).sum() / w.sum()), abs=TOL)


def test_roles_cover_every_stack_and_name_what_does_not_apply(setup):
    model, batch, src = setup
    frame = probes.head_roles(model, batch.decoder_input, **src)
    assert frame["kind"].tolist() == KINDS
    by = frame.set_index("kind")
    assert by.loc["encoder", "induction"].isna().all()  # n/a, said in attrs
    assert by.loc["cross", ["previous_token", "induction"]].isna().all().all()
    assert by.loc["encoder", ["previous_token", "duplicate_token", "first_token"]].notna().all().all()
    assert by.loc["cross", ["duplicate_token", "first_token"]].notna().all().all()
    assert set(frame.attrs["not_applicable"]) == {"encoder", "cross"}
    assert set(frame.attrs["not_applicable"]["cross"]) == {"previous_token", "induction"}
    cache = _patterns(model, batch)
    real = batch.source_mask.bool()
    # cross-attention's duplicate_token: the mass on source keys holding the query's token
    same = (batch.decoder_input[:, :, None] == batch.source[:, None, :]) & real[:, None, :]
    has = same.any(-1)
    for layer, head in ((0, 1), (1, 0)):
        p = cache[_hook("cross", layer)][:, head]
        expected = float(((p * same).sum(-1) * has).sum() / has.sum())
        got = frame[(frame.kind == "cross") & (frame.layer == layer) & (frame["head"] == head)]["duplicate_token"]
        assert float(got.iloc[0]) == pytest.approx(expected, abs=TOL)
    # the encoder's previous_token: the mass on key q - 1 where both are real source tokens
    p = cache[_hook("encoder", 1)][:, 0]
    has = real[:, 1:] & real[:, :-1]
    expected = float((p.diagonal(offset=-1, dim1=1, dim2=2) * has).sum() / has.sum())
    got = frame[(frame.kind == "encoder") & (frame.layer == 1) & (frame["head"] == 0)]["previous_token"]
    assert float(got.iloc[0]) == pytest.approx(expected, abs=TOL)


def test_similarity_compares_heads_within_a_stack_and_names_them(setup):
    model, batch, src = setup
    sim = probes.head_similarity(model, batch.decoder_input, **src)
    labels = ["enc L0H0", "enc L0H1", "enc L1H0", "enc L1H1", "L0H0", "L0H1", "L1H0", "L1H1",
              "xL0H0", "xL0H1", "xL1H0", "xL1H1"]
    assert list(sim.index) == labels and list(sim.columns) == labels
    same_stack = torch.tensor([[a == b for b in KINDS] for a in KINDS])
    values = torch.tensor(sim.to_numpy())
    assert bool(values[same_stack].isfinite().all()) and bool(values[~same_stack].isnan().all())
    assert sim.attrs["compared_within"] == [["encoder"], ["decoder"], ["cross"]]
    # one pair by hand: 1 - the mean JSD (bits) between cross heads xL0H1 and xL1H0 over the counted queries
    cache = _patterns(model, batch)
    p, q = cache[_hook("cross", 0)][:, 1], cache[_hook("cross", 1)][:, 0]
    m = (p + q) / 2

    def h(x: torch.Tensor) -> torch.Tensor:
        return -torch.special.xlogy(x, x).sum(-1)

    w = _queries("cross", batch).double()
    jsd = float(((h(m) - (h(p) + h(q)) / 2) * w).sum() / w.sum()) / math.log(2)
    assert sim.loc["xL0H1", "xL1H0"] == pytest.approx(1 - jsd, abs=TOL)
    out = probes.head_similarity(model, batch.decoder_input, metric="output", **src)
    assert out.isna().loc["enc L0H0", "L0H0"] and out.isna().loc["xL1H1", "enc L1H1"]
    assert out.notna().loc["L0H0", "xL1H1"]  # decoder and cross-attention heads sit at the decoder's positions
    assert out.attrs["compared_within"] == [["encoder"], ["cross", "decoder"]]
    assert all(out.loc[label, label] == pytest.approx(1.0) for label in labels)


def test_a_stack_without_informative_queries_is_nan_and_named(setup):
    """Without a source the model reads its one-token default: no encoder or cross query sees two keys."""
    model, batch, _ = setup
    frame = probes.attention_entropy(model, batch.decoder_input)
    assert frame.attrs["no_informative_queries"] == ["cross", "encoder"]
    assert frame[frame.kind != "decoder"]["entropy"].isna().all() and frame[frame.kind == "decoder"].notna().all().all()


def test_the_estimator_comparison_ranks_every_stack(setup):
    model, batch, _ = setup
    frame = probes.compare_estimators(model, batch.decoder_input, methods=("ablation", "gradient", "random"),
                                      budgets=(0.05,), **probe_keywords(batch))
    assert frame.attrs["n_heads"] == 12
    assert frame.set_index("method").loc["ablation", "spearman"] == pytest.approx(1.0)
    assert frame.set_index("method").loc["ablation", "forward_passes"] > 0


def test_residual_patching_refuses_an_encoder_decoder(setup):
    model, batch, _ = setup
    with pytest.raises(AttnlabError, match="patch_residual patches a decoder-only model's residual stream"):
        probes.patch_residual(model, batch.decoder_input, batch.decoder_input, lambda logits: logits.sum())


def _task_loss(model: EncoderDecoder, batch: Seq2SeqBatch) -> float:
    with torch.no_grad():
        logits = model(batch.decoder_input, source_tokens=batch.source, source_mask=batch.source_mask)
    return float(F.cross_entropy(logits[batch.target_mask].double(), batch.target[batch.target_mask]))


def test_cross_head_leave_one_out_is_a_forward_with_that_head_removed_at_its_projection(setup):
    """Exact leave-one-out of every cross-attention head (Michel et al. 2019's ablation, batched through the probes'
    masks on blocks.{l}.cross_attn.hook_z) equals the task loss of one plain forward whose cross-attention output
    projection of that layer gets zeros in that head's slice, minus the intact loss."""
    model, batch, _ = setup
    cross = list(range(8, 12))  # flat head indices of the cross rows (rows 4, 5 of 2 heads each)
    frame = probes.head_importance(model, batch.decoder_input, heads=cross, **probe_keywords(batch))
    base = _task_loss(model, batch)
    assert frame.attrs["baseline_loss"] == pytest.approx(base, abs=LOO_TOL)
    rows = frame[frame.kind == "cross"]
    assert len(rows) == 4 and frame[frame.kind != "cross"]["loss_delta"].isna().all()
    deltas = []
    for row in rows.itertuples():
        with head_zeroed(model.blocks[row.layer].cross_attn.o, row.head, model.cfg.d_head):
            deltas.append(_task_loss(model, batch) - base)
        assert row.loss_delta == pytest.approx(deltas[-1], abs=LOO_TOL)
    assert max(abs(d) for d in deltas) > 100 * LOO_TOL  # the heads matter: the comparison is not of zeros
