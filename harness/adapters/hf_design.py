"""The declared design of a Hugging Face model, read off its config and modules (``HFAdapter.cfg``).

Fills :class:`~harness.adapters.design_facts.AdapterConfig`: the protocol fields and the design
facts (documented there) where a model departs from the textbook attention of Vaswani et al. 2017,
so that the property checks follow what the model declares instead of one formula. Values are read
from the attention modules where the modeling code keeps them (``module.scaling``,
``module.sliding_window``, ``module.rotary_ndims`` ...), from the config otherwise; a fact the
model does not have is None.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from typing import Any, Optional, cast

import torch
from torch import nn

from harness.adapters import hf_routes as routes
from harness.adapters import source_text
from harness.adapters.design_facts import AdapterConfig
from harness.adapters.hf_positions import falcon_alibi_slopes, length_dependence
from harness.errors import AttnlabTypeError
from harness.oracle import usable_context

# Architectures whose ALiBi bias is slope * key_index (Bloom's build_alibi_tensor, Falcon's copy
# of it, MPT's slope * (key - last)): it differs from Press et al.'s slope * (key - query) by a
# per-query constant, which softmax cannot see.
_ABSOLUTE_KEY_ALIBI = ("bloom", "falcon", "mpt")
# Learned position tables whose first real row is not 0 (fairseq's padding convention).
_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert", "xmod", "roberta-prelayernorm", "data2vec-text")
# rope_type declared where the rotary bases differ by layer type (no single base to check against)
PER_LAYER_TYPE = "per_layer_type"
# GPT-Neo computes raw q.k (no 1/sqrt(d_head)): its attention modules keep no scale attribute.
_UNSCALED = ("gpt_neo",)


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _int(config: Any, *names: str) -> Optional[int]:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _rope(config: Any, types: Optional[set] = None) -> dict:
    """The config's rope_parameters; keyed by layer type (Olmo 3, ModernBERT, Mellum, Ergo), the one shared by every
    type, or, where the types differ (160000 for full attention, 10000 for sliding), no base and a non-default
    rope_type: one declared base would be wrong for some layers. ``types``: the layer types of the checked layers (only
    those types' parameters matter: Laguna's tiny stack is all full attention)."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        return {}
    if params and all(v is None or isinstance(v, dict) for v in params.values()) and any(params.values()):
        # a type keyed to None has no rotation (Ergo's full-attention layers): only the rotated types' parameters
        rotated = {k: v for k, v in params.items() if v is not None}
        kinds = [v for k, v in rotated.items() if not types or k in types] or list(rotated.values())
        return kinds[0] if all(k == kinds[0] for k in kinds) else {"rope_type": PER_LAYER_TYPE}
    return params


def _modeling_module(attn: Optional[nn.Module]) -> Any:
    return sys.modules.get(type(attn).__module__) if attn is not None else None


def positional_type(config: Any, hf_model: nn.Module, attn: Optional[nn.Module]) -> str:
    """Which positional scheme the model uses, from its config and modeling code."""
    arch = getattr(config, "model_type", "")
    if arch == "bloom" or (arch == "falcon" and getattr(config, "alibi", False)):
        return "alibi"
    if arch == "mpt" and getattr(getattr(config, "attn_config", None), "alibi", False):
        return "alibi"
    module = _modeling_module(attn)
    if module is not None and calls(module, "apply_rotary_pos_emb"):
        return "rotary"
    # a rotary module under another helper's name (Qwen3-ASR, OmniASR): rotary, though its rot hooks may not fire
    if any("Rotary" in type(sub).__name__ for sub in hf_model.modules()):
        return "rotary"
    if _sinusoidal_rotary(attn):
        return "rotary"
    for sub in hf_model.modules():
        if "Sinusoidal" in type(sub).__name__ or _sinusoid_buffer(sub):
            return "sinusoidal"
    if position_embedding_module(hf_model) is not None:
        return "standard"
    return "none"


def _sinusoid_buffer(sub: nn.Module) -> bool:
    """CTRL keeps its table as a buffer, ``pos_encoding`` (modeling_ctrl.py ``positional_encoding``: the sines and
    cosines of Vaswani et al. 2017 §3.5), indexed by position_ids and added to the embeddings: fixed, not learned."""
    return any(name == "pos_encoding" for name, _ in sub.named_buffers(recurse=False))


def _decoder_masked_causally(attn: nn.Module) -> bool:
    """A decoder's self-attention (``is_decoder=True``) left at ``is_causal=False`` in a modeling file whose stack
    masks with ``create_causal_mask`` (BigBirdPegasus, PEGASUS-X: the flag is only read by the sdpa/flash kernels
    when no mask is passed, and these run eager): the mask the model builds is causal, and so is the design."""
    module = _modeling_module(attn)
    return getattr(attn, "is_decoder", False) is True and module is not None and calls(module, "create_causal_mask")


def calls(module: Any, name: str) -> bool:
    """Whether the modeling file calls ``name`` (Jamba and Nemotron-H copy apply_rotary_pos_emb but never call it:
    they have no positions in attention)."""
    if not hasattr(module, name):
        return False
    try:
        source = source_text.source(module)
    except (OSError, TypeError):
        return True
    return source.count(f"{name}(") > source.count(f"def {name}(")


def _sinusoidal_rotary(attn: Optional[nn.Module]) -> bool:
    """RoFormer (Su et al. 2021, the RoPE paper's model): its sinusoidal table gives the angles of a rotation
    applied to q and k inside attention (``apply_rotary_position_embeddings``), nothing is added to the residual."""
    return attn is not None and callable(getattr(attn, "apply_rotary_position_embeddings", None))


def _rotary_style(module: Any, attn: Optional[nn.Module]) -> str:
    """"interleaved" (pairs (2i, 2i+1): GPT-J's rotate_every_two, Cohere's and RoFormer's ``x[..., ::2]``) or "half"."""
    if module is not None and hasattr(module, "rotate_every_two"):
        return "interleaved"
    # Llama 4 turns (x_2i, x_2i+1) as one complex number (torch.view_as_complex): interleaved pairs
    complex_rope = getattr(module, "apply_rotary_emb", None) if module is not None else None
    if complex_rope is not None and "view_as_complex" in source_text.source(complex_rope):
        return "interleaved"
    if _sinusoidal_rotary(attn):
        return "interleaved"
    try:
        source = source_text.source(module.rotate_half) if module is not None and hasattr(module, "rotate_half") else ""
    except (OSError, TypeError):
        source = ""
    return "interleaved" if "::2]" in source else "half"


def position_embedding_module(hf_model: nn.Module) -> Optional[nn.Module]:
    """The learned (or sinusoidal) position table module, if the model has one outside attention."""
    for name, sub in hf_model.named_modules():
        if name.rsplit(".", 1)[-1] in ("wpe", "embed_positions", "position_embeddings", "positions_embed") and \
                isinstance(sub, nn.Module) and "Rotary" not in type(sub).__name__:
            return sub
    return None


def query_prescale(attn: Optional[nn.Module]) -> Optional[float]:
    """The factor a module multiplies q by before its attention function, which it then calls with scaling=1.0.

    OPT (and Whisper-style modules) compute ``q_proj(x) * self.scaling`` and pass ``scaling=1.0``
    to the kernel, "to follow the original implementation" (modeling_opt.py). The q the kernel
    gets, which is what ``hook_q`` sees, is then already scaled: the scale the scores apply to it
    is 1.0. Read off the module's forward source; None when the module does not do this.
    """
    try:
        source = source_text.source(type(attn).forward) if attn is not None else ""
    except (OSError, TypeError):
        return None
    value = getattr(attn, "scaling", None)
    if "scaling=1.0" in source and re.search(r"_proj\([^)]*\)\s*\*\s*self\.scaling", source) and \
            isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _scale(arch: str, attn: Optional[nn.Module], d_head: int) -> float:
    if arch in _UNSCALED or query_prescale(attn) is not None:
        return 1.0
    for name in ("scaling", "inv_norm_factor", "softmax_scale", "scale_attn"):
        value = getattr(attn, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    # OpenAI GPT keeps a bool ``scale``; most others scale by 1/sqrt(d_head) (Vaswani et al. eq. 1)
    if getattr(attn, "scale", True) is False:
        return 1.0
    return 1.0 / math.sqrt(d_head)


def _sliding(config: Any, attn: Optional[nn.Module], layer: int) -> Optional[int]:
    # Where the config keys layers by "sliding_attention" / "full_attention", the model picks each layer's
    # mask by that type, and masking_utils builds the sliding one from config.sliding_window: that is the
    # window the eager and sdpa masks apply. The module's own sliding_window is the flash-attention kwarg,
    # which need not be the same number: Exaone 4 and Kolibri keep it on full layers too (is_sliding says
    # which), UltraBERT and ModernBERT add 1 "because flash attention sets inclusive boundaries".
    types, window = getattr(config, "layer_types", None), getattr(config, "sliding_window", None)
    if isinstance(types, (list, tuple)) and layer < len(types) and isinstance(window, int) \
            and not isinstance(window, bool) and types[layer] in ("sliding_attention", "full_attention"):
        return window if types[layer] == "sliding_attention" else None
    if attn is not None and hasattr(attn, "sliding_window"):
        value = attn.sliding_window
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    layers = getattr(config, "attention_layers", None)  # GPT-Neo: "global" / "local"
    if isinstance(layers, (list, tuple)) and layer < len(layers):
        return getattr(config, "window_size", None) if layers[layer] == "local" else None
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if isinstance(types, (list, tuple)) and layer < len(types):
        return window if types[layer] == "sliding_attention" else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window if isinstance(window, int) and not isinstance(window, bool) else None


def _rotary_dim(config: Any, attn: Optional[nn.Module], d_head: int, types: Optional[set] = None) -> int:
    for name in ("rotary_ndims", "rotary_dim"):
        value = getattr(attn, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    mla = mla_rotary(attn, d_head)
    if mla is not None:
        return mla[0]
    factors = {v.get("partial_rotary_factor") for k, v in (getattr(config, "rope_parameters", None) or {}).items()
               if isinstance(v, dict) and (not types or k in types)}
    factor = factors.pop() if len(factors) == 1 else None  # per layer type (MiMo-V2-Flash, Laguna, ZAYA)
    if factor is None:
        factor = _rope(config).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if factor is None:
        factor = getattr(config, "rotary_pct", 1.0)
    # HF's default rope init: inv_freq = base ** -(arange(0, dim, 2) / dim), cos = cat(freqs, freqs), so an odd
    # int(d_head * factor) (MiMo-V2-Flash: 16 * 0.334 = 5) turns 2 * ceil(dim / 2) features
    dim = int(d_head * float(cast(float, factor)))
    return dim + dim % 2


def mla_rotary(attn: Optional[nn.Module], d_head: int) -> Optional[tuple[int, int]]:
    """(rotary_dim, first rotated feature) of Multi-head Latent Attention (DeepSeek-V2/V3, Liu et al. 2024 §2.1.3).

    Its forward splits each query head as ``q_pass, q_rot = torch.split(q, [qk_nope_head_dim, qk_rope_head_dim])``,
    rotates ``q_rot`` (and the shared ``k_rot``) and concatenates ``(q_pass, q_rot)``: the last qk_rope_head_dim
    features turn. With rope_interleave the rotation reads pairs (2i, 2i + 1) but writes them as (i, i + r/2)
    (``apply_rotary_pos_emb_interleave``: ``cat([q1 cos - q2 sin, q2 cos + q1 sin])``), so the rotated q/k the
    kernel gets pair as "half". None where the module is not laid out so.
    """
    rope, nope = getattr(attn, "qk_rope_head_dim", None), getattr(attn, "qk_nope_head_dim", None)
    if attn is None or not (isinstance(rope, int) and isinstance(nope, int) and rope + nope == d_head):
        return None
    try:
        source = source_text.source(type(attn).forward)
    except (OSError, TypeError):
        return None
    if re.search(r"q_pass, q_rot = torch\.split", source):
        return rope, nope
    return (rope, 0) if re.search(r"q_rot, q_pass = torch\.split", source) else None


def _rotary_direction(module: Any) -> Optional[int]:
    """-1 where the modeling file's rotate_half is ``cat((x2, -x1))`` (nanochat, as Karpathy's nanochat
    apply_rotary_emb: y1 = x1 cos + x2 sin): position p turns by -p, a rotation still; None (textbook +1) otherwise."""
    try:
        source = source_text.source(module.rotate_half) if module is not None and hasattr(module, "rotate_half") else ""
    except (OSError, TypeError):
        return None
    return -1 if re.search(r"cat\(\(x2, -x1\)", source) else None


def _sinks(attn_modules: list[Optional[nn.Module]]) -> Optional[tuple[bool, ...]]:
    """Per layer, whether its module keeps learned attention sinks (``module.sinks``, GPT-OSS); None if none does."""
    found = tuple(isinstance(getattr(a, "sinks", None), torch.Tensor) for a in attn_modules)
    return found if any(found) else None


def _absolute_positions(module: Any) -> Optional[str]:
    """What the modeling code makes depend on absolute position, named (``DesignFacts.absolute_positions``).

    - Beam's modeling module defines ``compute_attention_scaling(position_ids)`` (scalable softmax on its layers
      without RoPE) and its model's forward calls it once per such layer type;
    - RecurrentGemma's RG-LRU computes ``reset = position_ids[:, :, None] == 0`` (a document boundary).
    """
    try:
        source = source_text.source(module) if module is not None else ""
    except (OSError, TypeError):
        source = ""
    if re.search(r"reset\s*=\s*position_ids\[[^\]]*\]\s*==\s*0", source):
        return (f"{module.__name__.rsplit('.', 1)[-1]}: the recurrence resets at position 0, a document boundary "
                "(reset = position_ids == 0)")
    if module is None or not callable(getattr(module, "compute_attention_scaling", None)):
        return None
    if not calls(module, "compute_attention_scaling"):
        return None
    doc = (inspect.getdoc(module.compute_attention_scaling) or "").split("\n")[0]
    return f"{module.__name__.rsplit('.', 1)[-1]}.compute_attention_scaling" + (f": {doc}" if doc else "")


def expert_capacity(hf_model: nn.Module) -> Optional[int]:
    """``DesignFacts.expert_capacity``: the most tokens a pass may hold, all rows together, that no router drops.

    A router is a module's ``router`` with an ``expert_capacity`` attribute, counted over the batch where the module's
    forward flattens its input (``view(-1, ...)``/``reshape(-1, ...)``) before calling it (NLLB-MoE); Switch
    Transformers calls it on ``[batch, pos, d]`` and counts per sequence (undeclared). In eval NLLB-MoE's capacity is
    ``ceil(f * tokens)`` for ``moe_eval_capacity_token_fraction`` f > 0 (f >= 1 drops nothing; else a pass of N
    tokens is safe while ceil(f N) >= N), the fixed ``expert_capacity`` for f <= 0, and
    ``2 * ceil(tokens / experts)`` >= 2 where that is None (remembered after the first pass).
    """
    budgets = []
    for parent in hf_model.modules():
        router = getattr(parent, "router", None)
        if not isinstance(router, nn.Module) or not hasattr(router, "expert_capacity"):
            continue
        try:
            source = source_text.source(type(parent).forward)
        except (OSError, TypeError):
            source = ""
        call, flat = source.find("self.router("), re.search(r"\.(view|reshape)\(\s*-1\s*,", source)
        if call >= 0 and (flat is None or call < flat.start()):
            continue  # routed on [batch, pos, d] before any flattening: capacity per sequence
        fraction, capacity = getattr(router, "moe_eval_capacity_token_fraction", None), router.expert_capacity
        if isinstance(fraction, (int, float)) and fraction > 0:
            n = 1  # in the model's own float arithmetic, math.ceil(fraction * tokens)
            while fraction < 1 and n < 4096 and math.ceil(fraction * (n + 1)) >= n + 1:
                n += 1
            budgets.extend([n] if fraction < 1 else [])
        else:
            budgets.append(capacity if isinstance(capacity, int) else 2)
    return min(budgets) if budgets else None


def _bos(config: Any) -> Optional[int]:
    bos = getattr(config, "bos_token_id", None)
    bos = bos[0] if isinstance(bos, (list, tuple)) and bos else bos
    return bos if isinstance(bos, int) and not isinstance(bos, bool) and 0 <= bos < config.vocab_size else None


def _pos_offset(arch: str, hf_model: nn.Module) -> int:
    table = position_embedding_module(hf_model)
    offset = getattr(table, "offset", None)
    if isinstance(offset, int):
        return offset  # OPTLearnedPositionalEmbedding adds it to every position id itself
    if arch in _ROBERTA_LIKE:
        pad = getattr(getattr(hf_model, "config", None), "pad_token_id", None)
        return (pad or 0) + 1
    return 0


def _norm_type(hf_model: nn.Module) -> Optional[str]:
    names = {type(m).__name__ for m in hf_model.modules()}
    if any("RMSNorm" in n for n in names):
        return "RMS"
    return "LN" if any("LayerNorm" in n for n in names) else None


def head_dim(attn: nn.Module, config: Any) -> int:
    """The width of one attention head: the module's own attribute, else hidden_size // num_attention_heads."""
    for name in ("head_dim", "head_size", "attention_head_size"):
        value = getattr(attn, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    text = config.get_text_config()
    return int(text.hidden_size // text.num_attention_heads)


def read_design(hf_model: nn.Module, attn_modules: list[Optional[nn.Module]], d_head: int,
                layer_ids: Optional[list[int]] = None) -> AdapterConfig:
    """The ``cfg`` of ``hf_model`` behind an HFAdapter, given its per-layer attention modules and head size.

    ``layer_ids`` are the model's layer indices of those modules (a hybrid stack's attention layers; default
    0, 1, ...): per-layer config lists (``layer_types``) are read at them.
    """
    ids = list(range(len(attn_modules))) if layer_ids is None else layer_ids
    config = _text_config(hf_model.config)
    arch = str(getattr(config, "model_type", type(hf_model).__name__))
    n_layers = len(attn_modules)
    n_heads = _int(config, "num_attention_heads", "n_head", "n_heads")
    if n_heads is None and hasattr(config, "attn_config"):
        n_heads = _int(config, "n_heads")
    d_model = _int(config, "hidden_size", "d_model", "n_embd")
    if n_heads is None or d_model is None:
        missing = "the number of attention heads" if n_heads is None else "the model width"
        raise AttnlabTypeError(f"architecture {arch!r}: its config names {missing} under no field the adapter knows "
                               "(num_attention_heads/n_head/n_heads, hidden_size/d_model/n_embd)")
    n_kv = _int(config, "num_key_value_heads", "num_kv_heads", "n_head_kv")
    if arch == "falcon" and not getattr(config, "new_decoder_architecture", False):
        n_kv = 1 if getattr(config, "multi_query", False) else n_heads
    attn0 = attn_modules[0]
    pos = positional_type(config, hf_model, attn0)
    scales = tuple(_scale(arch, a, d_head) for a in attn_modules)
    rotary = pos == "rotary"
    module = _modeling_module(attn0)
    style = None
    if rotary:
        style = _rotary_style(module, attn0)
    base = rope_type = None
    layer_types = getattr(config, "layer_types", None)
    types = {layer_types[i] for i in ids if i < len(layer_types)} if isinstance(layer_types, (list, tuple)) else None
    if rotary:
        rope = _rope(config, types)
        base = rope.get("rope_theta", getattr(config, "rope_theta", getattr(config, "rotary_emb_base", None)))
        base = float(base) if base is not None else 10000.0  # GPT-J/CodeGen hard-code 10000
        rope_type = rope.get("rope_type")
        if rope_type == PER_LAYER_TYPE:
            base = None
    softcap = getattr(config, "attn_logit_softcapping", None)
    # a module without is_causal follows its head: a masked LM predicts from both sides (DeBERTa, ConvBERT keep no flag)
    default_causal = not type(hf_model).__name__.endswith("ForMaskedLM")
    causal = all(getattr(a, "is_causal", default_causal) or _decoder_masked_causally(a)
                 for a in attn_modules if a is not None)
    n_ctx = _int(config, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length") or 2048
    usable = usable_context(config)  # a fairseq-numbered table (RoBERTa) serves 2 positions fewer than its rows
    n_ctx = usable.value if usable.known and pos == "standard" else n_ctx
    qk_norm = any(getattr(attn0, name, None) is not None for name in ("q_norm", "q_layernorm"))
    return AdapterConfig(
        adapter="HFAdapter", n_layers=n_layers, n_heads=int(n_heads), d_head=d_head, d_model=int(d_model),
        d_vocab=int(config.vocab_size), n_ctx=n_ctx, positional_embedding_type=pos,
        attention_dir="causal" if causal else "bidirectional", n_key_value_heads=int(n_kv or n_heads),
        device=str(next((p.device for p in hf_model.parameters()), "cpu")), arch=arch,
        attn_scale=scales[0], attn_scales=scales,
        attn_softcap=float(softcap) if softcap is not None else None,
        sliding_window=tuple(_sliding(config, a, i) for i, a in zip(ids, attn_modules, strict=True)),
        rotary_dim=_rotary_dim(config, attn0, d_head, types) if rotary else None, rotary_style=style, rotary_base=base,
        rotary_offset=(mla_rotary(attn0, d_head) or (0, None))[1] if rotary else None,
        rotary_direction=_rotary_direction(module) if rotary else None,
        rope_type=rope_type, pos_offset=_pos_offset(arch, hf_model) if pos == "standard" else 0, qk_norm=qk_norm,
        alibi_style=("absolute_key" if arch in _ABSOLUTE_KEY_ALIBI else "relative") if pos == "alibi" else None,
        alibi_slopes=falcon_alibi_slopes(config, int(n_heads), d_head),
        normalization_type=_norm_type(hf_model), query_prescale=query_prescale(attn0),
        bos_token_id=_bos(config), attention_sinks=_sinks(attn_modules),
        absolute_positions=_absolute_positions(module) or (length_dependence(config, n_ctx) if rotary else None),
        key_score_bias=callable(getattr(attn0, "prepare_dynamic_mask", None)),  # Doge's dynamic mask attention
        expert_capacity=expert_capacity(hf_model), source_config=config, layer_ids=tuple(ids),
    )


def design_of(hf_model: nn.Module) -> AdapterConfig:
    """The HFAdapter ``cfg`` of ``hf_model`` without wrapping it (what :class:`BridgeAdapter` declares)."""
    config = hf_model.config
    layers = routes.find_layers(hf_model, getattr(_text_config(config), "num_hidden_layers", None))
    # a hybrid stack's attention layers, as HFAdapter takes them (RecurrentGemma, Jamba)
    ids = routes.attention_layer_ids(layers) if layers is not None else []
    attns = [routes.attention_module(layers[i]) for i in ids] if layers is not None else []
    if not attns or any(a is None for a in attns):
        raise AttnlabTypeError(f"{type(hf_model).__name__} has no stack of attention blocks to read a design from")
    return read_design(hf_model, attns, head_dim(cast(nn.Module, attns[0]), config), layer_ids=ids)
