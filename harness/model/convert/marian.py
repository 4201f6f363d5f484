"""Our :class:`~harness.model.seq2seq.EncoderDecoder` to and from Hugging Face's ``MarianMTModel``.

Why Marian. Our encoder-decoder is Vaswani et al. 2017's; of the encoder-decoders transformers ships, Marian
(Junczys-Dowmunt et al. 2018) is the one computing that architecture with no part of its own:

- post-norm "Add & Norm" (§3.1) in every sublayer, no final norm (``MarianEncoderLayer``/``MarianDecoderLayer``:
  ``residual + h`` then ``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm``), as our
  ``norm_placement="post"`` (whose models have no ``ln_final``);
- fixed sinusoidal positions (§3.5) added to unscaled embeddings (``scale_embedding=False``), no embedding
  LayerNorm: BART and MBart add one (``layernorm_embedding``), ours has none, so they do not map;
- source and target embeddings kept apart (``share_encoder_decoder_embeddings=False``), ours being two tables:
  the pre-norm classes whose layout is ours (Pegasus: sinusoidal, Blenderbot: learned positions, both with a final
  ``layer_norm``) always share one table between encoder and decoder (``self.shared``), so a pre-norm model of
  ours maps to none of them; T5 uses relative position buckets and RMS norm without biases;
- biased q/k/v/out and fc1/fc2 projections, scores scaled by ``head_dim ** -0.5``, ``lm_head`` tied to the
  decoder's embedding or not (``tie_word_embeddings``) plus ``final_logits_bias`` (exported as zeros).

The one difference of layout: Marian's table puts every sine first and every cosine after
(``MarianSinusoidalPositionalEmbedding.create_weight``: "features are not interleaved"), ours interleaves
them, PE(p, 2i) = sin, PE(p, 2i+1) = cos. The export therefore renames the residual stream's coordinates by a
fixed permutation (ours ``2i`` -> Marian ``i``, ``2i+1`` -> ``d/2 + i``) in every weight that reads or writes it;
LayerNorm and the dot products are invariant under it, and Marian's table is then ours entry for entry (equal
bit for bit in float32). Marian rebuilds that table at load and saves none, so ours need not be written.

One difference of inputs, not weights: Marian numbers source positions ``0..src_len-1`` whatever the mask
(``MarianEncoder.forward``: ``embed_pos = self.embed_positions(inputs_embeds.shape[:-1])``), ours counts the
real tokens before each one (docs/architecture.md). The two agree on right-padded or unpadded sources (and an
unpadded decoder); a left-padded source must be right-aligned before it is given to the export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, cast

import torch
from torch import Tensor
from transformers import MarianConfig, MarianMTModel

from harness.errors import AttnlabError
from harness.model.config import ModelConfig
from harness.model.cross_attention import DecoderBlock
from harness.model.head_mask import head_mask_of
from harness.model.layers import Block, Norm
from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig
from harness.model.transformer import TORCH_DTYPES

NAME = "MarianMTModel"
MARIAN_EPS = 1e-5  # nn.LayerNorm's default, which Marian never changes
# Ours -> transformers' ACT2FN names computed by the same kernel (as harness.model.convert.to_hf._ACT_NAMES).
ACT_NAMES = {"gelu": "gelu", "gelu_new": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}
ACTS_BACK = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new", "relu": "relu",
             "silu": "silu", "swish": "silu"}

# (field, the values Marian can take, why), checked in this order; fields neither here nor in _MAPPED must
# keep ModelConfig's default.
_REQUIRED: list[tuple[str, tuple, str]] = [
    ("norm_placement", ("post",), "'post' (Marian normalizes after each sublayer, modeling_marian.py "
     "MarianEncoderLayer; the pre-norm encoder-decoders of transformers, Pegasus and Blenderbot, share one token "
     "embedding between encoder and decoder, and ours has two)"),
    ("normalization_type", ("LN",), "'LN' (Marian's nn.LayerNorm)"),
    ("positional_embedding_type", ("sinusoidal",), "'sinusoidal' (Marian adds fixed sinusoids, "
     "MarianSinusoidalPositionalEmbedding, rebuilt at load: a learned table has nowhere to go)"),
    ("gated_mlp", (False,), "False (Marian's MLP is fc2(act(fc1 x)))"),
    ("attn_only", (False,), "False (every Marian layer has its MLP and final_layer_norm)"),
    ("use_attn_scale", (True,), "True (Marian scales scores by head_dim ** -0.5)"),
    ("attn_bias", (True,), "True (Marian's q/k/v/out projections always carry biases)"),
    ("mlp_bias", (True,), "True (Marian's fc1/fc2 always carry biases)"),
    ("n_key_value_heads", (None,), "None (Marian's attention has as many key/value heads as query heads)"),
    ("eps", (MARIAN_EPS,), f"{MARIAN_EPS} (Marian's nn.LayerNorm keeps torch's default eps)"),
]
_MAPPED = {"n_layers", "n_encoder_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn",
           "tie_embeddings", "init_range", "seed", "dtype", "use_attn_result"}  # seed drew the init only


def _refuse(name: str, value: Any, expected: str) -> AttnlabError:
    return AttnlabError(f"to_hf: {name}={value!r} has no {NAME} equivalent: expected {expected}")


def check_marian(cfg: Seq2SeqConfig) -> None:
    """Raise ``AttnlabError`` naming the first field of ``cfg`` that Marian cannot reproduce; reads only the config."""
    for field, allowed, expected in _REQUIRED:
        value = getattr(cfg, field)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise _refuse(field, value, expected)
    checked = _MAPPED | {field for field, _, _ in _REQUIRED}
    defaults = ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        if f.name not in checked and getattr(cfg, f.name) != getattr(defaults, f.name):
            raise _refuse(f.name, getattr(cfg, f.name), f"the default {getattr(defaults, f.name)!r}")
    if cfg.act_fn not in ACT_NAMES:
        raise _refuse("act_fn", cfg.act_fn, f"one of {sorted(ACT_NAMES)}")
    if cast(int, cfg.d_head) * cfg.n_heads != cfg.d_model:  # resolved by ModelConfig
        raise _refuse("d_head", cfg.d_head, f"d_model / n_heads = {cfg.d_model / cfg.n_heads:g} (Marian derives "
                      "the head width from d_model and the head count)")


def residual_order(d_model: int, device: Optional[torch.device] = None) -> Tensor:
    """Marian's residual coordinate ``j`` is ours ``order[j]``: the sines' coordinates first, then the cosines'."""
    return torch.cat((torch.arange(0, d_model, 2, device=device), torch.arange(1, d_model, 2, device=device)))


def _marian_config(cfg: Seq2SeqConfig) -> MarianConfig:
    d_mlp = cast(int, cfg.d_mlp)  # n_encoder_layers, d_mlp: resolved by the config
    return MarianConfig(
        vocab_size=cfg.d_vocab, decoder_vocab_size=cfg.d_vocab, max_position_embeddings=cfg.n_ctx,
        encoder_layers=cast(int, cfg.n_encoder_layers), decoder_layers=cfg.n_layers, encoder_ffn_dim=d_mlp,
        decoder_ffn_dim=d_mlp, encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        d_model=cfg.d_model, activation_function=ACT_NAMES[cfg.act_fn], dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, init_std=cfg.init_range, scale_embedding=False,
        share_encoder_decoder_embeddings=False, tie_word_embeddings=cfg.tie_embeddings,
        # no special ids: they steer generation, not the function; 0 is a valid id of any vocabulary
        pad_token_id=0, decoder_start_token_id=0, eos_token_id=None, forced_eos_token_id=None, bos_token_id=None)


def _blocks(stack: Any) -> Sequence[Block]:
    return cast(Sequence[Block], stack)


class _Copier:
    """Copies between our weights and Marian's, renaming residual coordinates (``to_marian``: ours -> theirs)."""

    def __init__(self, order: Tensor, to_marian: bool) -> None:
        self.order, self.to_marian = order, to_marian
        self.back = torch.argsort(order)  # ours coordinate i is Marian's back[i]

    def _move(self, dst: Tensor, src: Tensor, in_dim: Optional[int], out_dim: Optional[int]) -> None:
        """``dst = src``, the residual dimension(s) renamed: ``in_dim`` reads the residual, ``out_dim`` writes it."""
        perm = self.order if self.to_marian else self.back
        src = src.detach()
        for dim in (in_dim, out_dim):
            if dim is not None:
                src = src.index_select(dim, perm.to(src.device))
        if dst.shape != src.shape:
            side = "to_hf" if self.to_marian else "from_hf"
            raise AttnlabError(f"{side}: a weight of shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
        dst.copy_(src.to(dtype=dst.dtype, device=dst.device))

    def pair(self, ours: Tensor, theirs: Tensor, in_dim: Optional[int] = None, out_dim: Optional[int] = None) -> None:
        if self.to_marian:
            self._move(theirs, ours, in_dim, out_dim)
        else:
            self._move(ours, theirs, in_dim, out_dim)

    def linear(self, ours_w: Tensor, ours_b: Optional[Tensor], theirs: Any, *, reads: bool, writes: bool) -> None:
        """An ``nn.Linear`` pair (weights ``[out, in]``): ``reads``/``writes`` the residual stream."""
        self.pair(ours_w, theirs.weight, 1 if reads else None, 0 if writes else None)
        if ours_b is not None:
            self.pair(ours_b, theirs.bias, None, 0 if writes else None)

    def norm(self, ours: Any, theirs: Any) -> None:
        self.pair(cast(Norm, ours).w, theirs.weight, None, 0)
        self.pair(cast(Norm, ours).b, theirs.bias, None, 0)

    def attention(self, o_weight: Tensor, ours: Any, theirs: Any) -> None:
        """Self-attention: our fused [q | k | v] rows (head-major, as Marian's q/k/v_proj) and output projection."""
        q, k, v = ours.qkv.weight.chunk(3)
        qb, kb, vb = ours.qkv.bias.chunk(3)
        for w, b, proj in ((q, qb, theirs.q_proj), (k, kb, theirs.k_proj), (v, vb, theirs.v_proj)):
            self._split(w, b, proj)
        self.linear(o_weight, ours.o.bias, theirs.out_proj, reads=False, writes=True)

    def cross(self, ours: Any, theirs: Any) -> None:
        """Cross-attention: our q and fused [k | v] rows, Marian's encoder_attn q/k/v_proj."""
        self.linear(ours.q.weight, ours.q.bias, theirs.q_proj, reads=True, writes=False)
        k, v = ours.kv.weight.chunk(2)
        kb, vb = ours.kv.bias.chunk(2)
        self._split(k, kb, theirs.k_proj)
        self._split(v, vb, theirs.v_proj)
        self.linear(ours.o.weight, ours.o.bias, theirs.out_proj, reads=False, writes=True)

    def _split(self, w: Tensor, b: Tensor, proj: Any) -> None:
        """One block of rows of a fused projection of ours (a view: written in place on import)."""
        self.pair(w, proj.weight, 1, None)
        self.pair(b, proj.bias)

    def mlp(self, ours: Any, theirs: Any) -> None:
        self.linear(ours.mlp.w_in.weight, ours.mlp.w_in.bias, theirs.fc1, reads=True, writes=False)
        self.linear(ours.mlp.w_out.weight, ours.mlp.w_out.bias, theirs.fc2, reads=False, writes=True)


def masked_o_weight(model: Any, layer: int) -> Tensor:
    """Self-attention output projection ``[d_model, n_heads * d_head]`` of ``model.blocks[layer]`` (our Transformer,
    or an EncoderDecoder's decoder), the columns of the heads its head mask prunes zeroed."""
    w = _blocks(model.blocks)[layer].attn.o.weight.detach().clone()
    mask = head_mask_of(model)
    if mask is not None:
        dh = cast(int, model.config.d_head)
        for h, keep in enumerate(mask[layer]):
            if not keep:
                w[:, h * dh:(h + 1) * dh] = 0
    return w


def copy_weights(model: EncoderDecoder, hf: Any, *, to_marian: bool) -> None:
    """Every weight between ``model`` and the MarianMTModel ``hf``, in the direction ``to_marian`` says."""
    c = _Copier(residual_order(model.config.d_model), to_marian)
    m = hf.model
    c.pair(model.encoder.embed.weight, m.encoder.embed_tokens.weight, 1)
    c.pair(model.embed.weight, m.decoder.embed_tokens.weight, 1)
    for ours, theirs in zip(_blocks(model.encoder.blocks), m.encoder.layers, strict=True):
        c.attention(ours.attn.o.weight, ours.attn, theirs.self_attn)
        c.norm(ours.ln1, theirs.self_attn_layer_norm)
        c.mlp(ours, theirs)
        c.norm(ours.ln2, theirs.final_layer_norm)
    for i, (ours, theirs) in enumerate(zip(_blocks(model.blocks), m.decoder.layers, strict=True)):
        block = cast(DecoderBlock, ours)
        c.attention(masked_o_weight(model, i) if to_marian else ours.attn.o.weight, ours.attn, theirs.self_attn)
        c.norm(ours.ln1, theirs.self_attn_layer_norm)
        c.cross(block.cross_attn, theirs.encoder_attn)
        c.norm(block.ln_cross, theirs.encoder_attn_layer_norm)
        c.mlp(ours, theirs)
        c.norm(ours.ln2, theirs.final_layer_norm)
    if not model.config.tie_embeddings:
        c.pair(model.unembed.weight, hf.lm_head.weight, 1)
    if to_marian:
        hf.final_logits_bias.zero_()  # ours has no unembedding bias


def to_marian(model: EncoderDecoder) -> Any:
    """A ``MarianMTModel`` computing ``model``'s logits, in eval mode, in its dtype (see the module docstring)."""
    cfg = cast(Seq2SeqConfig, model.config)  # an EncoderDecoder's config is one
    check_marian(cfg)
    hf_config = _marian_config(cfg)
    hf_config._attn_implementation = "sdpa"  # the kernel our unhooked forward runs, and from_pretrained's default
    with torch.device("cpu"):
        hf = MarianMTModel(hf_config)
    hf = hf.to(TORCH_DTYPES[cfg.dtype])
    with torch.no_grad():
        copy_weights(model, hf, to_marian=True)
    return hf.eval()


def _from_refuse(name: str, value: Any, expected: str) -> AttnlabError:
    return AttnlabError(f"from_hf: config.{name}={value!r} cannot be reproduced: expected {expected}")


def marian_config(c: Any, dtype: str) -> Seq2SeqConfig:
    """Our config of a MarianConfig, refusing what our EncoderDecoder cannot compute."""
    if c.scale_embedding:
        raise _from_refuse("scale_embedding", True, "False (our embeddings are not scaled by sqrt(d_model))")
    if c.encoder_attention_heads != c.decoder_attention_heads:
        raise _from_refuse("encoder_attention_heads", c.encoder_attention_heads,
                           f"decoder_attention_heads={c.decoder_attention_heads} (ours share one head count)")
    if c.encoder_ffn_dim != c.decoder_ffn_dim:
        raise _from_refuse("encoder_ffn_dim", c.encoder_ffn_dim, f"decoder_ffn_dim={c.decoder_ffn_dim} (ours share "
                           "one MLP width)")
    if (c.decoder_vocab_size or c.vocab_size) != c.vocab_size:
        raise _from_refuse("decoder_vocab_size", c.decoder_vocab_size, f"vocab_size={c.vocab_size} (one vocabulary "
                           "for source and target)")
    if c.d_model % 2 or c.d_model % c.encoder_attention_heads:
        raise _from_refuse("d_model", c.d_model, "an even multiple of the head count")
    if c.activation_function not in ACTS_BACK:
        raise _from_refuse("activation_function", c.activation_function, f"one of {sorted(ACTS_BACK)}")
    std = c.init_std
    init: dict[str, Any] = {"init_range": float(std)} if isinstance(std, (int, float)) and std > 0 else {}
    return Seq2SeqConfig(
        n_layers=c.decoder_layers, n_encoder_layers=c.encoder_layers, d_model=c.d_model,
        n_heads=c.decoder_attention_heads, d_mlp=c.decoder_ffn_dim, d_vocab=c.vocab_size,
        n_ctx=c.max_position_embeddings, act_fn=ACTS_BACK[c.activation_function], normalization_type="LN",
        norm_placement="post", positional_embedding_type="sinusoidal", tie_embeddings=bool(c.tie_word_embeddings),
        eps=MARIAN_EPS, dtype=dtype, **init)


def from_marian(hf: Any, dtype: str) -> EncoderDecoder:
    """An :class:`EncoderDecoder` computing the MarianMTModel ``hf``'s logits, in eval mode."""
    cfg = marian_config(hf.config, dtype)
    bias = hf.final_logits_bias.detach()
    if bias.any():
        raise AttnlabError("from_hf: final_logits_bias is not zero: expected none (our unembedding has no bias)")
    if cfg.tie_embeddings and not torch.equal(hf.lm_head.weight, hf.model.decoder.embed_tokens.weight):
        raise AttnlabError("from_hf: config.tie_word_embeddings=True but lm_head.weight differs from the decoder's "
                           "token embedding: expected tied (identical) matrices")
    model = EncoderDecoder(cfg)
    with torch.no_grad():
        copy_weights(model, hf, to_marian=False)
    return model.eval()
