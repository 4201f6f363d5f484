"""HFSeq2SeqAdapter: Hugging Face encoder-decoders (BART, T5, Marian) behind the protocol's encoder-decoder part.

The adapter's logits are the model's own (compared to the raw forward exactly: it calls that forward),
every hook it declares fires, cross-attention's K/V are computed once under cached decoding, bad source
input is one clear error, and a model patched to break cross-attention fails the rows that must catch it.
Tiny random models: d_model 32, 2 + 2 layers, vocabulary 96.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration
from transformers.cache_utils import EncoderDecoderCache
from transformers.models.bart import modeling_bart
from transformers.models.t5 import modeling_t5

import properties
from harness.adapters import HFAdapter, HFSeq2SeqAdapter, adapt, observed_hooks
from harness.adapters.entry import describe
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.protocol_facts import CROSS_ATTN_HOOKS, cross_attn_hook, encoder_hook
from tests.helpers.hf_models import SEQ2SEQ_VOCAB, seq2seq

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = SEQ2SEQ_VOCAB
tiny = seq2seq
CROSS_ROWS = ("encoder_bidirectional", "cross_attention_pattern", "source_padding_outputs", "cross_kv_cache")


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src, tok = torch.randint(3, VOCAB - 2, (2, 5), generator=g), torch.randint(3, VOCAB - 2, (2, 4), generator=g)
    return src, torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), tok, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])


def rows(frame) -> dict[str, str]:
    return {r.property: r.status for r in frame.itertuples()}


@pytest.fixture(scope="module", params=["bart", "t5", "marian"])
def pair(request):
    model = tiny(request.param)
    return request.param, model, adapt(model)


def test_adapt_gives_the_encoder_decoder_adapter(pair):
    kind, model, adapter = pair
    assert type(adapter) is HFSeq2SeqAdapter and adapt(model) is adapter  # one adapter per model
    cfg = adapter.cfg
    assert (cfg.is_encoder_decoder, cfg.n_encoder_layers, cfg.n_layers, cfg.attention_dir) == (True, 2, 2, "causal")
    assert describe(adapter) == f"HFSeq2SeqAdapter({kind}, attention_interface)"
    with pytest.raises(AttnlabTypeError, match=kind):  # the decoder-only adapter refuses it, naming it
        HFAdapter(tiny(kind))


def test_declared_design_follows_the_config(pair):
    kind, _, adapter = pair
    cfg = adapter.cfg
    expected = {"bart": ("standard", 8 ** -0.5, 2, False), "marian": ("sinusoidal", 8 ** -0.5, 0, False),
                "t5": ("none", 1.0, 0, True)}[kind]  # T5 folds 1/sqrt(d) into its init and adds b_h(i - j)
    assert (cfg.positional_embedding_type, cfg.attn_scale, cfg.pos_offset, cfg.relative_attention_bias) == expected


def test_logits_are_the_models_own(pair):
    _, model, adapter = pair
    src, src_mask, tok, tok_mask = batch()
    with torch.no_grad():
        raw = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tok, decoder_attention_mask=tok_mask)
        ours = adapter(tok, attention_mask=tok_mask, source_tokens=src, source_mask=src_mask)
        alone = adapter(tok)  # no source: one token of id 0 per row, as EncoderDecoder does
        raw_alone = model(input_ids=torch.zeros(2, 1, dtype=torch.long), decoder_input_ids=tok)
    # the adapter calls the model's own forward on right-padded batches: bit-identical, float32
    assert (ours - raw.logits).abs().max().item() == 0.0
    assert (alone - raw_alone.logits).abs().max().item() == 0.0


def test_left_padding_keeps_the_protocols_positions():
    model = tiny("bart")
    adapter = adapt(model)
    src, tok = torch.tensor([[0, 0, 7, 8, 9]]), torch.tensor([[0, 5, 6]])
    src_mask, tok_mask = torch.tensor([[0, 0, 1, 1, 1]]), torch.tensor([[0, 1, 1]])
    with torch.no_grad():
        padded = adapter(tok, attention_mask=tok_mask, source_tokens=src, source_mask=src_mask)[0, 1:]
        alone = model(input_ids=src[:, 2:], decoder_input_ids=tok[:, 1:]).logits[0]
        raw_padded = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tok,
                           decoder_attention_mask=tok_mask).logits[0, 1:]
    # float32 rounding of differently shaped masked attention: ~1e-7 relative on logits of size ~1
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)
    assert (raw_padded - alone).abs().max() > 1e-3  # BART numbers by index: left padding moves its positions


def test_every_declared_hook_fires(pair):
    _, _, adapter = pair
    names = set(adapter.hook_dict)
    assert {cross_attn_hook(layer, h) for layer in (0, 1) for h in CROSS_ATTN_HOOKS} <= names
    assert {encoder_hook(1, "attn.hook_pattern"), "blocks.1.hook_cross_attn_out", "encoder.hook_embed"} <= names
    assert observed_hooks(adapter) == names


def test_cross_keys_are_computed_once_and_cached_decoding_equals_recompute(pair):
    _, _, adapter = pair
    src, src_mask, tok, _ = batch()
    fired: list[str] = []
    counting = [(cross_attn_hook(layer, "hook_k"), lambda t, hook: fired.append(hook.name)) for layer in (0, 1)]
    with torch.no_grad(), adapter.hooks(fwd_hooks=counting):
        first, past = adapter.forward_with_cache(tok[:, :2], source_tokens=src, source_mask=src_mask)
        assert len(fired) == 2  # one per layer, at the first call
        second, past = adapter.forward_with_cache(tok[:, 2:], past=past)
        assert len(fired) == 2  # read back from the EncoderDecoderCache
        full = adapter(tok, source_tokens=src, source_mask=src_mask)
    # cached vs recomputed float32 attention: summation order only
    torch.testing.assert_close(torch.cat((first, second), 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"source_tokens": torch.zeros(2, 3)}, "dtype"),
    ({"source_tokens": torch.zeros(3, 3, dtype=torch.long)}, "3 rows: expected 2"),
    ({"source_tokens": torch.zeros(2, 3, dtype=torch.long), "source_mask": torch.ones(2, 4)}, "source_mask has shape"),
    ({"source_tokens": torch.full((2, 3), VOCAB, dtype=torch.long)}, f"token id {VOCAB}"),
    ({"source_mask": torch.ones(2, 3)}, "source_mask was given without source_tokens"),
    ({"source_tokens": torch.zeros(2, 2, dtype=torch.long), "source_mask": torch.tensor([[1, 1], [0, 0]])},
     "row 1 has no real token"),
])
def test_bad_source_is_one_clear_error(kwargs, match):
    adapter = adapt(tiny("bart"))
    with pytest.raises(AttnlabError, match=match):
        adapter(torch.zeros(2, 2, dtype=torch.long), **kwargs)


def test_a_source_after_the_first_cached_call_is_refused():
    adapter = adapt(tiny("bart"))
    src = torch.zeros(1, 2, dtype=torch.long)
    _, past = adapter.forward_with_cache(torch.zeros(1, 1, dtype=torch.long), source_tokens=src)
    with pytest.raises(AttnlabError, match="only at the first call"):
        adapter.forward_with_cache(torch.zeros(1, 1, dtype=torch.long), past=past, source_tokens=src)


# ---- patched modeling code: each break must fail the rows that catch it ----------------------------------
def _bart_attention(drop_cross_mask: bool = False, recompute_cross: bool = False):
    original = modeling_bart.BartAttention.forward

    def forward(self, hidden_states, key_value_states=None, cache=None, attention_mask=None, **kwargs):
        if key_value_states is not None and drop_cross_mask:
            attention_mask = None  # cross-attention reads the padded source positions too
        if key_value_states is not None and recompute_cross and isinstance(cache, EncoderDecoderCache):
            cache.is_updated[self.layer_idx] = False  # K/V of the source computed again at every step
        return original(self, hidden_states, key_value_states, cache, attention_mask, **kwargs)
    return mock.patch.object(modeling_bart.BartAttention, "forward", forward)


def test_cross_attention_without_the_source_mask_fails_its_rows():
    model = tiny("bart")
    src, src_mask, tok, _ = batch()
    other = src.clone()
    other[1, 3:] = 1  # other ids in row 1's padded source positions

    def moved() -> float:
        with torch.no_grad():
            a, b = (model(input_ids=s, attention_mask=src_mask, decoder_input_ids=tok).logits[1] for s in (src, other))
        return float((a - b).abs().max())

    # the witness, on the raw model: intact, row 1 ignores its pads exactly (masked weights are exactly 0);
    # patched, its logits move by far more than float32 rounding (~1e-8 on these logits)
    assert moved() == 0.0
    with _bart_attention(drop_cross_mask=True):
        assert moved() > 1e-5
        frame = properties.check_model(adapt(model), seed=0, max_examples=10, properties=list(CROSS_ROWS[:3]))
    assert rows(frame) == {"encoder_bidirectional": "pass", "cross_attention_pattern": "fail",
                           "source_padding_outputs": "fail"}


def test_cross_keys_recomputed_fail_cross_kv_cache():
    model = tiny("bart")
    with _bart_attention(recompute_cross=True):
        frame = properties.check_model(adapt(model), seed=0, max_examples=5, properties=["cross_kv_cache"])
    assert rows(frame) == {"cross_kv_cache": "fail"}


def test_t5_scale_is_checked_modulo_its_relative_bias_only():
    adapter = adapt(tiny("t5"))
    assert rows(properties.check_model(adapter, seed=0, max_examples=10, properties=["attention_scale"])) == \
        {"attention_scale": "pass"}
    # a model that scales q.k by 0.5 while it declared 1.0 (read at wrapping): the bias must not hide that.
    # A fresh one: the suite keeps a model's float64 twin while its weights are unchanged
    adapter = adapt(tiny("t5"))
    for module in adapter.hf_model.modules():
        if isinstance(module, modeling_t5.T5Attention):
            module.scaling = 0.5
    frame = properties.check_model(adapter, seed=0, max_examples=10, properties=["attention_scale"])
    assert rows(frame) == {"attention_scale": "fail"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bart", "t5", "marian"])
def test_every_applicable_row_passes(kind):
    frame = properties.check_model(adapt(tiny(kind)), seed=0, max_examples=10)
    status = rows(frame)
    assert {status[name] for name in CROSS_ROWS} == {"pass"}
    assert {name: s for name, s in status.items() if s not in ("pass", "n/a")} == {}


@pytest.mark.parametrize("model_type, class_name", [
    ("switch_transformers", "SwitchTransformersForConditionalGeneration"),  # its encoder raises on use_cache=True
    ("nllb-moe", "NllbMoeForConditionalGeneration"),  # reads encoder_outputs.router_logits
    ("t5gemma", "T5GemmaForConditionalGeneration"),  # reads encoder_outputs.last_hidden_state
])
def test_cached_decoding_hands_the_decoder_the_encoders_own_output(model_type, class_name):
    """The census's switch_transformers, nllb-moe and t5gemma rows: the first cached call encodes the source with
    the encoder alone, as generate() does, so each decoder gets the output object it reads; before, a tuple (or
    use_cache reaching Switch's encoder) raised inside the adapter."""
    from reports.census.shrink import build

    model = build(model_type, class_name).eval()
    adapter = adapt(model)
    vocab = adapter.cfg.d_vocab
    src, tok = torch.tensor([[3, 4, 5, 6]]) % vocab, torch.tensor([[2, 3, 4]]) % vocab
    with torch.no_grad():
        first, past = adapter.forward_with_cache(tok[:, :2], source_tokens=src)
        second, _ = adapter.forward_with_cache(tok[:, 2:], past=past)
        full = adapter(tok, source_tokens=src)
    torch.testing.assert_close(torch.cat((first, second), 1), full, atol=1e-5, rtol=1e-5)


def _bart_heads(encoder_heads: int, decoder_heads: int) -> BartForConditionalGeneration:
    torch.manual_seed(0)
    widths = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64,
                  decoder_ffn_dim=64, max_position_embeddings=64)
    return BartForConditionalGeneration(BartConfig(**widths, encoder_attention_heads=encoder_heads,
                                                   decoder_attention_heads=decoder_heads)).eval()


@pytest.mark.parametrize("encoder_heads, decoder_heads", [(2, 4), (4, 2)])
def test_the_decoders_heads_are_declared_and_the_encoders_hooks_keep_their_own(encoder_heads, decoder_heads):
    """BART's config maps num_attention_heads to encoder_attention_heads: the decoder's 4 heads were declared 2."""
    model = _bart_heads(encoder_heads, decoder_heads)
    adapter = adapt(model)
    cfg = adapter.cfg
    assert (cfg.n_heads, cfg.d_head, cfg.n_key_value_heads) == (decoder_heads, 32 // decoder_heads, decoder_heads)
    assert (cfg.n_encoder_heads, cfg.d_encoder_head) == (encoder_heads, 32 // encoder_heads)
    src, src_mask, tok, tok_mask = batch()
    with torch.no_grad():
        raw = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tok, decoder_attention_mask=tok_mask)
        logits, cache = adapter.run_with_cache(tok, attention_mask=tok_mask, source_tokens=src, source_mask=src_mask)
    assert (logits - raw.logits).abs().max().item() == 0.0
    assert observed_hooks(adapter) == set(adapter.hook_dict)
    (b, s), t = src.shape, tok.shape[1]
    dec, enc = (decoder_heads, 32 // decoder_heads), (encoder_heads, 32 // encoder_heads)
    for layer in (0, 1):
        for h in ("hook_q", "hook_k", "hook_v", "hook_z"):
            assert cache[encoder_hook(layer, f"attn.{h}")].shape == (b, s, *enc)
            assert cache[f"blocks.{layer}.attn.{h}"].shape == (b, t, *dec)
        assert cache[encoder_hook(layer, "attn.hook_pattern")].shape == (b, encoder_heads, s, s)
        assert cache[f"blocks.{layer}.attn.hook_pattern"].shape == (b, decoder_heads, t, t)
        for h, pos in (("hook_q", t), ("hook_k", s), ("hook_v", s), ("hook_z", t)):
            assert cache[cross_attn_hook(layer, h)].shape == (b, pos, *dec)
        assert cache[cross_attn_hook(layer, "hook_pattern")].shape == (b, decoder_heads, t, s)


def test_mismatched_heads_pass_the_rows_the_matched_model_passes():
    # before the decoder's heads were declared, attention_scale and kernel_consistency could not read the model
    matched, mismatched = (rows(properties.check_model(adapt(_bart_heads(e, 4)), seed=0, max_examples=10))
                           for e in (4, 2))
    assert mismatched == matched and {s for s in matched.values()} == {"pass", "n/a"}


def test_grouped_cross_attention_keys_fire_one_head_per_query_head():
    """T5Gemma's cross-attention projects 2 key/value heads for 4 query heads: cross_attn.hook_k/hook_v fire
    [batch, src_pos, 4, 16] (each key/value head repeated to its query heads), not k_proj's 32 features cut in 4."""
    from reports.census.shrink import build

    adapter = adapt(build("t5gemma", "T5GemmaForConditionalGeneration").eval())
    cfg = adapter.cfg
    assert (cfg.n_heads, cfg.d_head, cfg.n_key_value_heads) == (4, 16, 2)
    src, tok = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[2, 3, 4]])
    with torch.no_grad():
        plain, cache = adapter.run_with_cache(tok, source_tokens=src)
        key = cache[cross_attn_hook(0, "hook_k")]
        assert key.shape == (1, 4, 4, 16) and torch.equal(key[:, :, 0], key[:, :, 1])
        zeroed = adapter.run_with_hooks(tok, source_tokens=src,
                                        fwd_hooks=[(cross_attn_hook(0, "hook_v"), lambda t, hook: t * 0)])
        assert (zeroed - plain).abs().max() > 1e-3  # a group-consistent edit reaches the output
        with pytest.raises(AttnlabError, match="share a key/value head"):
            adapter.run_with_hooks(tok, source_tokens=src, fwd_hooks=[(cross_attn_hook(0, "hook_v"),
                                                                      lambda t, hook: t * torch.arange(4.0)[:, None])])
