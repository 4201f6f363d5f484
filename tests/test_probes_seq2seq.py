"""Head probes on an encoder-decoder: encoder self-attention, decoder self-attention and cross-attention heads.

The model is harness.model.seq2seq.EncoderDecoder (Vaswani et al. 2017, Fig. 1); importance is Michel, Levy &
Neubig 2019's (leave-one-out ablation and the gate gradient). The loss is the decoder's NLL of its targets
given a padded source, the batches of harness.training.seq2seq_task. The reference for leave-one-out is one
plain forward per head with that head's ``hook_z`` zeroed by TransformerLens's ``run_with_hooks``, no probe
code involved.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import probes
from harness import ModelConfig, Transformer
from harness.errors import AttnlabError
from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig
from harness.training.seq2seq_task import Seq2SeqBatch, train_seq2seq
from probes._validate import model_info
from tests.helpers.seq2seq_probe import TASK, encoder_decoder, probe_keywords

pytestmark = pytest.mark.usefixtures("one_thread")

# Leave-one-out and the plain forward differ only in float32 summation order (the probe's batched, repeated
# rows and its prefix residuals): 1e-5 on losses near 2 is ~50 float32 ulps of slack.
LOO_TOL = 1e-5
_model = encoder_decoder
_inputs = probe_keywords


def _plain_loss(model: EncoderDecoder, batch: Seq2SeqBatch, hook: str | None = None, head: int = 0) -> float:
    """The task's loss in one plain forward, with ``head`` of ``hook`` zeroed (None: nothing zeroed)."""
    def zero(z: torch.Tensor, hook: object) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = 0
        return z

    hooks = [] if hook is None else [(hook, zero)]
    with torch.no_grad():
        logits = model.run_with_hooks(batch.decoder_input, source_tokens=batch.source,
                                      source_mask=batch.source_mask, fwd_hooks=hooks)
    return float(F.cross_entropy(logits[batch.target_mask].double(), batch.target[batch.target_mask]))


def _hook_of(kind: str, layer: int) -> str:
    return {"encoder": f"encoder.blocks.{layer}.attn.hook_z", "decoder": f"blocks.{layer}.attn.hook_z",
            "cross": f"blocks.{layer}.cross_attn.hook_z"}[kind]


def _check_loo(model: EncoderDecoder, batch: Seq2SeqBatch, frame) -> float:
    base = _plain_loss(model, batch)
    assert frame.attrs["baseline_loss"] == pytest.approx(base, abs=LOO_TOL)
    worst = 0.0
    for row in frame.itertuples():
        plain = _plain_loss(model, batch, _hook_of(row.kind, row.layer), row.head) - base
        worst = max(worst, abs(plain - row.loss_delta))
    assert worst < LOO_TOL, worst
    return worst


def test_every_kind_of_head_is_ranked_and_named():
    model = _model()
    batch = TASK.batch(12, torch.Generator().manual_seed(1))
    frame = probes.head_importance(model, batch.decoder_input, **_inputs(batch))
    assert list(frame.columns) == ["kind", "layer", "head", "importance", "loss_delta"]
    assert frame["kind"].tolist() == ["encoder"] * 4 + ["decoder"] * 4 + ["cross"] * 4
    assert frame["layer"].tolist() == [0, 0, 1, 1] * 3 and frame["head"].tolist() == [0, 1] * 6
    assert frame["importance"].notna().all()
    info = model_info(model, all_heads=True)
    assert info.head_labels()[:2] == ["enc L0H0", "enc L0H1"] and info.head_labels()[-1] == "xL1H1"


@pytest.mark.parametrize("batch_size", [None, 5])  # one pass of all masks; many passes, chunked data
def test_leave_one_out_is_one_plain_forward_per_head(batch_size):
    """Batched masks through each kind's hook_z, prefix residuals reused, equal zeroing one head at a time."""
    model = _model()
    batch = TASK.batch(12, torch.Generator().manual_seed(2))
    assert bool((batch.source_mask == 0).any())  # the source is padded, on both sides
    frame = probes.head_importance(model, batch.decoder_input, batch_size=batch_size, **_inputs(batch))
    _check_loo(model, batch, frame)


def test_the_gradient_estimators_agree_on_every_kind():
    """Michel et al.'s -dL/dxi from probes.gates and from the attribution pass are the same numbers, and the
    gradient is what a gate on each head's hook_z gives under autograd."""
    model = _model()
    batch = TASK.batch(12, torch.Generator().manual_seed(3))
    grad = probes.head_importance(model, batch.decoder_input, method="gradient", **_inputs(batch))
    attr = probes.attribution_scores(model, batch.decoder_input, **_inputs(batch))
    torch.testing.assert_close(torch.tensor(grad["loss_delta"].to_numpy()), attr.zero_delta.flatten().cpu(),
                               rtol=1e-6, atol=1e-9)
    gate = torch.ones(4, 2, requires_grad=True)  # encoder layer 1, decoder layer 0, cross layers 0 and 1

    def scale(i: int):
        return lambda z, hook: z * gate[i][None, None, :, None]

    hooks = [(_hook_of(k, layer), scale(i)) for i, (k, layer) in
             enumerate([("encoder", 1), ("decoder", 0), ("cross", 0), ("cross", 1)])]
    logits = model.run_with_hooks(batch.decoder_input, source_tokens=batch.source, source_mask=batch.source_mask,
                                  fwd_hooks=hooks)
    loss = F.cross_entropy(logits[batch.target_mask], batch.target[batch.target_mask])
    (dgate,) = torch.autograd.grad(loss, gate)
    rows = grad.set_index(["kind", "layer"])["loss_delta"]
    for i, key in enumerate([("encoder", 1), ("decoder", 0), ("cross", 0), ("cross", 1)]):
        torch.testing.assert_close(torch.tensor(rows.loc[key].to_numpy()), -dgate[i].double(), rtol=1e-4, atol=1e-7)


def test_mean_ablation_replaces_encoder_heads_over_the_source_positions():
    model = _model()
    batch = TASK.batch(12, torch.Generator().manual_seed(4))
    attr = probes.attribution_scores(model, batch.decoder_input, **_inputs(batch))
    # rows: 2 encoder, 2 decoder, 2 cross layers; positions: the longer of source (6) and decoder (7)
    assert tuple(attr.means.shape) == (6, TASK.max_len + 1, 2, 8)
    real = batch.source_mask.bool()
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.decoder_input, source_tokens=batch.source,
                                        source_mask=batch.source_mask, names_filter="encoder.blocks.0.attn.hook_z")
    z = cache["encoder.blocks.0.attn.hook_z"].double()  # [batch, src_pos, n_heads, d_head]
    expected = (z * real[:, :, None, None]).sum(0) / real.sum(0).clamp(min=1)[:, None, None]
    torch.testing.assert_close(attr.means[0, :TASK.max_len].double(), expected, rtol=1e-5, atol=1e-6)
    assert not attr.means[0, TASK.max_len:].any()  # past the source: zero padding
    frame = probes.head_importance(model, batch.decoder_input, method="mean_ablation", **_inputs(batch))
    assert frame["loss_delta"].notna().all()


def test_a_decoder_only_model_keeps_its_frame_and_refuses_a_source():
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=10, n_ctx=8))
    tokens = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(0))
    assert list(probes.head_importance(model, tokens).columns) == ["layer", "head", "importance", "loss_delta"]
    with pytest.raises(AttnlabError, match="not an encoder-decoder"):
        probes.head_importance(model, tokens, source_tokens=tokens)


def test_a_bad_source_is_named_before_any_pass():
    model = _model()
    batch = TASK.batch(4, torch.Generator().manual_seed(5))
    with pytest.raises(AttnlabError, match="source_tokens have 3 rows"):
        probes.head_importance(model, batch.decoder_input, source_tokens=batch.source[:3])
    with pytest.raises(AttnlabError, match="source_mask was given without source_tokens"):
        probes.head_importance(model, batch.decoder_input, source_mask=batch.source_mask)
    with pytest.raises(AttnlabError, match="heads="):
        probes.head_importance(model, batch.decoder_input, heads=[12], source_tokens=batch.source)


@pytest.mark.slow  # a learning run (tests/README.md): ~30 s of training on 2 cores
def test_a_trained_model_needs_its_top_cross_attention_head():
    """Trained on reverse, the 2+2-layer model reads the source through cross-attention: zeroing the head the
    probe ranks first among cross-attention heads (one plain forward) raises the loss more than zeroing the one it
    ranks last, and leave-one-out still equals the plain forwards."""
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(n_layers=2, n_encoder_layers=2, d_model=64, n_heads=4,
                                         d_vocab=TASK.d_vocab, n_ctx=TASK.max_len + 1))
    losses = train_seq2seq(model, TASK, steps=400)
    assert losses[-1] < 0.2 * losses[0]
    batch = TASK.batch(64, torch.Generator().manual_seed(7))
    frame = probes.head_importance(model, batch.decoder_input, **_inputs(batch))
    print(f"\nbaseline loss {frame.attrs['baseline_loss']:.4f}\n" + frame.to_string())  # the report quotes them
    _check_loo(model, batch, frame)
    cross = frame[frame["kind"] == "cross"].sort_values("importance")
    top, low = cross.iloc[-1], cross.iloc[0]
    hurt_top = _plain_loss(model, batch, _hook_of("cross", int(top["layer"])), int(top["head"]))
    hurt_low = _plain_loss(model, batch, _hook_of("cross", int(low["layer"])), int(low["head"]))
    assert hurt_top > hurt_low
    assert top["importance"] > 0.1 and top["importance"] > 10 * abs(low["importance"])


def test_pruning_runs_over_every_kind():
    """The curve's ends are plain forwards: nothing pruned, and every head of every kind zeroed at once."""
    model = _model()
    batch = TASK.batch(12, torch.Generator().manual_seed(6))
    curve = probes.prune_curve(model, batch.decoder_input, order="importance", fractions=(0, 0.5, 1), **_inputs(batch))
    assert curve.attrs["n_heads"] == 12 and curve["n_pruned"].tolist() == [0, 6, 12]
    everything = [(_hook_of(kind, layer), lambda z, hook: z * 0) for kind in ("encoder", "decoder", "cross")
                  for layer in (0, 1)]
    with torch.no_grad():
        logits = model.run_with_hooks(batch.decoder_input, source_tokens=batch.source,
                                      source_mask=batch.source_mask, fwd_hooks=everything)
    pruned = float(F.cross_entropy(logits[batch.target_mask].double(), batch.target[batch.target_mask]))
    assert curve["loss"].iloc[0] == pytest.approx(_plain_loss(model, batch), abs=LOO_TOL)
    assert curve["loss"].iloc[-1] == pytest.approx(pruned, abs=LOO_TOL)
    summary = probes.redundancy(model, batch.decoder_input, seeds=(0,), **_inputs(batch))
    assert summary["n_heads"] == 12
    assert {"heads_needed_enc L1", "heads_needed_L0", "heads_needed_xL1", "one_head_best_xL0"} <= set(summary.index)


def test_a_head_count_the_masks_cannot_carry_is_named():
    """BART may give its encoder other head counts than its decoder; the masks have one, so the probe refuses
    (an AttnlabError naming the hook), not a shape error deep in a hook."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=20, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=None)
    model = BartForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    source, tokens = torch.randint(3, 20, (3, 5), generator=gen), torch.randint(3, 20, (3, 4), generator=gen)
    with pytest.raises(AttnlabError, match=r"hook_z has \d heads but cfg.n_heads=\d"):
        probes.head_importance(model, tokens, source_tokens=source)
