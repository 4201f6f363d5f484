"""Export a :class:`harness.Transformer` as a Hugging Face ``GPT2LMHeadModel`` or ``LlamaForCausalLM``.

The inverse of :func:`harness.model.convert.from_hf`: absolute positions (learned, sinusoidal or
none) with pre-LayerNorm blocks are GPT-2 (Radford et al. 2019); rotary positions with pre-RMSNorm
gated-MLP blocks are Llama (Touvron et al. 2023). Every field of the model's config is checked before
a weight is copied: one that the target cannot reproduce exactly raises an ``AttnlabError`` naming
the field and what the target would need, so an export never computes a silently different function.

Where the two sides differ only in what they store, the export is still exact:

- a missing bias is written as zeros (GPT-2 always has biases; Llama's ``mlp_bias`` adds one to the
  gate projection, which ours lacks);
- an attention-only model gets MLPs of width 1 whose weights and biases are zero: the MLP then adds
  exactly 0.0 to the residual stream (every activation here maps 0 to 0), so its norm is irrelevant;
- sinusoidal positions (Vaswani et al. 2017 section 3.5) are GPT-2's position table filled with our
  sinusoids, and no positions at all a table of zeros (adding 0.0 changes no bit);
- grouped-query attention (Ainslie et al. 2023) is GPT-2's multi-head attention with each key/value
  head's weights repeated for the query heads that share it, as our forward repeats the keys and values;
- a head held at zero by a head mask (:mod:`harness.model.head_mask`) has its columns of the output
  projection zeroed, which removes its output exactly as ``hook_z = 0`` does.

On the same device and dtype the GPT-2 export computes our logits to the bit (both run
``scaled_dot_product_attention``; tests/test_export.py checks ``torch.equal``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, cast

import torch
from torch import Tensor
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.config import ModelConfig
from harness.model.convert.marian import check_marian, masked_o_weight, to_marian
from harness.model.layers import Block, Norm
from harness.model.positions import sinusoidal_table
from harness.model.seq2seq import EncoderDecoder, Seq2SeqConfig
from harness.model.transformer import TORCH_DTYPES, Transformer

TARGETS = ("gpt2", "llama", "marian")  # marian: encoder-decoders only (harness.model.convert.marian)

# Ours -> the names transformers' ACT2FN knows for the same function, computed by the same kernel:
# "gelu_pytorch_tanh" is F.gelu(approximate="tanh"), ours; HF's "gelu_new" spells the formula out and
# differs in the last bits.
_ACT_NAMES = {"gelu": "gelu", "gelu_new": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}
_MLP_FIELDS = ("gated_mlp", "act_fn", "mlp_bias", "d_mlp")  # what an attention-only model never uses
ATTN_ONLY_D_MLP = 1  # the narrowest MLP both configs accept, all zeros: an attention-only model's export

# Fields each target reproduces, as (field, the values it can take, what the target needs).
# Fields not named here and not in _MAPPED must keep ModelConfig's default (a design a later
# field declares is refused rather than dropped).
_REQUIRED: dict[str, list[tuple[str, tuple, str]]] = {
    "gpt2": [
        ("normalization_type", ("LN",), "'LN' (GPT-2 uses LayerNorm)"),
        ("norm_placement", ("pre",), "'pre' (GPT-2 normalizes before each sublayer; HF has no post-norm GPT-2)"),
        ("positional_embedding_type", ("standard", "sinusoidal", "none"),
         "'standard', 'sinusoidal' or 'none' (GPT-2 adds a table of absolute positions)"),
        ("attention_dir", ("causal",), "'causal' (GPT2LMHeadModel is a decoder)"),
        ("gated_mlp", (False,), "False (GPT-2's MLP is not gated)"),
    ],
    "llama": [
        ("normalization_type", ("RMS",), "'RMS' (Llama uses RMSNorm)"),
        ("norm_placement", ("pre",), "'pre' (Llama normalizes before each sublayer)"),
        ("positional_embedding_type", ("rotary",), "'rotary' (Llama's RoPE)"),
        ("attention_dir", ("causal",), "'causal' (LlamaForCausalLM is a decoder)"),
        ("gated_mlp", (True,), "True (Llama's MLP is SwiGLU-style gated)"),
        ("use_attn_scale", (True,), "True (Llama always scales scores by 1/sqrt(head_dim))"),
    ],
}
_MAPPED = {"n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "rotary_base",
           "use_attn_scale", "tie_embeddings", "n_key_value_heads", "attn_bias", "mlp_bias", "eps", "init_range",
           "seed", "dtype", "use_attn_result", "attn_only"}  # use_attn_result only adds a hook; seed drew the init


def _refuse(name: str, value: Any, target: str, expected: str) -> AttnlabError:
    return AttnlabError(f"to_hf: {name}={value!r} has no {target} equivalent: expected {expected}")


def _choose(cfg: ModelConfig, target: Optional[str]) -> str:
    if isinstance(cfg, Seq2SeqConfig):  # an encoder-decoder has one target, and no decoder-only one
        if target not in (None, "marian"):
            raise AttnlabError(f"to_hf: target={target!r} is invalid for an encoder-decoder: expected 'marian' or None")
        return "marian"
    if target is not None:
        if target not in TARGETS or target == "marian":
            raise AttnlabError(f"to_hf: target={target!r} is invalid: expected one of {list(TARGETS[:2])} or None "
                               "('marian' is for an EncoderDecoder)")
        return target
    pos = cfg.positional_embedding_type
    if pos in ("standard", "sinusoidal", "none"):
        return "gpt2"
    if pos == "rotary":
        return "llama"
    raise _refuse("positional_embedding_type", pos, "Hugging Face",
                  "'standard', 'sinusoidal', 'none' (GPT2LMHeadModel) or 'rotary' (LlamaForCausalLM)")


def _check(cfg: ModelConfig, target: str) -> None:
    name = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[target]
    checked = set(_MAPPED)
    for field, allowed, expected in _REQUIRED[target]:
        checked.add(field)
        if cfg.attn_only and field in _MLP_FIELDS:
            continue  # the export's MLP is zero whatever it would have been
        value = getattr(cfg, field)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise _refuse(field, value, name, expected)
    defaults = ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        if f.name not in checked and getattr(cfg, f.name) != getattr(defaults, f.name):
            raise _refuse(f.name, getattr(cfg, f.name), name, f"the default {getattr(defaults, f.name)!r}")
    if cfg.act_fn not in _ACT_NAMES:
        raise _refuse("act_fn", cfg.act_fn, name, f"one of {sorted(_ACT_NAMES)}")
    if target == "gpt2":
        if cast(int, cfg.d_head) * cfg.n_heads != cfg.d_model:  # d_head/d_mlp: resolved by ModelConfig
            raise _refuse("d_head", cfg.d_head, name, f"d_model / n_heads = {cfg.d_model / cfg.n_heads:g} "
                          "(GPT-2 derives the head width from n_embd and n_head)")


def _hf_config(cfg: ModelConfig, target: str) -> Any:
    common: dict[str, Any] = dict(vocab_size=cfg.d_vocab, tie_word_embeddings=cfg.tie_embeddings,
                                  initializer_range=cfg.init_range, bos_token_id=None, eos_token_id=None,
                                  pad_token_id=None)
    d_mlp = ATTN_ONLY_D_MLP if cfg.attn_only else cast(int, cfg.d_mlp)  # resolved by ModelConfig
    if target == "gpt2":
        return GPT2Config(n_layer=cfg.n_layers, n_embd=cfg.d_model, n_head=cfg.n_heads, n_inner=d_mlp,
                          n_positions=cfg.n_ctx, activation_function=_ACT_NAMES[cfg.act_fn],
                          layer_norm_epsilon=cfg.eps, scale_attn_weights=cfg.use_attn_scale,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    return LlamaConfig(num_hidden_layers=cfg.n_layers, hidden_size=cfg.d_model, num_attention_heads=cfg.n_heads,
                       num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.d_head, intermediate_size=d_mlp,
                       max_position_embeddings=cfg.n_ctx, hidden_act=_ACT_NAMES[cfg.act_fn],
                       rms_norm_eps=cfg.eps, attention_bias=cfg.attn_bias,
                       mlp_bias=cfg.mlp_bias and not cfg.attn_only,
                       rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rotary_base)}, **common)



def _blocks(model: Transformer) -> Sequence[Block]:
    # typed view of the ModuleList (iterating an nn.ModuleList yields plain Modules)
    return cast(Sequence[Block], model.blocks)

def _put(dst: Tensor, src: Optional[Tensor]) -> None:
    """Copy ``src`` into ``dst``; None (a bias ours does not have) writes zeros, the same function."""
    if src is None:
        dst.zero_()
        return
    if dst.shape != src.shape:
        raise AttnlabError(f"to_hf: a weight of shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.copy_(src.detach().to(dtype=dst.dtype, device=dst.device))


def _position_table(model: Transformer) -> Optional[Tensor]:
    """GPT-2's ``wpe`` for our positions: the learned table, our sinusoids at 0..n_ctx-1, or None (zeros)."""
    cfg = model.config
    if cfg.positional_embedding_type == "standard":
        return model.pos_embed.weight
    if cfg.positional_embedding_type == "sinusoidal":
        positions = torch.arange(cfg.n_ctx, device=model.embed.weight.device)
        return sinusoidal_table(positions, cfg.d_model, dtype=model.embed.weight.dtype)
    return None  # no positions: a table of zeros adds exactly nothing


def _mha_qkv(model: Transformer, t: Optional[Tensor]) -> Optional[Tensor]:
    """Our fused q|k|v rows with each key/value head repeated for its query heads (GQA as plain MHA)."""
    cfg = model.config
    if t is None or cfg.n_kv_heads == cfg.n_heads:
        return t
    dh = cast(int, cfg.d_head)  # resolved by ModelConfig
    q, k, v = t.split([cfg.n_heads * dh, cfg.n_kv_heads * dh, cfg.n_kv_heads * dh])
    group = cfg.n_heads // cfg.n_kv_heads  # the same repeat_interleave as Attention.forward

    def repeat(w: Tensor) -> Tensor:
        return w.reshape(cfg.n_kv_heads, dh, *w.shape[1:]).repeat_interleave(group, dim=0).flatten(0, 1)

    return torch.cat((q, repeat(k), repeat(v)))


def _gpt2_copy(model: Transformer, hf: Any) -> None:
    t = hf.transformer
    _put(t.wte.weight, model.embed.weight)
    _put(t.wpe.weight, _position_table(model))
    for i, (ours, theirs) in enumerate(zip(_blocks(model), t.h, strict=True)):
        # HF's Conv1D stores [in, out] (x @ W); nn.Linear stores [out, in]: transpose both ways.
        _put(theirs.attn.c_attn.weight, cast(Tensor, _mha_qkv(model, ours.attn.qkv.weight)).T)
        _put(theirs.attn.c_attn.bias, _mha_qkv(model, ours.attn.qkv.bias))
        _put(theirs.attn.c_proj.weight, masked_o_weight(model, i).T)
        _put(theirs.attn.c_proj.bias, ours.attn.o.bias)
        _put(theirs.ln_1.weight, cast(Norm, ours.ln1).w)
        _put(theirs.ln_1.bias, cast(Norm, ours.ln1).b)
        if model.config.attn_only:  # a zero MLP adds 0.0: its norm's gain is irrelevant, kept at HF's 1
            for param in (theirs.mlp.c_fc.weight, theirs.mlp.c_fc.bias, theirs.mlp.c_proj.weight,
                          theirs.mlp.c_proj.bias, theirs.ln_2.bias):
                _put(param, None)
            theirs.ln_2.weight.fill_(1.0)
            continue
        _put(theirs.mlp.c_fc.weight, ours.mlp.w_in.weight.T)
        _put(theirs.mlp.c_fc.bias, ours.mlp.w_in.bias)
        _put(theirs.mlp.c_proj.weight, ours.mlp.w_out.weight.T)
        _put(theirs.mlp.c_proj.bias, ours.mlp.w_out.bias)
        _put(theirs.ln_2.weight, cast(Norm, ours.ln2).w)
        _put(theirs.ln_2.bias, cast(Norm, ours.ln2).b)
    _put(t.ln_f.weight, model.ln_final.w)
    _put(t.ln_f.bias, model.ln_final.b)
    if not model.config.tie_embeddings:
        _put(hf.lm_head.weight, model.unembed.weight)


def _llama_copy(model: Transformer, hf: Any) -> None:
    m, cfg = hf.model, model.config
    _put(m.embed_tokens.weight, model.embed.weight)
    dh = cast(int, cfg.d_head)  # resolved by ModelConfig
    q_rows, kv_rows = cfg.n_heads * dh, cfg.n_kv_heads * dh
    for i, (ours, theirs) in enumerate(zip(_blocks(model), m.layers, strict=True)):
        a = theirs.self_attn
        # our fused projection is [q | k | v] along the output dim, head-major, as HF's q/k/v_proj are
        q, k, v = ours.attn.qkv.weight.split([q_rows, kv_rows, kv_rows])
        for proj, w in ((a.q_proj, q), (a.k_proj, k), (a.v_proj, v)):
            _put(proj.weight, w)
        _put(a.o_proj.weight, masked_o_weight(model, i))
        if cfg.attn_bias:
            qb, kb, vb = ours.attn.qkv.bias.split([q_rows, kv_rows, kv_rows])
            for proj, b in ((a.q_proj, qb), (a.k_proj, kb), (a.v_proj, vb), (a.o_proj, ours.attn.o.bias)):
                _put(proj.bias, b)
        _put(theirs.input_layernorm.weight, cast(Norm, ours.ln1).w)
        if cfg.attn_only:  # a zero MLP adds 0.0: its norm's gain is irrelevant, kept at HF's 1
            for param in (theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight, theirs.mlp.down_proj.weight):
                _put(param, None)
            theirs.post_attention_layernorm.weight.fill_(1.0)
            continue
        # SwiGLU (Shazeer 2020): HF down(act(gate x) * up x) is ours w_out(act(w_gate x) * w_in x)
        _put(theirs.mlp.gate_proj.weight, ours.mlp.w_gate.weight)
        _put(theirs.mlp.up_proj.weight, ours.mlp.w_in.weight)
        _put(theirs.mlp.down_proj.weight, ours.mlp.w_out.weight)
        if cfg.mlp_bias:
            _put(theirs.mlp.gate_proj.bias, None)  # ours has no gate bias: zero is the same function
            _put(theirs.mlp.up_proj.bias, ours.mlp.w_in.bias)
            _put(theirs.mlp.down_proj.bias, ours.mlp.w_out.bias)
        _put(theirs.post_attention_layernorm.weight, cast(Norm, ours.ln2).w)
    _put(m.norm.weight, model.ln_final.w)
    if not cfg.tie_embeddings:
        _put(hf.lm_head.weight, model.unembed.weight)


def check_exportable(cfg: ModelConfig, target: Optional[str] = None) -> str:
    """The target :func:`to_hf` exports a model of config ``cfg`` to ("gpt2", "llama" or "marian"), or an
    ``AttnlabError`` naming the first field no target reproduces; reads only the config."""
    if not isinstance(cfg, ModelConfig):
        raise AttnlabTypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    target = _choose(cfg, target)
    if target == "marian":
        check_marian(cast(Seq2SeqConfig, cfg))
    else:
        _check(cfg, target)
    return target


def to_hf(model: Transformer, target: Optional[str] = None) -> Any:
    """A Hugging Face model computing the same logits as ``model``, in eval mode, in its dtype.

    ``target``: "gpt2", "llama" or None (chosen by the positional embedding: absolute -> GPT-2,
    rotary -> Llama). An :class:`~harness.model.seq2seq.EncoderDecoder` goes to a ``MarianMTModel``
    ("marian", the only target for it; what maps and why: :mod:`harness.model.convert.marian`).
    Raises ``AttnlabError`` naming the first config field the target cannot
    reproduce (e.g. ``positional_embedding_type='alibi'``, ``norm_placement='post'``,
    ``attention_dir='bidirectional'``), before any weight is copied (:func:`check_exportable`).
    """
    if not isinstance(model, Transformer):
        raise AttnlabTypeError(f"to_hf expects a harness.Transformer, got {type(model).__name__}")
    cfg = model.config
    target = check_exportable(cfg, target)
    if target == "marian":
        return to_marian(cast(EncoderDecoder, model))
    hf_config = _hf_config(cfg, target)
    # the kernel our unhooked forward runs (eager's explicit softmax differs in the last bits), and the one
    # from_pretrained picks by default, so the export and its reload compute our logits to the bit
    hf_config._attn_implementation = "sdpa"
    with torch.device("cpu"):
        hf = (GPT2LMHeadModel if target == "gpt2" else LlamaForCausalLM)(hf_config)
    hf = hf.to(TORCH_DTYPES[cfg.dtype])
    with torch.no_grad():
        (_gpt2_copy if target == "gpt2" else _llama_copy)(model, hf)
    return hf.eval()
