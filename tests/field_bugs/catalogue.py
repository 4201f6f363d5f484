"""The field-bug catalogue: real attention bugs from public trackers, each replayed on a tiny random model.

Every entry names the public issue or pull request it reproduces (each checked in its tracker),
says in our words what went wrong, replays it as a patch of the library code it lived in
(``patches.py``), proves the patched model wrong without the property suite (``witness``), and
names the properties that must catch it (``must_flag``). ``python -m tests.field_bugs`` runs
``check_model`` on every patched model and on every unpatched one, and prints the matrix.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from tests.field_bugs import bridge_user, models, nnsight_user, patches
from tests.field_bugs import witness as w

PRESS_4 = [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]  # Press et al. 2022 §3: 2^(-8h/4), h = 1..4
PRESS_6 = PRESS_4 + [2 ** -1, 2 ** -3]  # 6 heads: the 4-head slopes, then every other 8-head slope
LEFT_PADDED = dict(tokens=[[5, 9, 3, 7, 1, 2], [0, 0, 0, 4, 8, 6]], mask=[[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
RIGHT_PADDED = dict(tokens=[[5, 9, 3, 7, 1, 2], [4, 8, 6, 0, 0, 0]], mask=[[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
LONG = [[5, 9, 3, 7, 1, 2, 11, 4]]  # longer than the windows (3), so a window's edge binds


@dataclass(frozen=True)
class FieldBug:
    name: str
    links: tuple[tuple[str, str], ...]  # (label, url) of the public issue / pull request
    summary: str  # what went wrong, in our words
    replay: str  # what the patch does
    build: Callable[[], torch.nn.Module]  # the tiny model (unpatched; seeded)
    patch: Callable[[], AbstractContextManager]
    witness: Callable[[], str]
    must_flag: tuple[str, ...]
    wrap: str = "hf"  # "hf": harness.adapters.wrap; "bridge_user": a user's function around TransformerLens's bridge

    @property
    def arch(self) -> str:
        fn = self.build.func if isinstance(self.build, functools.partial) else self.build
        return fn.__name__


def _bug(name, links, summary, replay, build, patch, witness, must_flag, **kw) -> FieldBug:
    return FieldBug(name, tuple(links), summary, replay, build, patch, witness, tuple(must_flag), **kw)


def _p(fn, *args, **kwargs) -> Callable[[], AbstractContextManager]:
    return functools.partial(fn, *args, **kwargs)


GH = "https://github.com/"
MISTRAL_LONG = functools.partial(models.mistral, n_ctx=2048)
LLAMA_LONG = functools.partial(models.llama, n_ctx=2048)
YARN_MSCALE_4 = 0.1 * math.log(4.0) + 1.0  # Peng et al. 2023 eq. 21 for factor 4: the final factor on cos/sin
QWEN2_YARN_EXPLICIT = functools.partial(models.qwen2_yarn, YARN_MSCALE_4)  # Olmo 3's form: the final value written out
QWEN2_YARN_ONE = functools.partial(models.qwen2_yarn, 1.0)  # Laguna-XS.2's form: factor 64, attention_factor 1.0
FULL_LAYER_KEYS = [[1, 2, 3, 3, 3, 3, 3, 3]] * 2 + [[1, 2, 3, 4, 5, 6, 7, 8]]  # gemma3: two windows of 3, then full


def _rotary(model, pos, layer_type=None):
    x = torch.zeros(1, pos.shape[1], 8)
    return model.model.rotary_emb(x, pos) if layer_type is None else model.model.rotary_emb(x, pos, layer_type)


def _head_dim(config):  # the documented default: hidden_size // num_attention_heads
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _plain(config, base=None):
    return w.plain_inv_freq(base or config.rope_parameters["rope_theta"], _head_dim(config))


def _llama3(config):
    p = config.rope_parameters
    return w.llama3_inv_freq(p["rope_theta"], _head_dim(config), p["factor"], p["low_freq_factor"],
                             p["high_freq_factor"], p["original_max_position_embeddings"])


def _glm_apply(q, k, cos, sin):
    from transformers.models.glm import modeling_glm

    return modeling_glm.apply_rotary_pos_emb(q, k, cos, sin)


BUGS: list[FieldBug] = [
    _bug("hf29623_window_one_wider",
         [("huggingface/transformers#29623", GH + "huggingface/transformers/issues/29623")],
         "Mistral's sliding window meant a different number of keys per backend: the eager mask admitted "
         "w keys, FlashAttention-2 w + 1, so one config gave two models.",
         "masking_utils.sliding_window_overlay admits w + 1 keys (kv_idx >= q_idx - w).",
         models.mistral, _p(patches.window_overlay, +1), lambda: w.window_counts(_p(patches.window_overlay, +1), 3),
         ["sliding_window"]),
    _bug("vllm3385_window_one_narrower",
         [("vllm-project/vllm#3385", GH + "vllm-project/vllm/issues/3385"),
          ("context: huggingface/transformers#29623", GH + "huggingface/transformers/issues/29623")],
         "vLLM's xFormers local attention admitted one key fewer than Hugging Face and FlashAttention for "
         "the same window size.",
         "masking_utils.sliding_window_overlay admits w - 1 keys (kv_idx > q_idx - w + 1).",
         functools.partial(models.mistral, attn="sdpa"), _p(patches.window_overlay, -1),
         lambda: w.window_counts(_p(patches.window_overlay, -1), 3), ["sliding_window"]),
    _bug("hf39408_flash_window_both_sides",
         [("huggingface/transformers#39408", GH + "huggingface/transformers/issues/39408"),
          ("fix: huggingface/transformers#40163", GH + "huggingface/transformers/pull/40163")],
         "transformers passed window_size=(w, w) to FlashAttention, whose window is inclusive on both sides: "
         "under causality each query saw w + 1 keys while every other backend's mask admitted w.",
         "the sdpa kernel rebuilds its mask as FlashAttention's inclusive (w, 0) band; the mask the model "
         "built, and so the explicit pattern, is untouched.",
         functools.partial(models.mistral, attn="sdpa"), _p(patches.flash_window_both_sides),
         lambda: w.logits_move(functools.partial(models.mistral, attn="sdpa"),
                               _p(patches.flash_window_both_sides), LONG), ["kernel_consistency"]),
    _bug("aprender2143_alibi_exponent_off_by_one",
         [("paiml/aprender#2143", GH + "paiml/aprender/pull/2143")],
         "ALiBi head slopes used 2^(-8h/n) counting heads from 0, so head 0 got slope 1 and every head one "
         "extra factor of 2^(-8/n).",
         "Bloom's _get_alibi_slopes counts h = 0..n-1.",
         models.bloom, _p(patches.bloom_slopes, "exponent_off_by_one"),
         lambda: w.slopes(_p(patches.bloom_slopes, "exponent_off_by_one"), 4, PRESS_4), ["alibi_slopes"]),
    _bug("alibi17_non_power_of_two_heads",
         [("ofirpress/attention_with_linear_biases#17", GH + "ofirpress/attention_with_linear_biases/issues/17"),
          ("the same rule fixed in ml-explore/mlx#3071", GH + "ml-explore/mlx/pull/3071")],
         "For a head count that is not a power of two, ALiBi's slopes are not one geometric sequence: the "
         "reference code interleaves a second one, which implementations that use 2^(-8h/n) for every n miss.",
         "Bloom's _get_alibi_slopes returns the plain geometric sequence for 6 heads.",
         functools.partial(models.bloom, 6), _p(patches.bloom_slopes, "plain_geometric"),
         lambda: w.slopes(_p(patches.bloom_slopes, "plain_geometric"), 6, PRESS_6), ["alibi_slopes"]),
    _bug("pytorch103749_minus_inf_padding_rows",
         [("pytorch/pytorch#103749", GH + "pytorch/pytorch/issues/103749")],
         "A padding mask with an all-masked query row made attention return NaN; filling with -inf (rather "
         "than the dtype's minimum) turns that row's softmax into 0/0.",
         "masking_utils.eager_mask fills with -inf instead of finfo(dtype).min.",
         models.llama, _p(patches.eager_mask_minus_inf),
         lambda: w.nan_logits(models.llama, _p(patches.eager_mask_minus_inf), **LEFT_PADDED), ["finite_outputs"]),
    _bug("pytorch63271_padding_masks_query_rows",
         [("pytorch/pytorch#63271", GH + "pytorch/pytorch/issues/63271")],
         "Since PyTorch 1.9, multi_head_attention_forward with a 3D attn_mask and a key_padding_mask masked padded "
         "positions as queries too: their rows were all -inf and the output NaN, right padding included.",
         "masking_utils.padding_mask_function masks padded query rows as well as padded keys, and eager_mask "
         "fills with -inf (as torch's MHA did).",
         models.llama, _p(patches.padding_masks_query_rows),
         lambda: w.nan_logits(models.llama, _p(patches.padding_masks_query_rows), **RIGHT_PADDED),
         ["finite_outputs"]),
    _bug("pytorch103963_sdpa_bool_mask_empty_rows",
         [("pytorch/pytorch#103963", GH + "pytorch/pytorch/issues/103963")],
         "scaled_dot_product_attention returned NaN for a boolean attn_mask with an all-False row; a left-padded "
         "query is such a row, and its NaN value reaches real tokens at the next layer as 0 * NaN.",
         "torch.nn.functional.scaled_dot_product_attention (as transformers' sdpa kernel calls it) divides "
         "0 by 0 on an all-masked row.",
         functools.partial(models.llama, attn="sdpa"), _p(patches.sdpa_nan_on_empty_rows),
         lambda: w.nan_logits(functools.partial(models.llama, attn="sdpa"), _p(patches.sdpa_nan_on_empty_rows),
                              **LEFT_PADDED), ["finite_outputs"]),
    _bug("pytorch109517_mem_efficient_additive_rows",
         [("pytorch/pytorch#109517", GH + "pytorch/pytorch/issues/109517"),
          ("same root cause: pytorch/pytorch#103749", GH + "pytorch/pytorch/issues/103749")],
         "The memory-efficient SDPA kernel produced NaN for additive masks whose row was all finfo.min, the "
         "form transformers 4.3x handed to SDPA for padded batches.",
         "transformers' sdpa masks become the additive finfo.min form and scaled_dot_product_attention "
         "returns NaN on a row with no admitted key.",
         models.gpt2, _p(patches.sdpa_nan_on_empty_rows, additive_mask=True),
         lambda: w.nan_logits(models.gpt2, _p(patches.sdpa_nan_on_empty_rows, additive_mask=True), **LEFT_PADDED),
         ["finite_outputs"]),
    _bug("hf25681_llama_inv_freq_bf16",
         [("huggingface/transformers#25681", GH + "huggingface/transformers/issues/25681")],
         "Casting a Llama model to bfloat16 cast the rotary inv_freq buffer too, so the cos/sin tables were "
         "built from bf16 frequencies: the phase error grows with position.",
         "LlamaRotaryEmbedding.forward uses inv_freq rounded to bfloat16 (the buffer after .to(bfloat16)).",
         LLAMA_LONG, _p(patches.rotary_low_precision, "transformers.models.llama.modeling_llama",
                        "LlamaRotaryEmbedding", "inv_freq_bf16"),
         lambda: w.rotary_tables(LLAMA_LONG, _p(patches.rotary_low_precision,
                                                "transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding",
                                                "inv_freq_bf16"), lambda m: m.model.rotary_emb, 2000),
         ["rotary_precision"]),
    _bug("hf29496_mistral_inv_freq_bf16",
         [("huggingface/transformers#29496", GH + "huggingface/transformers/issues/29496")],
         "Under bf16 mixed precision Mistral rebuilt its sin/cos caches from a bf16 inv_freq once the input "
         "reached the maximum length, degrading long inputs.",
         "MistralRotaryEmbedding.forward uses inv_freq rounded to bfloat16.",
         MISTRAL_LONG, _p(patches.rotary_low_precision, "transformers.models.mistral.modeling_mistral",
                          "MistralRotaryEmbedding", "inv_freq_bf16"),
         lambda: w.rotary_tables(MISTRAL_LONG, _p(patches.rotary_low_precision,
                                                  "transformers.models.mistral.modeling_mistral",
                                                  "MistralRotaryEmbedding", "inv_freq_bf16"),
                                 lambda m: m.model.rotary_emb, 2000), ["rotary_precision"]),
    _bug("hf29285_gemma_rope_autocast_bf16",
         [("huggingface/transformers#29285", GH + "huggingface/transformers/pull/29285")],
         "Under bfloat16 autocast the RoPE product position x inv_freq ran in bf16 in Llama and Gemma, losing "
         "the positional signal at long context.",
         "GemmaRotaryEmbedding.forward computes position x inv_freq in bfloat16.",
         models.gemma, _p(patches.rotary_low_precision, "transformers.models.gemma.modeling_gemma",
                          "GemmaRotaryEmbedding", "phase_bf16"),
         lambda: w.rotary_tables(models.gemma, _p(patches.rotary_low_precision,
                                                  "transformers.models.gemma.modeling_gemma",
                                                  "GemmaRotaryEmbedding", "phase_bf16"),
                                 lambda m: m.model.rotary_emb, 1857), ["rotary_precision"]),
    _bug("gptneox1003_rotary_tables_fp16",
         [("EleutherAI/gpt-neox#1003", GH + "EleutherAI/gpt-neox/issues/1003")],
         "GPT-NeoX's RotaryEmbedding built its cos/sin tables in the model's fp16/bf16: for large position x "
         "frequency products the rounding is a sizeable fraction of the period (cos off by 0.78 at 1857).",
         "GPTNeoXRotaryEmbedding.forward computes inv_freq, phase, cos and sin in float16 (partial rotary).",
         models.gpt_neox, _p(patches.rotary_low_precision, "transformers.models.gpt_neox.modeling_gpt_neox",
                             "GPTNeoXRotaryEmbedding", "tables_fp16"),
         lambda: w.rotary_tables(models.gpt_neox, _p(patches.rotary_low_precision,
                                                     "transformers.models.gpt_neox.modeling_gpt_neox",
                                                     "GPTNeoXRotaryEmbedding", "tables_fp16"),
                                 lambda m: m.gpt_neox.rotary_emb, 1857), ["rotary_precision"]),
    _bug("hf38290_opt_scale_twice",
         [("huggingface/transformers#38290", GH + "huggingface/transformers/pull/38290")],
         "OPT multiplied its queries by 1/sqrt(d_head) and then let the attention kernel apply its default "
         "scale again.",
         "OPT's eager_attention_forward scales by module.scaling although q_proj(x) * scaling already did.",
         models.opt, _p(patches.opt_scale_twice),
         lambda: w.logits_move(models.opt, _p(patches.opt_scale_twice), LONG), ["kernel_consistency"]),
    _bug("torchtune1791_dropout_in_eval",
         [("meta-pytorch/torchtune#1791", GH + "meta-pytorch/torchtune/issues/1791"),
          ("fix: meta-pytorch/torchtune#1803", GH + "meta-pytorch/torchtune/pull/1803")],
         "The attention module passed its dropout probability straight to scaled_dot_product_attention, which "
         "applies dropout regardless of eval mode.",
         "transformers' sdpa kernel receives module.attention_dropout (0.5) in eval mode.",
         functools.partial(models.llama, attn="sdpa", attention_dropout=0.5), _p(patches.dropout_in_eval),
         lambda: w.eval_not_deterministic(functools.partial(models.llama, attn="sdpa", attention_dropout=0.5),
                                          _p(patches.dropout_in_eval), LONG),
         ["kernel_consistency", "batch_independence"]),
    _bug("tl1609_bridge_mask_blind_positions",
         [("TransformerLensOrg/TransformerLens#1609", GH + "TransformerLensOrg/TransformerLens/issues/1609"),
          ("fix: TransformerLensOrg/TransformerLens#1610", GH + "TransformerLensOrg/TransformerLens/pull/1610")],
         "TransformerBridge.forward ignored the attention_mask when it derived position_ids, so a left-padded "
         "prompt got shifted absolute positions: one pad moved gpt2's loss from 4.50 to 13.59.",
         "TransformerBridge._accepts_derived_position_ids returns False (the mask-based derivation is skipped); "
         "the model is a user's function around the bridge that passes the mask and no positions.",
         models.gpt2, _p(bridge_user.mask_blind_positions),
         lambda: bridge_user.left_pad_moves_logits(models.gpt2, _p(bridge_user.mask_blind_positions)),
         ["padding_outputs"], wrap="bridge_user"),
    _bug("nnsight672_left_pad_positions",
         [("ndif-team/nnsight#672", GH + "ndif-team/nnsight/issues/672"),
          ("fix: ndif-team/nnsight#673", GH + "ndif-team/nnsight/pull/673")],
         "A batched LanguageModel.trace left-padded the prompts but passed no position_ids, so on GPT-2 every "
         "prompt shorter than the longest read shifted learned positions; one pad already flipped most top-1s.",
         "nnsight.modeling.processing.supply_position_ids does nothing (the fix reverted); the model is a "
         "user's batched trace with one invoke per prompt.",
         models.gpt2, _p(nnsight_user.no_left_pad_positions),
         lambda: nnsight_user.short_prompt_moves(models.gpt2, _p(nnsight_user.no_left_pad_positions)),
         ["padding_outputs"], wrap="nnsight_user"),
    _bug("hf48745_decoder_attends_to_future",
         [("huggingface/transformers#48745", GH + "huggingface/transformers/issues/48745")],
         "Since transformers 5.9, RoFormer, BigBird, RemBert and MegatronBert used as causal LMs "
         "(is_decoder=True) let each position see the tokens after it; causal-LM training loss collapsed.",
         "modeling_roformer.create_causal_mask builds the bidirectional mask.",
         models.roformer, _p(patches.decoder_gets_bidirectional_mask),
         lambda: w.future_moves_past(models.roformer, _p(patches.decoder_gets_bidirectional_mask), LONG),
         ["causal_outputs"]),
    _bug("xformers103_causal_skipped_without_mask",
         [("facebookresearch/xformers#103", GH + "facebookresearch/xformers/issues/103"),
          ("the same slip: huggingface/transformers#48770", GH + "huggingface/transformers/pull/48770")],
         "The causal mask was applied only when an attention mask tensor was passed, so a call without one "
         "attended to the future (Doge hit the same under sdpa's is_causal fast path).",
         "transformers' sdpa kernel is called with is_causal=False whenever the model passes no mask "
         "(an unpadded causal batch).",
         functools.partial(models.llama, attn="sdpa"), _p(patches.sdpa_causal_skipped_without_mask),
         lambda: w.future_moves_past(functools.partial(models.llama, attn="sdpa"),
                                     _p(patches.sdpa_causal_skipped_without_mask), LONG),
         ["causal_outputs", "kernel_consistency"]),
    _bug("labml146_softmax_over_queries",
         [("labmlai/annotated_deep_learning_paper_implementations#146",
           GH + "labmlai/annotated_deep_learning_paper_implementations/issues/146")],
         "A self-attention softmax ran over the query axis instead of the key axis, so weights no longer "
         "formed a distribution over keys (and a causal model's normalizer saw later queries).",
         "Llama's eager_attention_forward normalizes with softmax(dim=-2).",
         models.llama, _p(patches.softmax_over_queries),
         lambda: w.future_moves_past(models.llama, _p(patches.softmax_over_queries), LONG),
         ["causal_outputs", "kernel_consistency"]),
    _bug("llamacpp8444_gemma2_scale_from_width",
         [("ggml-org/llama.cpp#8444", GH + "ggml-org/llama.cpp/pull/8444"),
          ("fix: ggml-org/llama.cpp#8473", GH + "ggml-org/llama.cpp/pull/8473")],
         "llama.cpp scaled Gemma-2's queries by 1/sqrt(n_embd / n_head) = 1/sqrt(224) for the 9B, whose config "
         "declares query_pre_attn_scalar 256: every score was 7% too large, and nothing else about the model moved.",
         "Gemma2Attention.__init__ sets scaling = (hidden_size / num_attention_heads)**-0.5 = 8**-0.5 where the "
         "config declares query_pre_attn_scalar**-0.5 = 24**-0.5 (head_dim 16).",
         models.gemma2, _p(patches.gemma2_scale_from_width),
         lambda: w.weights_at_scale(models.gemma2, _p(patches.gemma2_scale_from_width),
                                    "transformers.models.gemma2.modeling_gemma2", 24 ** -0.5, 8 ** -0.5, LONG),
         ["attention_scale"]),
    _bug("unsloth6197_llama31_rope_scaling_dropped",
         [("unslothai/unsloth#6197", GH + "unslothai/unsloth/pull/6197"),
          ("the same omission: felafax/felafax#59", GH + "felafax/felafax/issues/59")],
         "Llama 3.1's rope_scaling (rope_type llama3) was dropped on unsloth's fast path, so the model rotated "
         "with plain RoPE frequencies: the low-frequency bands turned up to 8x too fast and long inputs turned "
         "to gibberish.",
         "ROPE_INIT_FUNCTIONS['llama3'] returns the plain frequencies base^(-2i/d) (no division by factor, "
         "no smoothing).",
         models.llama31, _p(patches.rope_init, "llama3", "plain"),
         lambda: w.rotary_against_formula(models.llama31, _p(patches.rope_init, "llama3", "plain"), _rotary,
                                          _llama3, 2000, "Llama 3.1's scaled frequencies"),
         ["rotary_frequencies"]),
    _bug("sglang33558_yarn_factor_twice",
         [("sgl-project/sglang#33558", GH + "sgl-project/sglang/pull/33558")],
         "transformers' YaRN attention_factor is the final mscale, but SGLang multiplied it by its own "
         "0.1 ln(factor) + 1 again, squaring the factor on cos/sin (1.485 -> 2.206 for factor 128).",
         "ROPE_INIT_FUNCTIONS['yarn'] returns the config's attention_factor times 0.1 ln(factor) + 1.",
         QWEN2_YARN_EXPLICIT, _p(patches.rope_init, "yarn", "explicit_factor_times_mscale"),
         lambda: w.rotary_factor(QWEN2_YARN_EXPLICIT, _p(patches.rope_init, "yarn", "explicit_factor_times_mscale"),
                                 _rotary, YARN_MSCALE_4),
         ["rotary_frequencies"]),
    _bug("vllm46280_yarn_explicit_factor_ignored",
         [("vllm-project/vllm#46280", GH + "vllm-project/vllm/pull/46280"),
          ("the same in ml-explore/mlx-lm#1507", GH + "ml-explore/mlx-lm/pull/1507")],
         "vLLM's YaRN never received the config's explicit attention_factor and applied 0.1 ln(factor) + 1 "
         "instead: Laguna-XS.2 declares 1.0 and ran with 1.416.",
         "ROPE_INIT_FUNCTIONS['yarn'] ignores the config's attention_factor (1.0) and returns 0.1 ln(4) + 1.",
         QWEN2_YARN_ONE, _p(patches.rope_init, "yarn", "explicit_factor_ignored"),
         lambda: w.rotary_factor(QWEN2_YARN_ONE, _p(patches.rope_init, "yarn", "explicit_factor_ignored"), _rotary,
                                 1.0),
         ["rotary_frequencies"]),
    _bug("specforge265_rope_theta_ignored",
         [("sgl-project/SpecForge#265", GH + "sgl-project/SpecForge/issues/265"),
          ("the same in young-geng/EasyLM#117", GH + "young-geng/EasyLM/pull/117")],
         "The EAGLE-3 draft model's rotary embedding never read rope_theta from the config, so a Qwen2.5 draft "
         "(base 1e6) rotated with the default base 10000.",
         "Qwen2RotaryEmbedding.compute_default_rope_parameters uses base 10000 where rope_theta is 1e6.",
         models.qwen2, _p(patches.rope_theta_ignored, "transformers.models.qwen2.modeling_qwen2",
                          "Qwen2RotaryEmbedding"),
         lambda: w.rotary_against_formula(models.qwen2, _p(patches.rope_theta_ignored,
                                                           "transformers.models.qwen2.modeling_qwen2",
                                                           "Qwen2RotaryEmbedding"),
                                          _rotary, _plain, 2000, "base^(-2i/d), base = rope_theta 1e6"),
         ["rotary_frequencies"]),
    _bug("mlxvlm1709_gemma3_global_linear_factor_ignored",
         [("Blaizzy/mlx-vlm#1709", GH + "Blaizzy/mlx-vlm/pull/1709"),
          ("the same in lablup/mlxcel#1340", GH + "lablup/mlxcel/issues/1340"),
          ("fix: lablup/mlxcel#1386", GH + "lablup/mlxcel/pull/1386")],
         "Gemma-3 (4B and up) declares linear rope scaling, factor 8, for its global layers only; ports that "
         "parsed rope_scaling and never applied it rotated the global layers at 8x the trained positions, "
         "fluent on short prompts and degenerate on long ones.",
         "ROPE_INIT_FUNCTIONS['linear'] returns the unscaled frequencies (Gemma-3's full_attention layers); "
         "the sliding layers (default, base 10000) are untouched.",
         models.gemma3, _p(patches.rope_init, "linear", "plain"),
         lambda: w.rotary_against_formula(models.gemma3, _p(patches.rope_init, "linear", "plain"),
                                          functools.partial(_rotary, layer_type="full_attention"),
                                          lambda c: _plain(c, 1e6) / 8.0, 2000,
                                          "the full layers' base 1e6 frequencies / 8"),
         ["rotary_frequencies"]),
    _bug("mlxlm1698_glm_partial_rotary_ignored",
         [("ml-explore/mlx-lm#1698", GH + "ml-explore/mlx-lm/pull/1698")],
         "mlx-lm's GLM built its RoPE over the whole head_dim although GLM declares partial_rotary_factor 0.5: "
         "every dimension of q and k turned where the checkpoint was trained with the first half turning.",
         "GlmRotaryEmbedding.compute_default_rope_parameters ignores partial_rotary_factor (frequencies for all "
         "16 dims), so apply_rotary_pos_emb turns the whole head.",
         models.glm, _p(patches.partial_rotary_ignored, "transformers.models.glm.modeling_glm",
                        "GlmRotaryEmbedding"),
         lambda: w.pass_through_turns(models.glm, _p(patches.partial_rotary_ignored,
                                                     "transformers.models.glm.modeling_glm", "GlmRotaryEmbedding"),
                                      _rotary, _glm_apply, 8, 100),
         ["rotary_frequencies"]),
    _bug("vllm21863_window_on_full_layers",
         [("vllm-project/vllm#21863", GH + "vllm-project/vllm/pull/21863"),
          ("the same on Command-R7B: vllm-project/vllm#11357", GH + "vllm-project/vllm/issues/11357"),
          ("fix: vllm-project/vllm#11583", GH + "vllm-project/vllm/pull/11583")],
         "vLLM fell back to the model-wide sliding_window for layers whose own window was None, so the global "
         "layers of Gemma-3n (pattern LLLG) and Cohere2 attended through the window too.",
         "modeling_gemma3.create_causal_mask (the full_attention layers' mask) ANDs sliding_window_overlay(w); "
         "the full layers keep their full cache.",
         models.gemma3, _p(patches.window_on_full_layers, "transformers.models.gemma3.modeling_gemma3"),
         lambda: w.keys_per_layer(models.gemma3, _p(patches.window_on_full_layers,
                                                    "transformers.models.gemma3.modeling_gemma3"),
                                  LONG, FULL_LAYER_KEYS),
         ["window_layout"]),
]

# False alarms of the suite on the unpatched models above, each traced to its cause (none may be the
# replayed bug): tests/test_field_bugs.py expects them (strictly), docs/field-bugs.md names them. Empty since
# HFAdapter declares OPT's effective scale and RoFormer's offset rule (both were listed here before).
KNOWN_FALSE_ALARMS: dict[str, str] = {}
