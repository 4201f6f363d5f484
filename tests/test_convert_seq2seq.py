"""Our EncoderDecoder to and from Hugging Face's MarianMTModel (harness/model/convert/marian.py).

The reference is transformers' own Marian code: the export goes through ``save_pretrained`` and
``from_pretrained`` in a temporary directory, and its logits are compared with ours on a padded source.

Tolerances. The export renames the residual stream's coordinates (Marian's sinusoid layout is sines first, ours
interleaved), which is exact arithmetic but changes the order of every sum over ``d_model`` (LayerNorm's mean and
variance, each projection): in float32 that moves logits of magnitude ~5 by a few ulps (3e-6 seen), so 2e-5. In
float64 the one gap left is Marian's position table, which ``create_weight`` builds through ``torch.FloatTensor``
(float32) even in a float64 model: ~1e-8, and below 1e-12 once the table is ours in float64.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from transformers import MarianMTModel

import probes
from harness import ModelConfig, Transformer
from harness.errors import AttnlabError
from harness.model.convert import check_exportable, from_hf, to_hf
from harness.model.convert.marian import residual_order
from harness.model.positions import sinusoidal_table
from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 11
F32_TOL = 2e-5


def _cfg(**changes) -> Seq2SeqConfig:
    base = dict(n_layers=2, n_encoder_layers=3, d_model=32, n_heads=4, d_vocab=VOCAB, n_ctx=12,
                norm_placement="post", positional_embedding_type="sinusoidal")
    return Seq2SeqConfig(**{**base, **changes})


def _model(seed: int = 0, **changes) -> EncoderDecoder:
    model = EncoderDecoder(_cfg(seed=seed, **changes))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # an initialised model's biases are 0 and its norms 1: move every weight
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return model.eval()


def _reloaded(hf: MarianMTModel, dtype: torch.dtype) -> MarianMTModel:
    with tempfile.TemporaryDirectory() as where:
        hf.save_pretrained(where)
        return MarianMTModel.from_pretrained(where, dtype=dtype).eval()


def _batch(batch: int = 4, src: int = 7, pos: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source ids and a right-padded source mask (rows of 7, 4 and 2 real tokens), and decoder ids."""
    gen = torch.Generator().manual_seed(1)
    source = torch.randint(0, VOCAB, (batch, src), generator=gen)
    mask = torch.ones(batch, src, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    return source, mask, torch.randint(0, VOCAB, (batch, pos), generator=gen)


def _logits(model, source, mask, tokens) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(model, EncoderDecoder):
            return model(tokens, source_tokens=source, source_mask=mask)
        return model(input_ids=source, attention_mask=mask, decoder_input_ids=tokens).logits


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_the_export_computes_our_logits_on_a_padded_source(tie, act):
    model = _model(tie_embeddings=tie, act_fn=act)
    hf = to_hf(model)
    assert isinstance(hf, MarianMTModel) and check_exportable(model.config) == "marian"
    reloaded = _reloaded(hf, torch.float32)
    source, mask, tokens = _batch()
    ours = _logits(model, source, mask, tokens)
    theirs = _logits(reloaded, source, mask, tokens)
    assert torch.equal(theirs, _logits(hf, source, mask, tokens))  # nothing lost on disk
    err = float((theirs - ours).abs().max())
    print(f"\nfloat32 tie={tie} act={act}: max |logit diff| {err:.2e} (max |logit| {float(ours.abs().max()):.1f})")
    assert err < F32_TOL


def test_in_float64_the_one_gap_is_marians_float32_position_table():
    model = _model(dtype="float64")
    hf = _reloaded(to_hf(model), torch.float64)
    source, mask, tokens = _batch()
    ours = _logits(model, source, mask, tokens)
    err = float((_logits(hf, source, mask, tokens) - ours).abs().max())
    assert 0 < err < 1e-6
    d, order = model.config.d_model, residual_order(model.config.d_model)
    for stack in (hf.model.encoder, hf.model.decoder):
        table = stack.embed_positions.weight
        with torch.no_grad():
            table.copy_(sinusoidal_table(torch.arange(table.shape[0]), d, dtype=torch.float64)[:, order])
    exact = float((_logits(hf, source, mask, tokens) - ours).abs().max())
    print(f"\nfloat64: max |logit diff| {err:.2e}; with the float64 table {exact:.2e}")
    assert exact < 1e-12


def test_from_hf_gives_back_the_config_and_every_weight():
    for tie in (False, True):
        model = _model(tie_embeddings=tie, act_fn="gelu_new", n_ctx=9)
        back = from_hf(_reloaded(to_hf(model), torch.float32))
        assert isinstance(back, EncoderDecoder) and back.config == model.config
        theirs = back.state_dict()
        for name, weight in model.state_dict().items():
            assert torch.equal(weight, theirs[name]), name
        source, mask, tokens = _batch()
        assert torch.equal(_logits(back, source, mask, tokens), _logits(model, source, mask, tokens))


def test_a_left_padded_source_must_be_right_aligned_for_marian():
    """Marian numbers source positions 0..src_len-1 whatever the mask; ours counts real tokens. Ours is the
    same on either alignment, Marian only on the right-padded one."""
    model = _model()
    hf = to_hf(model)
    source, right, tokens = _batch()
    left_source, left = source.clone(), right.flip(1)
    for row in range(source.shape[0]):  # the same real tokens, moved to the end of the row
        n = int(right[row].sum())
        left_source[row, source.shape[1] - n:] = source[row, :n]
    ours = _logits(model, left_source, left, tokens)
    assert float((ours - _logits(model, source, right, tokens)).abs().max()) < 1e-5
    assert float((_logits(hf, source, right, tokens) - ours).abs().max()) < F32_TOL
    assert float((_logits(hf, left_source, left, tokens) - ours).abs().max()) > 1e-2


def test_the_probes_rank_the_exports_heads_as_ours():
    """Each kind's hook_z through harness.adapters (HFSeq2SeqAdapter on Marian's own modules) and through ours:
    leave-one-out of every encoder, decoder and cross-attention head agrees."""
    model = _model(n_encoder_layers=2, d_model=16, n_heads=2)
    hf = to_hf(model)
    source, mask, tokens = _batch(batch=6)
    ours = probes.head_importance(model, tokens, source_tokens=source, source_mask=mask)
    theirs = probes.head_importance(hf, tokens, source_tokens=source, source_mask=mask)
    assert theirs.attrs["adapter"].startswith("HFSeq2SeqAdapter(marian")
    assert ours[["kind", "layer", "head"]].equals(theirs[["kind", "layer", "head"]])
    err = float((ours["importance"] - theirs["importance"]).abs().max())
    print(f"\nleave-one-out, ours vs the Marian export through the adapter: max diff {err:.2e}")
    assert err < 1e-5


@pytest.mark.parametrize(("changes", "field"), [
    (dict(norm_placement="pre"), "norm_placement='pre'"),
    (dict(positional_embedding_type="standard"), "positional_embedding_type='standard'"),
    (dict(positional_embedding_type="rotary"), "positional_embedding_type='rotary'"),
    (dict(normalization_type="RMS"), "normalization_type='RMS'"),
    (dict(gated_mlp=True), "gated_mlp=True"),
    (dict(attn_only=True), "attn_only=True"),
    (dict(attn_bias=False), "attn_bias=False"),
    (dict(mlp_bias=False), "mlp_bias=False"),
    (dict(n_key_value_heads=2), "n_key_value_heads=2"),
    (dict(eps=1e-6), "eps=1e-06"),
    (dict(use_attn_scale=False), "use_attn_scale=False"),
    (dict(rotary_base=500.0), "rotary_base=500.0"),
    (dict(d_head=4), "d_head=4"),
])
def test_what_marian_cannot_compute_is_refused_by_name(changes, field):
    model = EncoderDecoder(_cfg(**changes))
    with pytest.raises(AttnlabError, match=f"to_hf: {field.replace('(', '[(]')} has no MarianMTModel equivalent"):
        to_hf(model)


def test_targets_are_per_architecture():
    with pytest.raises(AttnlabError, match="target='gpt2' is invalid for an encoder-decoder"):
        to_hf(_model(), target="gpt2")
    with pytest.raises(AttnlabError, match="'marian' is for an EncoderDecoder"):
        to_hf(Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2)), target="marian")


def test_from_hf_refuses_what_our_model_cannot_compute():
    hf = to_hf(_model())
    with torch.no_grad():
        hf.final_logits_bias.fill_(0.5)
    with pytest.raises(AttnlabError, match="final_logits_bias"):
        from_hf(hf)
    scaled = MarianMTModel(hf.config.__class__(**{**hf.config.to_dict(), "scale_embedding": True}))
    with pytest.raises(AttnlabError, match="config.scale_embedding=True cannot be reproduced"):
        from_hf(scaled)
