"""A tiny random model of any model type, built generically from its own config class.

The config class's defaults are the real architecture (often billions of parameters); the shrink
keeps every structural option they declare (layer types, windows, MoE routing, q/k-norm, partial
rotary, soft-caps) and shrinks only sizes, by field name: widths to :data:`WIDTH`, heads to 4
(key/value heads to 2 where the config has grouped heads), layers to 2 or to the shortest prefix
of the layer pattern that keeps one layer of each declared type, vocabulary to :data:`VOCAB` (special
token ids above it are moved into it), context to :data:`CONTEXT` (windows to :data:`WINDOW`),
experts to 4 with top-2. Sub-configs (a multimodal model's text and vision configs, an
encoder-decoder's halves) are shrunk by the same rules. :data:`HAND` holds the few overrides the
generic rules cannot derive, each with why.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
import transformers
from transformers import AutoConfig

WIDTH, HEADS, KV_HEADS, FFN, VOCAB, CONTEXT, WINDOW, EXPERTS, TOP_K = 64, 4, 2, 128, 128, 128, 8, 4, 2
HEAD_DIM = WIDTH // HEADS
SEED = 0
MAX_PARAMS = 20_000_000  # a shrink that leaves this many parameters missed a size field: refused before allocating

_WIDTH = {"hidden_size", "d_model", "n_embd", "dim", "embed_dim", "word_embed_proj_dim", "embedding_size",
          "n_embed", "d_embed", "hidden_dim_model", "projection_dim"}
_HEADS = {"num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads", "encoder_attention_heads",
          "decoder_attention_heads", "num_decoder_attention_heads"}
_KV = {"num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "num_key_value_groups"}
_LAYERS = {"num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers", "num_encoder_layers",
           "decoder_layers", "encoder_layers", "num_hidden_groups"}
_HEAD_DIM = {"head_dim", "d_kv", "kv_channels", "attention_head_size", "head_size", "d_head"}
_FFN = {"intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
        "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size", "expert_intermediate_size",
        "moe_shared_expert_intermediate_size", "intermediate_size_mlp", "dense_intermediate_size"}
_CONTEXT = {"max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "seq_length", "max_sequence_length",
            "max_length", "max_target_positions", "max_source_positions", "original_max_position_embeddings"}
_WINDOW = {"sliding_window", "window_size", "attention_window", "local_window_size", "sliding_window_size"}
_EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"}
_TOP_K = {"num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k", "expert_top_k"}
# MLA (DeepSeek V2/V3): low-rank q/kv and the split of a head into rotary and non-rotary parts
_MLA = {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
        "qk_head_dim": 16}
# per-layer lists (their length is the layer count) shrunk to the kept prefix
_LAYER_LIST = re.compile(r"layer_types|layers_block_type|attention_layers|block_types|layer_pattern")
_TOKEN_ID = re.compile(r"(_token_id|_token_index|_token_ids|_id)$")
_SIZE_WORDS = ("size", "_dim", "rank", "state")
_ROTARY_DIM = {"rotary_dim", "rotary_emb_dim", "rotary_ndims"}

# Overrides the generic rules cannot derive: model_type -> (values, why).
HAND: dict[str, tuple[dict[str, Any], str]] = {}


def _small_id(value: Any, vocab: int) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < vocab:
        return value
    return vocab - 1 - (value % 16)  # distinct ids near the top of the tiny vocabulary


def _prefix_len(types: list, n: int) -> int:
    """The shortest prefix of the layer pattern holding one layer of each type (at least 2 layers)."""
    seen: set = set()
    for i, t in enumerate(types):
        seen.add(str(t))
        if len(seen) == len({str(x) for x in types}):
            return max(2, i + 1)
    return max(2, min(n, len(types)))


def _is_index(key: Any) -> bool:
    return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


def _shrink_value(key: str, value: Any) -> Any:
    """One entry of a per-layer list: sizes shrink as the scalar field would, anything else is kept."""
    if isinstance(value, int) and not isinstance(value, bool) and key in _FFN:
        return FFN
    if isinstance(value, int) and not isinstance(value, bool) and key in _HEADS:
        return min(value, HEADS)
    if isinstance(value, int) and not isinstance(value, bool) and key in _KV:
        return min(value, KV_HEADS)
    return value


def shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` (a config's ``to_dict()``) with sizes shrunk and structure kept; nested configs likewise."""
    out = dict(d)
    n_old = next((v for k, v in d.items() if k in _LAYERS and isinstance(v, int)), None)
    lists = {k: v for k, v in d.items() if _LAYER_LIST.search(k) and isinstance(v, list) and v}
    n_new = 2
    for v in lists.values():
        n_new = max(n_new, _prefix_len(v, n_old or len(v)))
    heads = d.get("num_attention_heads", HEADS)
    for key, value in d.items():
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            out[key] = shrink_dict(value)
            continue
        if isinstance(value, bool):
            continue
        if key in lists or (isinstance(value, list) and n_old and len(value) == n_old):
            out[key] = [_shrink_value(key, v) for v in value[:n_new]]
        elif isinstance(value, dict) and value and all(_is_index(k) for k in value):
            out[key] = {k: v for k, v in value.items() if int(k) < n_new}  # per-layer settings keyed by index
        elif not isinstance(value, int):
            continue
        elif key in _WIDTH:
            out[key] = WIDTH
        elif key in _HEADS:
            out[key] = min(value, HEADS)
        elif key in _KV:
            out[key] = value if value <= 1 else (KV_HEADS if isinstance(heads, int) and value < heads else HEADS)
        elif key in _LAYERS:
            out[key] = min(value, n_new)
        elif key in _HEAD_DIM:
            # MLA: the head_dim field is the rotary part of a head
            out[key] = _MLA["qk_rope_head_dim"] if "qk_rope_head_dim" in d else HEAD_DIM
        elif key in _ROTARY_DIM:
            out[key] = min(value, HEAD_DIM // 2)
        elif key in _FFN:
            out[key] = FFN
        elif key in _CONTEXT:
            out[key] = min(value, CONTEXT)
        elif key in _WINDOW:
            out[key] = min(value, WINDOW)
        elif key in _EXPERTS:
            out[key] = min(value, EXPERTS)
        elif key in _TOP_K:
            out[key] = min(value, TOP_K)
        elif key in _MLA:
            out[key] = _MLA[key]
        elif "vocab_size" in key and key != "type_vocab_size":
            out[key] = min(value, VOCAB)
        elif key in ("n_group", "topk_group", "first_k_dense_replace"):
            out[key] = min(value, 1)
        elif key.endswith("sparse_step"):
            # every n-th layer routes through experts (NLLB-MoE's default 4, Switch's derived step): kept at n the
            # 2 shrunk layers hold no expert layer, and the census never meets the router; 1: every layer does
            out[key] = min(value, 1)
        elif key.startswith("num_sparse_") and key.endswith("_layers"):
            out[key] = min(value, n_new)  # Switch: sparse layers per stack, at most the stack's shrunk depth
        elif key.endswith("_period"):
            out[key] = min(value, 2)
        elif key.endswith("_offset") and key.startswith(("attn_", "expert_")):
            out[key] = min(value, 1)
        elif value > 64 and any(w in key for w in _SIZE_WORDS) and not _TOKEN_ID.search(key):
            out[key] = WIDTH
    vocab = out.get("vocab_size")
    if isinstance(vocab, int):
        for key, value in d.items():
            if _TOKEN_ID.search(key):
                out[key] = [_small_id(v, vocab) for v in value] if isinstance(value, list) else _small_id(value, vocab)
    return out


def tiny_config(model_type: str, class_name: str = "") -> Any:
    """The shrunk config of ``model_type`` for the head ``class_name`` (its own config class; defaults kept where
    structural)."""
    config_class = getattr(transformers, class_name).config_class if class_name else None
    default = config_class() if config_class is not None else AutoConfig.for_model(model_type)
    values = changes(default.to_dict(), model_type)
    if class_name.endswith(("ForCausalLM", "LMHeadModel")) and getattr(default, "is_decoder", None) is False:
        # a BERT-style stack under a causal-LM head is a decoder only with is_decoder=True (transformers warns
        # "add is_decoder=True" and runs it bidirectionally otherwise): the head declares the design
        values["is_decoder"] = True
    return type(default)(**values)


def changes(d: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The constructor arguments of the tiny config: only what the shrink changed (nested: likewise)."""
    new = shrink_dict(d)
    out = {k: (changes(d[k], "") if isinstance(v, dict) and isinstance(d.get(k), dict) and "model_type" in v else v)
           for k, v in new.items() if v != d.get(k)}
    if out and "model_type" in d and not model_type:  # a nested config is rebuilt from its model_type
        out["model_type"] = d["model_type"]
    out.update(HAND.get(model_type, ({}, ""))[0])
    return out


def build(model_type: str, class_name: str, config: Any = None) -> torch.nn.Module:
    """The tiny random ``class_name`` model of ``model_type`` (of ``config`` when given: a drawn variant of the
    tiny config, reports/census/variants.py), seeded, float32, in eval mode."""

    cls = getattr(transformers, class_name)
    config = tiny_config(model_type, class_name) if config is None else config
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            n = sum(p.numel() for p in cls._from_config(config, dtype=torch.float32).parameters())
        if n > MAX_PARAMS:
            raise TooLarge(f"{model_type}: the shrunk config still has {n:,} parameters (expected <= {MAX_PARAMS:,}): "
                           "a size field the shrink does not know")
        model = cls._from_config(config, dtype=torch.float32)
    return model.eval()


class TooLarge(Exception):
    """The generic shrink left a model too large to build in a census worker."""
