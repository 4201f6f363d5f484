"""Import weights from Hugging Face GPT-2 and Llama models into a :class:`harness.Transformer`.

A converted model is the project's independent reference: Hugging Face computes the same
function with code we did not write, so equal logits, residual streams and attention
patterns check our embedding, attention, MLP, norms and positions at once.

Every config option is checked before any weight is copied; an option our model cannot
reproduce exactly raises ``AttnlabError`` instead of giving a model that silently differs.
Nothing here touches the network: the Hugging Face model is already in memory.

The designs :func:`harness.model.convert.to_hf` writes as weights come back as designs: MLPs whose
weights are all zero add exactly nothing, so the model is attention-only; a GPT-2 position table of
zeros is no positions, one equal to our sinusoids is sinusoidal positions. A round trip therefore
gives back the same config and the same weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from transformers import GPT2LMHeadModel, LlamaForCausalLM, MarianMTModel

from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.config import ModelConfig
from harness.model.convert.marian import from_marian
from harness.model.layers import Block, Norm
from harness.model.positions import sinusoidal_table
from harness.model.transformer import TORCH_DTYPES, Transformer

SUPPORTED = ("GPT2LMHeadModel", "LlamaForCausalLM", "MarianMTModel")

# Hugging Face ACT2FN names -> ours. "gelu" is the exact erf GELU; "gelu_new" and
# "gelu_pytorch_tanh" are both the tanh approximation GPT-2 was trained with (Hendrycks &
# Gimpel 2016 §2); "swish" is SiLU (Ramachandran et al. 2017).
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new",
         "relu": "relu", "silu": "silu", "swish": "silu"}


def from_hf(hf_model: Any) -> Transformer:
    """A :class:`Transformer` computing the same function as ``hf_model``, in eval mode.

    Supports ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` (subclasses included), and
    ``MarianMTModel``, which gives an :class:`~harness.model.seq2seq.EncoderDecoder`
    (:mod:`harness.model.convert.marian`). The result is float32, or float64 when the Hugging Face
    model is float64 (half-precision weights are upcast, so the result is at least as precise as the source).
    """
    if not isinstance(hf_model, nn.Module):
        raise AttnlabTypeError(f"from_hf expects a Hugging Face nn.Module, got {type(hf_model).__name__}")
    if isinstance(hf_model, MarianMTModel):
        params = list(hf_model.parameters())
        return from_marian(hf_model, "float64" if params and params[0].dtype == torch.float64 else "float32")
    builders: dict[type, tuple[Callable, Callable]] = {
        GPT2LMHeadModel: (_gpt2_config, _gpt2_copy),
        LlamaForCausalLM: (_llama_config, _llama_copy),
    }
    found = [pair for hf_class, pair in builders.items() if isinstance(hf_model, hf_class)]
    if not found:
        raise AttnlabError(f"from_hf does not support {type(hf_model).__name__}: expected one of {list(SUPPORTED)}")
    make_config, copy_weights = found[0]

    params = list(hf_model.parameters())
    dtype = "float64" if params and params[0].dtype == torch.float64 else "float32"
    cfg = make_config(hf_model.config, dtype)
    cfg = cfg.replace(**_designs_in_weights(hf_model, cfg))
    _check_tied(hf_model, cfg)
    model = Transformer(cfg)
    with torch.no_grad():
        copy_weights(hf_model, model)
    return model.eval()


# --- shared helpers ------------------------------------------------------------------------

def _refuse(name: str, value: Any, expected: str) -> AttnlabError:
    return AttnlabError(f"from_hf: config.{name}={value!r} cannot be reproduced: expected {expected}")


def _act(name: str, value: Any) -> str:
    if value not in _ACTS:
        raise _refuse(name, value, f"one of {sorted(_ACTS)}")
    return _ACTS[value]


def _init_range(config: Any) -> dict:
    # Only recorded in our config (weights are overwritten); our config requires > 0.
    r = getattr(config, "initializer_range", None)
    return {"init_range": float(r)} if isinstance(r, (int, float)) and r > 0 else {}


def _mlp_params(hf_model: Any) -> list[Tensor]:
    if hasattr(hf_model, "transformer"):  # GPT-2
        return [p for block in hf_model.transformer.h for p in block.mlp.parameters()]
    return [p for layer in hf_model.model.layers for p in layer.mlp.parameters()]


def _designs_in_weights(hf_model: Any, cfg: ModelConfig) -> dict[str, Any]:
    """Config changes that weights written by to_hf imply (see the module docstring)."""
    changes: dict[str, Any] = {}
    if all(not p.any() for p in _mlp_params(hf_model)):
        changes.update(attn_only=True, d_mlp=None)  # d_mlp: unused, back to its default
    if hasattr(hf_model, "transformer"):
        wpe = hf_model.transformer.wpe.weight.detach()
        if not wpe.any():
            changes["positional_embedding_type"] = "none"
        elif cfg.d_model % 2 == 0:
            dtype = TORCH_DTYPES[cfg.dtype]
            table = sinusoidal_table(torch.arange(wpe.shape[0], device=wpe.device), cfg.d_model, dtype=dtype)
            if torch.equal(wpe.to(dtype), table):
                changes["positional_embedding_type"] = "sinusoidal"
    return changes


def _check_tied(hf_model: Any, cfg: ModelConfig) -> None:
    """Tied config but different matrices (or an unembed bias) would be silently wrong."""
    head = hf_model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise AttnlabError("from_hf: lm_head has a bias: expected an unbiased unembedding (ours has none)")
    if cfg.tie_embeddings and not torch.equal(head.weight, hf_model.get_input_embeddings().weight):
        raise AttnlabError("from_hf: config.tie_word_embeddings=True but lm_head.weight differs from the "
                           "token embedding: expected tied (identical) matrices")



def _blocks(model: Transformer) -> Sequence[Block]:
    # typed view of the ModuleList (iterating an nn.ModuleList yields plain Modules)
    return cast(Sequence[Block], model.blocks)

def _put(dst: Tensor, src: Tensor) -> None:
    if dst.shape != src.shape:
        raise AttnlabError(f"from_hf: a weight of shape {tuple(src.shape)} does not fit ours {tuple(dst.shape)}: "
                           "expected the shapes the model config implies")
    dst.copy_(src.detach().to(dtype=dst.dtype, device=dst.device))


def _unembed(hf_model: Any, model: Transformer) -> None:
    if not model.config.tie_embeddings:  # tied: our unembed already shares the embedding
        _put(model.unembed.weight, hf_model.get_output_embeddings().weight)


# --- GPT-2 (Radford et al. 2019) -----------------------------------------------------------

def _gpt2_config(c: Any, dtype: str) -> ModelConfig:
    if c.scale_attn_by_inverse_layer_idx:
        raise _refuse("scale_attn_by_inverse_layer_idx", True,
                      "False (our attention scale is the same in every layer)")
    if c.add_cross_attention:
        raise _refuse("add_cross_attention", True, "False (we build decoder-only models, no cross-attention)")
    # reorder_and_upcast_attn only changes the order and precision of QK^T*scale and the
    # softmax under mixed precision; in float32/float64 it is the same function, so it is accepted.
    return ModelConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
        d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn=_act("activation_function", c.activation_function),
        normalization_type="LN", positional_embedding_type="standard",
        use_attn_scale=bool(c.scale_attn_weights), tie_embeddings=bool(c.tie_word_embeddings),
        attn_bias=True, mlp_bias=True, eps=float(c.layer_norm_epsilon), dtype=dtype, **_init_range(c))


def _gpt2_copy(hf: Any, model: Transformer) -> None:
    t = hf.transformer
    _put(model.embed.weight, t.wte.weight)
    if model.config.positional_embedding_type == "standard":
        _put(model.pos_embed.weight, t.wpe.weight)
    for ours, theirs in zip(_blocks(model), t.h, strict=True):
        # HF's Conv1D stores weights [in, out] (x @ W); nn.Linear stores [out, in].
        # c_attn's output columns are [q | k | v], each head-major: our fused qkv layout.
        pairs = [(ours.attn.qkv, theirs.attn.c_attn), (ours.attn.o, theirs.attn.c_proj)]
        norms = [(cast(Norm, ours.ln1), theirs.ln_1)]
        if not model.config.attn_only:
            pairs += [(ours.mlp.w_in, theirs.mlp.c_fc), (ours.mlp.w_out, theirs.mlp.c_proj)]
            norms.append((cast(Norm, ours.ln2), theirs.ln_2))
        for linear, conv in pairs:
            _put(linear.weight, conv.weight.T)
            _put(linear.bias, conv.bias)
        for norm, ln in norms:
            _put(norm.w, ln.weight)
            _put(norm.b, ln.bias)
    _put(model.ln_final.w, t.ln_f.weight)
    _put(model.ln_final.b, t.ln_f.bias)
    _unembed(hf, model)


# --- Llama (Touvron et al. 2023) -----------------------------------------------------------

def _llama_config(c: Any, dtype: str) -> ModelConfig:
    rope = dict(c.rope_parameters or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise _refuse("rope_parameters['rope_type']", rope_type,
                      "'default' (plain RoPE; scaled variants such as linear/dynamic/yarn/llama3 are not implemented)")
    if "rope_theta" not in rope:
        raise _refuse("rope_parameters", rope, "a dict with 'rope_theta' (the RoPE base)")
    if c.mlp_bias:
        raise _refuse("mlp_bias", True, "False (our gated MLP has no bias on its gate projection)")
    return ModelConfig(
        n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads, d_head=c.head_dim,
        d_mlp=c.intermediate_size, d_vocab=c.vocab_size, n_ctx=c.max_position_embeddings,
        act_fn=_act("hidden_act", c.hidden_act), gated_mlp=True, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_base=float(rope["rope_theta"]),
        tie_embeddings=bool(c.tie_word_embeddings), n_key_value_heads=c.num_key_value_heads,
        attn_bias=bool(c.attention_bias), mlp_bias=False, eps=float(c.rms_norm_eps), dtype=dtype,
        **_init_range(c))


def _llama_copy(hf: Any, model: Transformer) -> None:
    m = hf.model
    _put(model.embed.weight, m.embed_tokens.weight)
    for ours, theirs in zip(_blocks(model), m.layers, strict=True):
        a = theirs.self_attn
        # Our fused projection is [q | k | v] along the output dim, each head-major, as HF's
        # q_proj/k_proj/v_proj outputs are; HF Llama's rotate-half pairing is ours, so no permutation.
        _put(ours.attn.qkv.weight, torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)))
        _put(ours.attn.o.weight, a.o_proj.weight)
        if model.config.attn_bias:
            _put(ours.attn.qkv.bias, torch.cat((a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)))
            _put(ours.attn.o.bias, a.o_proj.bias)
        _put(cast(Norm, ours.ln1).w, theirs.input_layernorm.weight)
        if model.config.attn_only:
            continue
        # SwiGLU (Shazeer 2020): down(act(gate x) * up x); ours is w_out(act(w_gate x) * w_in x).
        _put(ours.mlp.w_gate.weight, theirs.mlp.gate_proj.weight)
        _put(ours.mlp.w_in.weight, theirs.mlp.up_proj.weight)
        _put(ours.mlp.w_out.weight, theirs.mlp.down_proj.weight)
        _put(cast(Norm, ours.ln2).w, theirs.post_attention_layernorm.weight)
    _put(model.ln_final.w, m.norm.weight)
    _unembed(hf, model)
