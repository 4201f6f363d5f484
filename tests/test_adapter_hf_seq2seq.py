"""HFSeq2SeqAdapter: Hugging Face encoder-decoders (BART, T5, Marian, and EncoderDecoderModel pairings: bert2gpt2,
bert2bert, roberta2roberta) behind the protocol's encoder-decoder part.

The adapter's logits are the model's own (compared to the raw forward exactly: it calls that forward),
every hook it declares fires, cross-attention's K/V are computed once under cached decoding, bad source
input is one clear error, and a model patched to break cross-attention fails the rows that must catch it.
Tiny random models: d_model 32, 2 + 2 layers, vocabulary 96 (the pairings 64).
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertModel,
    EncoderDecoderConfig,
    EncoderDecoderModel,
    GPT2Config,
    GPT2LMHeadModel,
    RobertaConfig,
)
from transformers.cache_utils import EncoderDecoderCache
from transformers.models.bart import modeling_bart
from transformers.models.gpt2 import modeling_gpt2
from transformers.models.t5 import modeling_t5

import properties
from harness.adapters import HFAdapter, HFSeq2SeqAdapter, adapt, hf_seq2seq, observed_hooks
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


# ---- EncoderDecoderModel pairings: bert2gpt2, bert2bert, roberta2roberta -------------------------------------------
PAIR_VOCAB = 64
PAIRS = ("bert2gpt2", "bert2bert", "roberta2roberta")


def _bert_like(config_class, **extra):
    # 0.2 init (as tests/helpers/hf_models.py): attention far from uniform, so a broken mask moves the logits visibly;
    # position tables well past what the rows draw (RoBERTa's usable context is max_position_embeddings - pad - 1)
    return config_class(vocab_size=PAIR_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, initializer_range=0.2, **extra)


def pairing(kind: str) -> EncoderDecoderModel:
    """A tiny random ``EncoderDecoderModel`` (hidden 32, 2 + 2 layers of 4 heads, vocabulary 64): bert2gpt2 from the
    two models, as the classic recipe builds it; bert2bert and roberta2roberta from their configs. RoBERTa keeps its
    pad_token_id=1: its position table numbers positions from padding_idx + 1 = 2."""
    torch.manual_seed(0)
    if kind == "bert2gpt2":
        gpt2 = GPT2Config(vocab_size=PAIR_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2,
                          add_cross_attention=True, is_decoder=True, bos_token_id=0, eos_token_id=0)
        return EncoderDecoderModel(encoder=BertModel(_bert_like(BertConfig)), decoder=GPT2LMHeadModel(gpt2)).eval()
    config_class = {"bert2bert": BertConfig, "roberta2roberta": RobertaConfig}[kind]
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        _bert_like(config_class), _bert_like(config_class, is_decoder=True, add_cross_attention=True))
    return EncoderDecoderModel(config=config).eval()


@pytest.fixture(scope="module", params=PAIRS)
def paired(request):
    model = pairing(request.param)
    return request.param, model, adapt(model)


def test_a_pairing_is_adapted_with_every_hook_and_its_rows_run(paired):
    """bert2gpt2 was refused whole (GPT-2's cross-attention has no k_proj to hook hook_k on); bert2bert and
    roberta2roberta were adapted but their bare nn.Embedding position tables took "no position_ids", so every row
    with left padding or a source was unobservable. Now every row runs: no failure, the cross rows pass."""
    _, model, adapter = paired
    assert type(adapter) is HFSeq2SeqAdapter and adapter.unhooked == {}
    # every declared hook fires: hook_attn_out from BertSelfOutput.dense and GPT-2's c_proj, and the encoder's
    # attention hooks of an EncoderDecoderModel built from two models (its BertModel's modules kept a stale config)
    assert observed_hooks(adapter) == set(adapter.hook_dict)
    status = {r.property: (r.status, r.reason) for r in
              properties.check_model(adapter, seed=0, max_examples=5).itertuples()}
    assert not model.training  # check_model gave the model back in eval mode (its dropout off)
    assert {name: s for name, (s, _) in status.items() if s == "fail"} == {}
    assert {name: why for name, (s, why) in status.items() if s == "unobservable" and "hook" not in why} == {}
    assert {status[name][0] for name in CROSS_ROWS} == {"pass"}
    assert status["padding_outputs"][0] == status["kv_cache"][0] == "pass"


def test_a_pairings_logits_are_the_models_own(paired):
    kind, model, adapter = paired
    g = torch.Generator().manual_seed(1)
    src, tok = torch.randint(3, PAIR_VOCAB, (2, 5), generator=g), torch.randint(3, PAIR_VOCAB, (2, 4), generator=g)
    src_mask, tok_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with torch.no_grad():
        raw = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tok, decoder_attention_mask=tok_mask)
        ours = adapter(tok, attention_mask=tok_mask, source_tokens=src, source_mask=src_mask)
    # bit-identical at the real positions (RoBERTa numbers right-padded tokens by their ids, the protocol by the mask:
    # the padded positions' logits may differ and are nobody's)
    assert ((ours - raw.logits).abs().amax(-1) * tok_mask).max().item() == 0.0


def test_roberta_positions_are_the_protocols_from_padding_idx_plus_one():
    """RoBERTa's table numbers positions from its token ids (a real token with the pad id takes the padding row and
    shifts the rest) and from padding_idx + 1: the adapter gives both stacks the protocol's positions, + 2. The
    reference is the model's own forward given those position_ids explicitly."""
    model = pairing("roberta2roberta")
    adapter = adapt(model)
    pad = model.config.decoder.pad_token_id
    src, src_mask = torch.tensor([[9, 9, 7, pad, 8]]), torch.tensor([[0, 0, 1, 1, 1]])  # left-padded, pad id inside
    tok, tok_mask = torch.tensor([[9, 5, pad, 6]]), torch.tensor([[0, 1, 1, 1]])
    with torch.no_grad():
        ours = adapter(tok, attention_mask=tok_mask, source_tokens=src, source_mask=src_mask)[0, 1:]
        given = model(input_ids=src, attention_mask=src_mask, position_ids=torch.tensor([[2, 2, 2, 3, 4]]),
                      decoder_input_ids=tok, decoder_attention_mask=tok_mask,
                      decoder_position_ids=torch.tensor([[2, 2, 3, 4]])).logits[0, 1:]
        own = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tok,
                    decoder_attention_mask=tok_mask).logits[0, 1:]
    # the same ids through a per-row lookup and a broadcast one: float32 rounding of the masked attention only
    torch.testing.assert_close(ours, given, atol=1e-5, rtol=1e-5)
    assert (own - given).abs().max() > 1e-3  # the model's own numbering moves them: the imposition is not idle


def test_gpt2s_fused_cross_kv_is_split_as_its_forward_splits_it():
    model = pairing("bert2gpt2")
    adapter = adapt(model)
    src, tok = torch.tensor([[3, 4, 5, 6, 7]]), torch.tensor([[2, 3, 4]])
    cross = model.decoder.transformer.h[0].crossattention
    with torch.no_grad():
        plain, cache = adapter.run_with_cache(tok, source_tokens=src)
        encoded = model.encoder(input_ids=src).last_hidden_state
        key, value = cross.c_attn(encoded).split(cross.split_size, dim=2)
        assert torch.equal(cache[cross_attn_hook(0, "hook_k")], key.unflatten(-1, (4, 8)))
        assert torch.equal(cache[cross_attn_hook(0, "hook_v")], value.unflatten(-1, (4, 8)))
        # an edit of hook_v is the model with that half of c_attn's output edited, and no other
        zeroed = adapter.run_with_hooks(tok, source_tokens=src,
                                        fwd_hooks=[(cross_attn_hook(0, "hook_v"), lambda t, hook: t * 0)])
        adapter.detach()
        handle = cross.c_attn.register_forward_hook(
            lambda module, args, out: torch.cat((out[..., :cross.split_size], out[..., cross.split_size:] * 0), -1))
        try:
            reference = model(input_ids=src, decoder_input_ids=tok).logits
        finally:
            handle.remove()
    assert (zeroed - plain).abs().max() > 1e-3 and torch.equal(zeroed, reference)


def test_gpt2s_cross_keys_are_computed_once_under_cached_decoding():
    adapter = adapt(pairing("bert2gpt2"))
    src, tok = torch.tensor([[3, 4, 5, 6, 7]]), torch.tensor([[2, 3, 4, 5]])
    fired: list[str] = []
    counting = [(cross_attn_hook(layer, h), lambda t, hook: fired.append(hook.name))
                for layer in (0, 1) for h in ("hook_k", "hook_v")]
    with torch.no_grad(), adapter.hooks(fwd_hooks=counting):
        first, past = adapter.forward_with_cache(tok[:, :2], source_tokens=src)
        assert len(fired) == 4  # k and v, once per layer, at the first call
        second, _ = adapter.forward_with_cache(tok[:, 2:], past=past)
        assert len(fired) == 4  # read back from the EncoderDecoderCache
        full = adapter(tok, source_tokens=src)
    torch.testing.assert_close(torch.cat((first, second), 1), full, atol=1e-5, rtol=1e-5)


def test_a_cross_attention_without_findable_kv_leaves_only_its_rows_unobservable():
    """Where the adapter finds no K/V projection (here: GPT-2's fused one unrecognised) the model is not refused:
    hook_k/hook_v are absent, ``unhooked`` says why, cross_kv_cache (which needs hook_k) is unobservable naming it
    and every other cross row runs."""
    with mock.patch.object(hf_seq2seq, "FUSED_KV_NAMES", ()):
        adapter = adapt(pairing("bert2gpt2"))
    absent = {cross_attn_hook(layer, h) for layer in (0, 1) for h in ("hook_k", "hook_v")}
    assert set(adapter.unhooked) == absent and not absent & set(adapter.hook_dict)
    assert all("GPT2Attention has no k_proj" in why for why in adapter.unhooked.values())
    frame = properties.check_model(adapter, seed=0, max_examples=5, properties=list(CROSS_ROWS))
    status = {r.property: (r.status, r.reason) for r in frame.itertuples()}
    assert status.pop("cross_kv_cache") == ("unobservable", f"no hook point {cross_attn_hook(0, 'hook_k')}")
    assert {s for s, _ in status.values()} == {"pass"}


@contextmanager
def _gpt2_cross_attention(causal: bool):
    """GPT-2's cross-attention reading the padded source positions (no encoder_attention_mask); with ``causal``,
    also causal over the source (query i sees source keys 0..i only)."""
    original = modeling_gpt2.GPT2Attention.forward

    def forward(self, *args, **kwargs):
        if kwargs.get("encoder_hidden_states") is not None:
            kwargs["encoder_attention_mask"] = None
            if causal:
                kwargs["is_causal"] = True
        return original(self, *args, **kwargs)
    with mock.patch.object(modeling_gpt2.GPT2Attention, "forward", forward):
        yield


@pytest.mark.parametrize("causal", [False, True], ids=["no-source-mask", "causal-over-source"])
def test_a_broken_gpt2_cross_attention_fails_its_rows(causal):
    model = pairing("bert2gpt2")
    with _gpt2_cross_attention(causal):
        frame = properties.check_model(adapt(model), seed=0, max_examples=5, properties=list(CROSS_ROWS[:3]))
    assert rows(frame) == {"encoder_bidirectional": "pass", "cross_attention_pattern": "fail",
                           "source_padding_outputs": "fail"}
