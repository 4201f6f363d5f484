"""Configuration variants: a hypothesis strategy over the fields of a model type's own config class.

The census builds one shrunk config per model type (reports/census/shrink.py); a correct model configured the
way people ship it (another rope_type, a window, grouped heads, special ids inside the vocabulary) can still draw
a false alarm that the one shrunk config never meets. :func:`overrides` draws changes to the shrunk config, only
in fields the config class has: the keys of its own ``to_dict()`` (its ``__init__`` defaults, shrunk), so a
knob the class does not declare is never passed. Sizes stay tiny: head counts, widths and windows are drawn from
small sets. Every knob is drawn present or absent by a boolean first, so hypothesis shrinks a drawn dict towards
``{}``, the shrunk default itself.

:func:`draw` takes ``n`` distinct dicts per model type, seeded (the census seed and the type's name), so the same
seed draws the same configs on every machine. The knobs and what each needs are in :data:`BOOL_KNOBS`,
:data:`VALUE_KNOBS` and :func:`_rope` (the rope types of transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS,
each with the keys its ``_validate_<type>_rope_parameters`` requires).
"""

from __future__ import annotations

import copy
import json
import zlib
from typing import Any, Optional

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from reports.census import shrink

# On/off fields people set: attention and MLP biases, q/k norm, tied embeddings, parallel residual, pre/post norm,
# multi-query and the attention-scale switches (GPT-2, BART), interleaved rotary (DeepSeek-V3), ALiBi (Falcon).
BOOL_KNOBS = ("attention_bias", "mlp_bias", "use_qkv_bias", "bias", "enable_bias", "no_bias", "add_bias_linear",
              "add_qkv_bias", "qkv_bias", "use_bias", "qk_layernorm", "qk_norm", "use_qk_norm", "tie_word_embeddings",
              "parallel_attn", "use_parallel_residual", "parallel_residual", "new_decoder_architecture", "multi_query",
              "do_layer_norm_before", "apply_residual_connection_post_layernorm", "normalize_before",
              "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "scale_embedding",
              "rope_interleave", "alibi")
# Numeric fields people set, each with the values drawn: soft caps (Gemma 2), Gemma's query_pre_attn_scalar,
# Cohere's logit_scale, Granite's multipliers, partial rotary (GPT-NeoX's rotary_pct).
VALUE_KNOBS: dict[str, tuple[Any, ...]] = {
    "attn_logit_softcapping": (None, 5.0, 50.0),
    "final_logit_softcapping": (None, 3.0, 30.0),
    "query_pre_attn_scalar": (16, 24, 256),
    "logit_scale": (0.0625, 1.0),
    "attention_multiplier": (0.015625, 0.25, 1.0),
    "embedding_multiplier": (1.0, 12.0),
    "residual_multiplier": (0.22, 1.0),
    "logits_scaling": (1.0, 8.0),
    "rotary_pct": (0.25, 0.5, 1.0),
}
WINDOWS = (2, 3, 4, 8, 16, 4096)  # 4096: a shipped window far past the tiny context (Gemma 2, Mistral)
WINDOW_FIELDS = ("sliding_window", "window_size")
HEADS = (1, 2, 3, 4, 5, 6, 8)  # 3, 5, 6: no power of two (ALiBi's slopes interpolate there, Press et al. 2022 §3)
HEAD_SIZES = (8, 16, 32)  # even: rotary pairs features
HEAD_DIMS = (8, 16, 24, 32)  # an explicit head_dim, independent of hidden_size / heads
ROPE_TYPES = ("default", *sorted(ROPE_INIT_FUNCTIONS))
THETAS = (10000.0, 500000.0, 1000000.0)
PARTIAL = (0.25, 0.5, 1.0)
_WIDTH_FIRST = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim")
_HEAD_DIM_FIELDS = ("head_dim", "d_kv", "kv_channels", "attention_head_size", "head_size", "d_head")
_HEAD_FIELDS = [f for f in shrink._HEADS if f != "num_decoder_attention_heads"]
_EMBED_PROJ = ("word_embed_proj_dim", "embedding_size")
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
_TYPES = ("full_attention", "sliding_attention")


def _present(d: dict[str, Any], names: Any) -> list[str]:
    return [n for n in names if n in d]


def _int_field(d: dict[str, Any], names: Any) -> Optional[str]:
    return next((n for n in names if isinstance(d.get(n), int) and not isinstance(d.get(n), bool)), None)


def _layers(d: dict[str, Any]) -> int:
    field = _int_field(d, sorted(shrink._LAYERS))
    types = d.get("layer_types")
    return len(types) if isinstance(types, list) and types else (d[field] if field else 2)


@st.composite
def _heads(draw: Any, d: dict[str, Any]) -> dict[str, Any]:
    """Head count, head size and key/value heads, kept consistent: without an explicit head_dim field the width is
    heads x head size; with one, head_dim is drawn apart from it (Gemma's 256 against 3072 / 16)."""
    heads_fields = [f for f in _HEAD_FIELDS if isinstance(d.get(f), int) and not isinstance(d.get(f), bool)]
    width = _int_field(d, _WIDTH_FIRST)
    if not heads_fields or width is None or "qk_rope_head_dim" in d:  # MLA's head split is shrink's _MLA
        return {}
    out: dict[str, Any] = {}
    heads = draw(st.sampled_from(HEADS))
    head_dim_field = _int_field(d, _HEAD_DIM_FIELDS)
    if head_dim_field is not None:
        size = draw(st.sampled_from(HEAD_DIMS))
        out[head_dim_field] = size
        if d[width] % heads:
            out[width] = heads * size
    else:
        size = draw(st.sampled_from(HEAD_SIZES))
        out[width] = heads * size
    out.update({f: heads for f in heads_fields})
    kv = _int_field(d, sorted(shrink._KV))
    if kv is not None and kv != "num_key_value_groups":
        # grouped (a proper divisor), multi-query (1) or one K/V head per query head (Ainslie et al. 2023)
        out[kv] = draw(st.sampled_from(sorted({1, heads, *(k for k in range(2, heads) if heads % k == 0)})))
    for field in ("rotary_dim", "rotary_emb_dim"):
        if isinstance(d.get(field), int):
            out[field] = draw(st.sampled_from(sorted({max(2, size // 4) // 2 * 2, size // 2, size})))
    return out


def _rope_dict(draw: Any, d: dict[str, Any], current: dict[str, Any], max_pos: int) -> dict[str, Any]:
    """One rope_parameters dict: a rope_type with the keys transformers' validator for it requires."""
    kind = draw(st.sampled_from(ROPE_TYPES))
    out: dict[str, Any] = {"rope_type": kind, "rope_theta": draw(st.sampled_from(THETAS))}
    if "partial_rotary_factor" in current:
        out["partial_rotary_factor"] = draw(st.sampled_from(PARTIAL))
    factor = draw(st.sampled_from((2.0, 4.0)))
    # the context the model was trained on before the extension: a few tokens, so the checks' inputs cross it
    original = draw(st.sampled_from((4, 8, max_pos // 2)))
    if kind in ("linear", "dynamic"):
        out["factor"] = factor
    elif kind == "yarn":
        # factor = the extended context over the original one, as the validator expects (no mismatch warning)
        out.update(factor=max_pos / original, original_max_position_embeddings=original)
        if draw(st.booleans()):
            out.update(beta_fast=draw(st.sampled_from((16.0, 32.0))), beta_slow=1.0)
    elif kind == "longrope":
        head_dim = d.get("head_dim") or d[_int_field(d, _WIDTH_FIRST) or "hidden_size"] // d["num_attention_heads"]
        half = int(head_dim * out.get("partial_rotary_factor", 1.0)) // 2
        short = draw(st.sampled_from((1.0, 1.5)))
        out.update(factor=max_pos / original, original_max_position_embeddings=original,
                   short_factor=[short] * half, long_factor=[short * factor] * half)
    elif kind == "llama3":
        out.update(factor=draw(st.sampled_from((8.0, 32.0))), low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=min(original, max_pos - 1))
    return out


@st.composite
def overrides(draw: Any, d: dict[str, Any]) -> dict[str, Any]:
    """Changes to ``d`` (a shrunk config's ``to_dict()``), each knob drawn only where ``d`` has the field."""
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out.update(draw(_heads(d)))
    view = {**d, **out}
    n = _layers(d)
    for field in _present(d, WINDOW_FIELDS):
        if not isinstance(d[field], bool) and draw(st.booleans()):
            out[field] = draw(st.sampled_from(WINDOWS))
    if "use_sliding_window" in d and draw(st.booleans()):
        out["use_sliding_window"] = draw(st.booleans())
    if isinstance(d.get("max_window_layers"), int) and draw(st.booleans()):
        out["max_window_layers"] = draw(st.integers(0, n))
    types = d.get("layer_types")
    if isinstance(types, list) and types and draw(st.booleans()):
        kinds = sorted({str(t) for t in types} | (set(_TYPES) if "sliding_window" in d else set()))
        out["layer_types"] = draw(st.lists(st.sampled_from(kinds), min_size=len(types), max_size=len(types)))
    sliding = "sliding_attention" in out.get("layer_types", ()) or out.get("use_sliding_window") is True
    if sliding and "sliding_window" in d:
        # a sliding layer needs its window, and Qwen's configs drop the window unless use_sliding_window: a config
        # people ship sets both (else transformers fails on a None window, a refusal that says nothing)
        if {**d, **out}.get("sliding_window") is None:
            out["sliding_window"] = draw(st.sampled_from(WINDOWS))
        if "use_sliding_window" in d:
            out["use_sliding_window"] = True
    rope = d.get("rope_parameters")
    if isinstance(rope, dict) and rope and draw(st.booleans()):
        max_pos = int(d.get("max_position_embeddings") or shrink.CONTEXT)
        if all(isinstance(v, dict) for v in rope.values()):  # per layer type (Gemma 3, ModernBERT, Olmo 3)
            out["rope_parameters"] = {k: _rope_dict(draw, view, v, max_pos) for k, v in rope.items()}
        else:
            out["rope_parameters"] = _rope_dict(draw, view, rope, max_pos)
    for field in _present(d, BOOL_KNOBS):
        if isinstance(d[field], bool) and draw(st.booleans()):
            out[field] = not d[field]
    for field, values in VALUE_KNOBS.items():
        if field in d and draw(st.booleans()):
            out[field] = draw(st.sampled_from(values))
    width = view.get(_int_field(view, _WIDTH_FIRST) or "", None)
    for field in _present(d, _EMBED_PROJ):  # an embedding narrower than the residual stream, projected up (OPT, ALBERT)
        if isinstance(d[field], int) and isinstance(width, int) and draw(st.booleans()):
            out[field] = draw(st.sampled_from((width, max(8, width // 2))))
    vocab = d.get("vocab_size")
    for field in _present(d, _TOKEN_IDS):  # special ids inside the vocabulary, as shipped (GLM: pad 0, bos 2, eos 1)
        if isinstance(vocab, int) and draw(st.booleans()):
            out[field] = draw(st.sampled_from((None, 0, 1, 2, vocab - 1)))
    return out


def type_seed(model_type: str, seed: int) -> int:
    """The hypothesis seed of one model type: the census seed and the type's name (adding a type changes no other
    type's draws)."""
    return zlib.crc32(f"{seed}:{model_type}".encode())


def base_dict(model_type: str, class_name: str) -> dict[str, Any]:
    """The shrunk config's ``to_dict()``: the fields the config class has, at the census's tiny sizes."""
    return shrink.tiny_config(model_type, class_name).to_dict()


def draw(model_type: str, class_name: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` distinct override dicts for ``model_type`` (fewer only where its fields allow fewer), in draw order.

    A @given run of hypothesis at a fixed seed, generation only (no database, no shrinking), collecting each
    distinct draw and stopped by :class:`_Enough` at the ``n``-th: the same seed draws the same list, and the
    first ``k`` of ``n`` draws are the draws of ``k``.
    """
    d = base_dict(model_type, class_name)
    found: dict[str, dict[str, Any]] = {}

    @settings(max_examples=n * 20, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @hypothesis_seed(type_seed(model_type, seed))
    @given(overrides(d))
    def collect(o: dict[str, Any]) -> None:
        found.setdefault(json.dumps(o, sort_keys=True), o)
        if len(found) >= n:
            raise _Enough()

    try:
        collect()
    except _Enough:
        pass
    return list(found.values())


class _Enough(Exception):
    """Ends :func:`draw`'s generation once it holds its ``n`` configs."""


def build_config(model_type: str, class_name: str, changes: dict[str, Any]) -> Any:
    """The shrunk config of ``model_type`` with ``changes`` applied (its own config class, which may refuse)."""
    default = shrink.tiny_config(model_type, class_name)
    # a copy: config classes standardize nested dicts in place (rope_parameters.setdefault ...), and the drawn
    # changes are the job's identity
    values = {**shrink.changes(type(default)().to_dict(), model_type), **copy.deepcopy(changes)}
    if getattr(default, "is_decoder", None) is True and "is_decoder" not in values:
        values["is_decoder"] = True  # the causal-LM head's declaration (shrink.tiny_config)
    return type(default)(**values)
