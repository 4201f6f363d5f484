"""The design facts a model may declare in its ``cfg``, documented once: what the property checks follow.

docs/architecture.md: besides the protocol fields a ``cfg`` may declare where the model departs from
the textbook attention of Vaswani et al. 2017. :class:`DesignFacts` names every such field with its
textbook default; :class:`AdapterConfig` is the ``cfg`` both adapters build (``HFAdapter`` reads the
facts off a Hugging Face model's config and modules, ``BridgeAdapter`` off the model inside a
TransformerLens bridge), so the two declare the same fields the same way. The checks
(``properties.checks``) read these attribute names from any ``model.cfg`` with ``getattr`` and a
default, so a user's own model declares a fact by having the attribute.

A field left at ``None`` is *not declared*: a check takes the textbook value, or reports itself
unobservable where it cannot compare without knowing (e.g. the rotary layout).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True, kw_only=True)
class DesignFacts:
    """Where a model's attention departs from the textbook; every field optional, defaults textbook."""

    # The factor hook_q . hook_k is multiplied by before the softmax (every layer). Textbook
    # 1/sqrt(d_head) (Vaswani et al. 2017 §3.2.1); Gemma 2 query_pre_attn_scalar**-0.5, GPT-Neo 1.
    attn_scale: Optional[float] = None
    # The same factor per layer; wins over attn_scale (GPT-2's scale_attn_by_inverse_layer_idx divides
    # layer l's by l + 1).
    attn_scales: Optional[tuple[float, ...]] = None
    # Scores -> cap * tanh(scores / cap) before the mask (Gemma 2). Textbook: no cap (None).
    attn_softcap: Optional[float] = None
    # Per layer, None = global attention: a causal query i sees keys j with i - j < w (transformers'
    # sliding_window_overlay), a bidirectional one |i - j| <= w (Longformer, Beltagy et al. 2020;
    # Mistral, Jiang et al. 2023). Textbook: every layer global.
    sliding_window: Optional[tuple[Optional[int], ...]] = None
    # Dimensions of each head that rotate (partial rotary, GPT-NeoX's rotary_pct, GPT-J's rotary_dim).
    # Textbook: all of d_head (Su et al. 2021).
    rotary_dim: Optional[int] = None
    # Which dimensions pair up in a rotation: "half" pairs (i, i + r/2) (rotate_half: GPT-NeoX, Llama),
    # "interleaved" pairs (2i, 2i + 1) (Su et al. 2021 eq. 34; GPT-J, RoFormer).
    rotary_style: Optional[str] = None
    # The first rotated feature of a head: the rotary_dim features from it turn, the rest pass through.
    # Multi-head Latent Attention (DeepSeek-V2/V3, Liu et al. 2024 §2.1.3) concatenates [q_nope, q_rope], so
    # its rotary part is the last qk_rope_head_dim features: offset qk_nope_head_dim. Textbook 0 (None).
    rotary_offset: Optional[int] = None
    # +1: position p turns a pair (a, b) to (a cos - b sin, a sin + b cos) (Su et al. 2021 eq. 34); -1: by -p
    # (nanochat's rotate_half is cat(x2, -x1)), just as relative: <R(-m) q, R(-n) k> depends on m - n. Textbook +1.
    rotary_direction: Optional[int] = None
    # The RoPE base theta: angle of pair i at position p is p * theta**(-2i/r). Textbook 10000 (Su et al.).
    rotary_base: Optional[float] = None
    # transformers' rope_parameters["rope_type"]: "default" is plain RoPE; "linear", "dynamic", "yarn",
    # "llama3" ... rescale the angles (a check of plain rotation angles does not apply to them).
    rope_type: Optional[str] = None
    # q and k are normalised per head between hook_q/hook_k and the rotation (Qwen3, OLMo 2, Gemma 3).
    qk_norm: bool = False
    # "relative": bias -m_h |i - j| (Press et al. 2022); "absolute_key": m_h * j (Bloom's
    # build_alibi_tensor, Falcon, MPT). They differ by a per-query constant softmax cannot see.
    alibi_style: Optional[str] = None
    # The per-head ALiBi slopes; textbook the geometric sequence of Press et al. 2022 §3
    # (harness.model.positions.alibi_slopes).
    alibi_slopes: Optional[tuple[float, ...]] = None
    # The row of the learned position table that position 0 reads (OPT 2, RoBERTa padding_idx + 1);
    # the adapter applies it, no check reads it. Textbook 0.
    pos_offset: int = 0
    # A factor the model multiplies q by before its attention function, which it then calls with
    # scaling=1.0 (OPT, "to follow the original implementation"): hook_q is then the scaled q, and
    # attn_scales is 1.0. None where the scale is applied to q.k.
    query_prescale: Optional[float] = None
    # A learned bias b_h(i - j) added to the scores, a function of the head and the query-key offset only
    # (T5's bucketed relative position bias, Raffel et al. 2020 §2.1). Textbook: none.
    relative_attention_bias: bool = False
    # Per layer: True where the softmax's denominator holds one more learned logit per head that attends to
    # nothing (an attention sink: GPT-OSS, MiMo-V2-Flash, Granite-SWA, DeepSeek-V4 keep it as ``module.sinks``;
    # transformers' gpt_oss eager_attention_forward appends it as a key column, softmaxes, drops it). A row of
    # such a pattern sums to 1 - exp(sink) / (exp(sink) + sum_j exp(s_j)) < 1. Textbook: no sink (None).
    attention_sinks: Optional[tuple[bool, ...]] = None
    # What makes the model's output depend on absolute position by design, named: Beam multiplies queries by
    # the scalable-softmax factor s(p) = (1 + (p + 1) / 2048) ** 0.1 on its layers without RoPE (Nakanishi 2025,
    # "Scalable-Softmax Is Superior for Attention"; transformers' beam compute_attention_scaling); RecurrentGemma's
    # RG-LRU resets its state at position 0, a document boundary (De et al. 2024, Griffin §2.4); dynamic-NTK and
    # LongRoPE rotary scalings recompute their frequencies from the length (harness/adapters/hf_positions.py).
    # Textbook: none (None); relative_position does not apply where it is set.
    absolute_positions: Optional[str] = None
    # A bias b_h(j) added to every score of key j, per head and batch row, computed from the input: Doge's
    # dynamic mask attention adds exp(A_h * softplus(dt_proj(v_j))) to the scores (Shi et al. 2024, "Trainable
    # Dynamic Mask Sparse Attention"; transformers' doge prepare_dynamic_mask). Textbook: none (False).
    key_score_bias: bool = False
    # Per layer: whether its q and k rotate. Flint rotates its sliding-window layers only and gives its full
    # layers no positions at all (its modeling code: "full-attention layers use no positional encoding").
    # The HF adapter observes it: the layers whose apply_rotary_pos_emb ran on the smoke pass. Textbook: a
    # rotary model rotates every layer (None).
    rotary_layers: Optional[tuple[bool, ...]] = None
    # A mixture-of-experts router with an expert capacity counted over the whole batch: a token routed to an expert
    # that already holds its capacity of the pass's tokens is dropped (passed through on the residual), so one row's
    # tokens change another row's output (Fedus et al. 2021, Switch Transformers §2.2 "expert capacity"; Lepikhin et
    # al. 2020, GShard; NLLB-MoE's top-2 router flattens the batch before counting). The value is the most tokens one
    # forward pass may hold, all rows together, that no such router can drop: the capacity itself where it is fixed
    # (no expert receives more tokens than the pass holds). Textbook: no capacity (None); a capacity counted per
    # sequence (transformers' Switch Transformers: cumsum over each row's positions) keeps rows independent.
    expert_capacity: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class AdapterConfig(DesignFacts):
    """An adapter's ``cfg``: the protocol fields (docs/architecture.md), what it read of the model, its design."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    n_ctx: int
    positional_embedding_type: str  # one of harness.model.protocol_facts.POSITIONAL_TYPES
    attention_dir: str  # one of harness.model.protocol_facts.ATTENTION_DIRS
    adapter: str  # "HFAdapter" / "BridgeAdapter"
    n_key_value_heads: Optional[int] = None  # < n_heads: grouped-query attention (Ainslie et al. 2023)
    normalization_type: Optional[str] = None  # "LN" / "RMS", as TransformerLens names them
    arch: Optional[str] = None  # the Hugging Face config's model_type
    device: Optional[str] = None  # where the parameters were when the adapter was built (TransformerLens reads it)
    # The beginning-of-sequence id the model's config names (a real prompt starts with it), None if none.
    # Not a design fact: finite_outputs also runs each input with it in front, since a trained model's
    # activations on <bos> can be far larger than on any other token (Gemma-3 overflows float16 on it).
    bos_token_id: Optional[int] = None
    # The declaration itself, where the model has one: the Hugging Face (text) config the design oracle
    # (harness.oracle) computes the expected design from, and the model's layer index of each checked layer (a
    # hybrid stack checks only its attention layers). Not design facts: the oracle reads the config, never these
    # fields' neighbours, which are what the model does.
    source_config: Any = None
    layer_ids: Optional[tuple[int, ...]] = None

    @property
    def alibi(self) -> bool:
        return self.positional_embedding_type == "alibi"


def design_facts(cfg: Any) -> dict[str, Any]:
    """The :class:`DesignFacts` fields of ``cfg`` (a DesignFacts or any object with those attributes)."""
    return {f.name: getattr(cfg, f.name, f.default) for f in dataclasses.fields(DesignFacts)}
