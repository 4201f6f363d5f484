"""The encoder-decoder (harness/model/seq2seq.py): hook names, the source mask, cross-attention's cache, errors."""

from __future__ import annotations

import pytest
import torch

from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.config import ModelConfig
from harness.model.kv_cache import KVCache
from harness.model.protocol_facts import cross_attn_hook, encoder_hook
from harness.model.seq2seq import EncoderDecoder, Seq2SeqCache, Seq2SeqConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# Equalities below compare two float32 runs that differ only in padding or caching: different kernels
# and summation orders, ~1e-7 of the logit scale; 1e-5 is two orders above that, while every planted
# bug in tests/mutants/cross_attention.py moves logits by > 1e-2.
ATOL = 1e-5


def tiny(**kw) -> EncoderDecoder:
    cfg = Seq2SeqConfig(**{"n_layers": 2, "n_encoder_layers": 1, "d_model": 32, "n_heads": 4, "d_vocab": 20,
                           "n_ctx": 16, **kw})
    return EncoderDecoder(cfg).eval()


def test_golden_hook_names_of_one_decoder_layer_and_the_encoder():
    names = list(tiny(n_layers=1).hook_dict)
    decoder_layer = ["blocks.0.hook_resid_pre", "blocks.0.ln1.hook_scale", "blocks.0.ln1.hook_normalized",
                     "blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v",
                     "blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z",
                     "blocks.0.hook_attn_out", "blocks.0.hook_resid_mid", "blocks.0.ln2.hook_scale",
                     "blocks.0.ln2.hook_normalized", "blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post",
                     "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post", "blocks.0.ln_cross.hook_scale",
                     "blocks.0.ln_cross.hook_normalized"] + [cross_attn_hook(0, h) for h in (
                         "hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")] + [
                     "blocks.0.hook_cross_attn_out", "blocks.0.hook_resid_mid2"]
    assert names[:2] == ["hook_embed", "hook_pos_embed"]
    assert names[2:2 + len(decoder_layer)] == decoder_layer
    assert encoder_hook(0, "attn.hook_pattern") in names and "encoder.hook_embed" in names
    assert not any(n.startswith("encoder.blocks.1.") for n in names)  # one encoder layer


def test_encoder_is_bidirectional_and_cross_attention_skips_padded_source_keys():
    model = tiny()
    src = torch.tensor([[3, 4, 5, 0, 0], [0, 6, 7, 8, 9]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3], [4, 5, 6]]), source_tokens=src, source_mask=mask)
    enc = cache[encoder_hook(0, "attn.hook_pattern")]  # [batch, n_heads, src, src]
    real = mask.bool()
    assert bool((enc[0, :, :3, :3] > 0).all())  # a real source token sees every real one, later ones included
    padded_key = ~real[:, None, None, :]  # [batch, 1, 1, src]
    assert float(enc.masked_fill(~real[:, None, :, None], 0).masked_select(padded_key.expand_as(enc)).abs().max()) == 0
    for layer in range(2):
        p = cache[cross_attn_hook(layer, "hook_pattern")]  # [batch, n_heads, tgt, src]
        assert p.shape == (2, 4, 3, 5)
        assert float(p.masked_select(padded_key.expand_as(p)).abs().max()) == 0.0
    cross = cache[cross_attn_hook(1, "hook_pattern")]
    assert bool((cross.masked_select(real[:, None, None, :].expand_as(cross)) > 0).all())


def test_decoder_logits_do_not_depend_on_source_padding():
    model = tiny()
    tgt = torch.tensor([[1, 2, 3, 4]])
    alone = model(tgt, source_tokens=torch.tensor([[5, 6, 7]]))
    for src, mask in [([[5, 6, 7, 9, 9]], [[1, 1, 1, 0, 0]]), ([[9, 5, 6, 7]], [[0, 1, 1, 1]])]:
        padded = model(tgt, source_tokens=torch.tensor(src), source_mask=torch.tensor(mask))
        torch.testing.assert_close(padded, alone, atol=ATOL, rtol=0)
    assert (model(tgt, source_tokens=torch.tensor([[5, 6, 8]])) - alone).abs().max() > 1e-3  # the source matters


def test_cached_decoding_computes_cross_keys_once_and_equals_recomputation():
    model = tiny()
    src, smask = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]]), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    tgt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    full = model(tgt, source_tokens=src, source_mask=smask)
    fired: list[str] = []
    hooks = [(cross_attn_hook(layer, "hook_k"), lambda t, hook: fired.append(hook.name)) for layer in range(2)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        first, past = model.forward_with_cache(tgt[:, :2], source_tokens=src, source_mask=smask)
        assert len(fired) == 2  # each layer computes its cross keys at the first call
        steps = [first]
        for i in (2, 3):
            step, past = model.forward_with_cache(tgt[:, i:i + 1], past=past)
            steps.append(step)
    assert len(fired) == 2  # and never again
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=0)
    greedy, logits = model.generate(tgt[:, :1], 3, temperature=0.0, source_tokens=src, source_mask=smask,
                                    return_logits=True)
    recomputed = model(greedy, source_tokens=src, source_mask=smask)
    torch.testing.assert_close(logits, recomputed[:, :3], atol=ATOL, rtol=0)
    assert torch.equal(greedy, model.generate(tgt[:, :1], 3, temperature=0.0, source_tokens=src,
                                              source_mask=smask, use_cache=False))


def test_without_a_source_the_decoder_reads_the_one_token_default_source():
    model = tiny(positional_embedding_type="rotary")
    tgt = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(model(tgt), model(tgt, source_tokens=torch.zeros(1, 1, dtype=torch.long)))
    assert model.cfg.is_encoder_decoder and model.cfg.attention_dir == "causal"


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_post_norm_and_attn_only_variants_run(norm_placement):
    model = tiny(norm_placement=norm_placement, attn_only=True)
    out = model(torch.tensor([[1, 2]]), source_tokens=torch.tensor([[3, 4, 5]]))
    assert out.shape == (1, 2, 20) and bool(torch.isfinite(out).all())


def test_bad_input_is_named():
    model = tiny()
    tgt = torch.tensor([[1, 2]])
    with pytest.raises(AttnlabError, match="source_mask row 0 has no real token"):
        model(tgt, source_tokens=torch.tensor([[1, 2]]), source_mask=torch.tensor([[0, 0]]))
    with pytest.raises(AttnlabError, match="source_tokens have 2 rows: expected 1"):
        model(tgt, source_tokens=torch.tensor([[1], [2]]))
    with pytest.raises(AttnlabError, match="source_mask has shape"):
        model(tgt, source_tokens=torch.tensor([[1, 2]]), source_mask=torch.tensor([[1, 1, 1]]))
    with pytest.raises(AttnlabError, match="token id 20 is out of range"):
        model(tgt, source_tokens=torch.tensor([[20]]))
    with pytest.raises(AttnlabError, match="without source_tokens"):
        model(tgt, source_mask=torch.tensor([[1]]))
    with pytest.raises(AttnlabTypeError, match="Seq2SeqCache"):
        model(tgt, kv_cache=KVCache(2))
    _, past = model.forward_with_cache(tgt, source_tokens=torch.tensor([[3]]))
    assert isinstance(past, Seq2SeqCache)
    with pytest.raises(AttnlabError, match="already holds a source"):
        model.forward_with_cache(tgt, past=past, source_tokens=torch.tensor([[3]]))
    with pytest.raises(AttnlabError, match="attention_dir"):
        Seq2SeqConfig(attention_dir="bidirectional")
    with pytest.raises(AttnlabError, match="n_encoder_layers"):
        Seq2SeqConfig(n_encoder_layers=0)
    with pytest.raises(AttnlabTypeError, match="Seq2SeqConfig"):
        EncoderDecoder(ModelConfig())  # type: ignore[arg-type]
