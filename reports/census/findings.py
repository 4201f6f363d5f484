"""The census's documented findings: failed rows that are bugs in the wrapped implementation.

Each names the witness (a function in tests/helpers/census_witness.py) that shows the bug on the
raw model without the property suite; tests/test_census_witness.py asserts each still reproduces.
A failed row not listed here is ``untriaged`` in the census: a false alarm or a new bug.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from harness.adapters.hf_positions import length_dependence


@functools.cache  # read once: the census findings, the variants' and the zoo's all ask
def falcon_own_attention() -> bool:
    """Whether the installed Falcon computes attention itself, with the eager branch at fault below; from
    transformers 5.25 it calls transformers' AttentionInterface, its pattern is masked, and the finding is gone."""
    import transformers.models.falcon.modeling_falcon as modeling

    return "ALL_ATTENTION_FUNCTIONS" not in inspect.getsource(modeling)


@dataclass(frozen=True)
class Finding:
    model_type: str
    prop: str
    summary: str
    witness: str  # tests/helpers/census_witness.py::<witness>, called with the model type
    # A finding of some configurations only (the variants census, reports/census/variants_run.py): the predicate on
    # (config, dtype checked) it holds under, and that predicate in words. None: every config of the type.
    when: Optional[Callable[[Any, str], bool]] = None
    when_doc: str = ""


_FALCON = ("Falcon (no ALiBi) under sdpa with output_attentions=True takes its eager branch and adds sdpa's boolean "
           "mask to the scores (+1/+0) instead of masking: the pattern sees future and padded keys (the zoo's finding; "
           "the plain forward is causal).")
_POSITIONS = ("its causal-LM forward takes no position_ids and numbers learned positions by index, so a masked "
              "left pad moves every real token one position on (the mask itself works: the pad's id changes "
              "nothing); left-padded batches give other logits than the unpadded prompt.")
_POSITIONS_CACHED = ("its causal-LM forward takes no position_ids and numbers learned positions by index, so cached "
                     "decoding of a masked left-padded prompt runs every real token one position on from the "
                     "unpadded prompt: its logits differ from the unpadded recompute (the padding_outputs finding, "
                     "met through the cache).")
_LEAK = ("a masked pad's token id reaches the real tokens (MobileBERT's trigram input convolution, ConvBERT's span "
         "convolution, YOSO's hashed attention): the pad is not fully masked.")
_MOSHI = ("MoshiConfig declares sliding_window (3000 by default, 'Sliding window attention window size'), but "
          "MoshiModel masks with create_causal_mask and MoshiAttention passes no sliding_window to its attention "
          "function: no window is applied, every query sees every earlier key.")
_LENGTH = ("ProphetNet's decoder gives a position other logits when more positions follow it (position 0 moves by "
           "~1.6e-3 in float64 when one token is appended, whatever its id), so cached decoding, which runs the "
           "shorter sequence first, differs from a full recompute.")
_OFFSET_LEAK = ("DeepSeek-V4's compressor groups keys into windows by token index but lets query t see window w when "
                "(position_ids[t] + 1) // compress_rate > w: with position ids that do not start at 0 (an offset, "
                "left padding) a query sees a compressed window holding later tokens, so earlier logits move when a "
                "later token changes.")
_CHUNK = ("RecurrentGemma's recurrent block takes every call of more than one token for a fresh prefill and drops the "
          "conv and RG-LRU state its cache holds, so cached decoding in chunks of several tokens differs from a full "
          "forward (one token at a time is exact).")
_JAMBA_CHUNK = ("Jamba's cached decoding of a chunk of several new tokens gives other logits than a full forward "
                "(2.3e-6 in float64, its Mamba mixer's multi-token path under a cache); one token at a time is exact.")
_RECURRENT_LEAK = ("RecurrentGemma's recurrent blocks ignore attention_mask: a masked left pad's id reaches the real "
                   "tokens through the temporal convolution.")
_PAD_WINDOWS = ("DeepSeek-V4's compressor groups keys into windows by token index while its causal threshold reads "
                "position ids: a masked left pad shifts every window by one token, so a left-padded prompt's last "
                "logits (cached or not) differ from the unpadded prompt's; unpadded, cached decoding is exact.")
_ROTARY_DIM = ("MiniMaxM3VLTextConfig documents rotary_dim ('Number of head channels rotated by RoPE; the remaining "
               "channels are passed through unchanged', 64 of head_dim 128 by default), but its rotary embedding "
               "sizes cos/sin from rope_parameters' partial_rotary_factor alone (default 1.0) and "
               "apply_rotary_pos_emb turns cos.shape[-1] features: every channel of each head turns, and the logits "
               "do not depend on rotary_dim at all.")
LEFT_PAD_MOVES = ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus",
                  "plbart", "prophetnet", "trocr", "whisper")
PAD_LEAKS = ("convbert", "mobilebert", "yoso")
FINDINGS: tuple[Finding, ...] = (
    *((Finding("falcon", "causal_pattern", _FALCON, "falcon_census"),
       Finding("falcon", "padding_pattern", _FALCON, "falcon_census")) if falcon_own_attention() else ()),
    *(Finding(t, "padding_outputs", _POSITIONS, "left_padding_moves_positions") for t in LEFT_PAD_MOVES),
    # the same numbering under a cache: a left-padded prompt decodes at positions one on from the unpadded prompt's
    # (kv_cache recomputes a padded row without its padding); ProphetNet's kv_cache row is its own finding below
    *(Finding(t, "kv_cache", _POSITIONS_CACHED, "left_padding_moves_positions")
      for t in LEFT_PAD_MOVES if t != "prophetnet"),
    *(Finding(t, "padding_outputs", _LEAK, "padding_leaks_into_real_tokens") for t in PAD_LEAKS),
    Finding("moshi", "sliding_window", _MOSHI, "window_ignored"),
    Finding("moshi", "window_layout", _MOSHI, "window_ignored"),
    Finding("minimax_m3_vl_text", "rotary_frequencies", _ROTARY_DIM, "rotary_dim_ignored"),
    Finding("prophetnet", "kv_cache", _LENGTH, "logits_depend_on_length"),
    Finding("deepseek_v4", "relative_position", _OFFSET_LEAK, "future_leaks_after_an_offset"),
    Finding("deepseek_v4", "kv_cache", _PAD_WINDOWS, "left_pad_shifts_compressed_windows"),
    Finding("deepseek_v4", "padding_outputs", _PAD_WINDOWS, "left_pad_shifts_compressed_windows"),
    Finding("recurrent_gemma", "kv_cache", _CHUNK, "chunked_prefill_drops_state"),
    Finding("recurrent_gemma", "padding_outputs", _RECURRENT_LEAK, "padding_leaks_into_real_tokens"),
    Finding("jamba", "kv_cache", _JAMBA_CHUNK, "cached_chunk_differs"),
)


# The variants census's findings (reports/census/variants_run.py): a failed row of some drawn configurations only,
# each with the config predicate it holds under and a witness on the raw HF model built from that config
# (tests/helpers/census_variant_witness.py).
_LONGROPE = ("LongRoPE (Ding et al. 2024; Phi-3's rope_type='longrope') rotates with short_factor while the sequence "
             "is within original_max_position_embeddings and with long_factor past it, recomputed from each call's "
             "largest position id (transformers' longrope_frequency_update): keys cached while the sequence was short "
             "keep the short rotation, so a cached step past the limit differs from a full forward, which rotates "
             "every key with long_factor (the design, not rounding: 6e-3 in float64, exact under default rope). "
             "transformers' generate recomputes the cache at the switch only for Phi-3 "
             "(Phi3ForCausalLM.prepare_inputs_for_generation).")


def _longrope_within_context(config: Any, dtype: str) -> bool:
    """LongRoPE whose switch to long_factor lies inside the context (so cached decoding can cross it)."""
    why = length_dependence(config, getattr(config, "max_position_embeddings", 0) or 0)
    return why is not None and why.startswith("rope_type='longrope'")


_FALCON_ALIBI = ("Falcon with alibi=True (Falcon-RW) adds its ALiBi bias twice on the eager path, which "
                 "output_attentions=True takes: FalconModel.forward folds alibi / sqrt(head_dim) into the causal mask "
                 "and FalconAttention's eager branch adds alibi to the scores again before scaling them, so the "
                 "pattern's slopes are 2 / sqrt(head_dim) x Press et al.'s where the sdpa forward's are "
                 "1 / sqrt(head_dim) x (eager and sdpa logits differ by 1e-2 in float64; equal without ALiBi). "
                 "The row expects the declared slopes (DesignFacts.alibi_slopes, Press et al.'s / sqrt(head_dim)): "
                 "the eager pattern's are twice those.")
# the variant census's decoders whose cached decoding the witness shows crossing LongRoPE's switch (Gemma 3 keys its
# rope by layer type, Phi-3 pins the switch at its shipped 4096; the others have no rope_parameters)
_INV_FREQ = ("At float16 and bfloat16 the census checks a copy cast by Module.to(dtype), as model.half() casts: "
             "transformers rounds the rotary inv_freq buffer to the dtype with it (transformers #25681), so the "
             "rotation at high positions is off a float64 rotation of its own inputs by tens of u (22.6 u at "
             "position 127 in float16; 1.1 u for the same model built at float16, whose inv_freq stays float32, as "
             "from_pretrained(dtype=...) keeps it). Which configs cross the allowance depends on the head size.")
_SOFTCAP_IGNORED = ("Gemma3TextConfig declares attn_logit_softcapping ('scaling factor when applying tanh softcapping "
                    "on the attention scores'), but Gemma3Attention.forward passes no softcap to its attention "
                    "function (Gemma2Attention passes softcap=self.attn_logit_softcapping): the scores are never "
                    "capped, whatever the value (float64 logits with a cap of 0.01 equal those without one).")
# the types whose drawn configs failed rotary_precision at a low precision, each witnessed on its minimal config
ROUNDED_INV_FREQ = ("granitemoe", "qwen3_moe")
# the same rounding against every rotary layer's declared rotation (rotary_frequencies), in some drawn configs more
ROUNDED_FREQUENCIES = ROUNDED_INV_FREQ + ("gemma", "stablelm")
LONGROPE_CACHE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "gpt_neox", "falcon", "starcoder2",
                  "cohere", "cohere2", "olmo", "olmo2", "stablelm", "qwen2_moe", "deepseek_v3", "glm", "glm4",
                  "granite", "exaone", "exaone4", "qwen3_moe", "persimmon", "olmoe", "granitemoe", "smollm3", "jetmoe")
VARIANT_FINDINGS: tuple[Finding, ...] = (
    *(Finding(t, "kv_cache", _LONGROPE, "longrope_cached_step_differs", when=_longrope_within_context,
              when_doc="rope_type='longrope' with original_max_position_embeddings < max_position_embeddings")
      for t in LONGROPE_CACHE),
    *(Finding(t, "rotary_precision", _INV_FREQ, "inv_freq_rounded_by_to",
              when=lambda config, dtype: dtype in ("float16", "bfloat16"), when_doc="checked at float16 or bfloat16")
      for t in ROUNDED_INV_FREQ),
    *(Finding(t, "rotary_frequencies", _INV_FREQ, "inv_freq_rounded_by_to",
              when=lambda config, dtype: dtype in ("float16", "bfloat16"), when_doc="checked at float16 or bfloat16")
      for t in ROUNDED_FREQUENCIES),
    Finding("gemma3_text", "attention_scale", _SOFTCAP_IGNORED, "softcap_ignored",
            when=lambda config, dtype: getattr(config, "attn_logit_softcapping", None) is not None,
            when_doc="attn_logit_softcapping is set"),
    *((Finding("falcon", "alibi_slopes", _FALCON_ALIBI, "falcon_alibi_added_twice",
               when=lambda config, dtype: bool(getattr(config, "alibi", False)), when_doc="alibi=True"),)
      if falcon_own_attention() else ()),  # the eager path at fault is gone where Falcon uses the interface
)

# The bridge census's findings (reports/census/bridge.py): rows the raw model passes and the bridge fails. Each
# witness (tests/helpers/census_witness.py) shows the bug on the census's tiny model against the raw HF model or
# TransformerLens's own definitions, without the property suite.
_OPENAI = ("TransformerLens's bridge for OpenAI GPT, given an attention_mask (even all ones), attends without its "
           "causal mask: position 0's logits move when a later token changes and differ from the raw HF model's, which "
           "is causal (the zoo's finding; without the mask argument the bridge is causal).")
_SCORES = ("TransformerLens's bridge fires hook_attn_scores with the post-softmax pattern (it equals hook_pattern), "
           "not the pre-softmax scores; the bridge's logits still equal the raw model's (the zoo's finding).")
_Z_AT_O = ("TransformerLens's bridge fires hook_z with o_proj's input, after a step between the attention kernel and "
           "the output projection ({what}), so hook_z is not hook_pattern . hook_v as TransformerLens defines z; the "
           "bridge's logits equal the raw model's. A head ablated at this hook_z is not that head's attention output.")
_V_NORM = ("TransformerLens's bridge fires hook_v with v_proj's output, before Gemma 4's v_norm, while the attention "
           "reads the normalized values: hook_pattern . hook_v is not hook_z; the bridge's logits equal the raw "
           "model's.")
_RWKV = ("RwkvForCausalLM takes attention_mask but its recurrence ignores it: a masked left pad's id reaches the "
         "real tokens (shown on the raw model; the raw census cannot check RWKV: HFAdapter finds no "
         "num_attention_heads, the bridge runs it).")
BRIDGE_FINDINGS: tuple[Finding, ...] = (
    *(Finding("openai-gpt", p, _OPENAI, "bridge_not_causal") for p in ("causal_outputs", "causal_pattern",
                                                                        "attention_scale")),
    *(Finding(t, "attention_scale", _SCORES, "bridge_attn_scores_is_pattern") for t in ("gpt_neo", "xglm")),
    Finding("afmoe", "kernel_consistency", _Z_AT_O.format(what="AFMoE's sigmoid output gate, gate_proj"),
            "bridge_z_is_o_proj_input"),
    Finding("bitnet", "kernel_consistency", _Z_AT_O.format(what="BitNet's attn_sub_norm, an RMSNorm over all heads"),
            "bridge_z_is_o_proj_input"),
    *(Finding(t, "kernel_consistency", _V_NORM, "bridge_v_before_v_norm")
      for t in ("gemma4", "gemma4_text", "gemma4_unified")),
    Finding("rwkv", "padding_outputs", _RWKV, "padding_leaks_into_real_tokens"),
)


@dataclass(frozen=True)
class Diagnosis:
    """Untriaged bridge rows whose cause is known and lies in attnlab, not in the bridge or the model: a false alarm
    is never a finding, so they stay ``untriaged`` until attnlab is fixed; the docs give the cause."""

    prop: str
    model_types: tuple[str, ...]
    cause: str


# None open. The two causes diagnosed when the bridge census was first run are fixed: a float64 BridgeAdapter copy
# now runs MoE experts eagerly (harness/adapters/placement.py; 18 causal_outputs false alarms), and -inf is a mask
# in additive *_bias/*_mask hooks (properties/precision.nonfinite_mask; DeepSeek-V4's compressor block mask).
BRIDGE_DIAGNOSES: tuple[Diagnosis, ...] = ()


# Untriaged variant rows whose cause is known and lies in attnlab's checks (files outside the census): they stay
# untriaged, and the docs give the cause, until the check is fixed. None open under the installed transformers.
VARIANT_DIAGNOSES: tuple[Diagnosis, ...] = ()


def variant_diagnosis(model_type: str, prop: str) -> str:
    """The known cause of an untriaged variant row, or ""."""
    return next((d.cause for d in VARIANT_DIAGNOSES if d.prop == prop and model_type in d.model_types), "")


def for_type(model_type: str) -> dict[str, Finding]:
    return {f.prop: f for f in FINDINGS if f.model_type == model_type}


def for_config(model_type: str, config: Any, dtype: str = "float32") -> dict[str, Finding]:
    """The findings of ``model_type`` that hold for ``config`` checked at ``dtype``: the type's own and the
    variants' whose predicate holds."""
    out = {f.prop: f for f in FINDINGS if f.model_type == model_type and f.when is None}
    out.update({f.prop: f for f in VARIANT_FINDINGS if f.model_type == model_type and f.when is not None
                and f.when(config, dtype)})
    return out


def bridge_for_type(model_type: str) -> dict[str, Finding]:
    return {f.prop: f for f in BRIDGE_FINDINGS if f.model_type == model_type}


def diagnosis(model_type: str, prop: str) -> str:
    """The known cause of an untriaged bridge row, or ""."""
    return next((d.cause for d in BRIDGE_DIAGNOSES if d.prop == prop and model_type in d.model_types), "")
