"""Each field bug, replayed as a small patch of the library function it lived in (or its modern heir).

A patch is a context manager: inside it the named transformers / TransformerLens / PyTorch
function computes what the buggy version computed; on exit the original is back. Build and wrap
the model inside the context when a patch must be seen at construction time. Every patch keeps
the function's signature, so the model runs exactly as it would have on the buggy release.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from unittest import mock

import torch
from transformers import masking_utils
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def _registry_patch(registry, original, replacement):
    """Replace ``original`` under every name it is registered as (HFAdapter registers kernels and masks again
    under ``attnlab_<kernel>``, holding the function object it found then)."""
    names = {k: replacement for k, v in registry._global_mapping.items() if v is original}
    return mock.patch.dict(registry._global_mapping, names)


# --- sliding windows (transformers #29623, vLLM #3385, transformers #39408) -----------------------


@contextlib.contextmanager
def window_overlay(extra: int) -> Iterator[None]:
    """``sliding_window_overlay`` admitting ``w + extra`` keys instead of w (``extra`` -1 or +1)."""

    def overlay(sliding_window: int):
        def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
            return kv_idx > q_idx - sliding_window - extra

        return inner_mask

    with mock.patch.object(masking_utils, "sliding_window_overlay", overlay):
        yield


@contextlib.contextmanager
def flash_window_both_sides() -> Iterator[None]:
    """The sdpa kernel given FlashAttention's ``window_size=(w, w)``: under causality keys i - w .. i.

    transformers #39408: ``flash_kwargs = {"window_size": (sliding_window, sliding_window)}``, and
    FlashAttention's window is inclusive on both sides, so a query saw w + 1 keys. The mask the
    model built (and so the explicit pattern) still admits w; only the kernel differs.
    """
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def kernel(module, query, key, value, attention_mask, *args, sliding_window=None, **kwargs):
        if sliding_window is not None:
            q, k = query.shape[-2], key.shape[-2]
            i = torch.arange(k - q, k, device=query.device)[:, None]
            j = torch.arange(k, device=query.device)[None, :]
            band = (j <= i) & (j >= i - sliding_window)  # inclusive (w, 0) window: w + 1 keys
            if attention_mask is not None:  # keep the padding part of the model's mask
                padding = attention_mask.bool() if attention_mask.dtype == torch.bool else attention_mask == 0
                band = band & padding.any(-2, keepdim=True)
            attention_mask = band.expand(query.shape[0], 1, q, k)
            kwargs["is_causal"] = False
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    with _registry_patch(ALL_ATTENTION_FUNCTIONS, original, kernel):
        yield


# --- ALiBi slopes (paiml/aprender #2143, ofirpress/attention_with_linear_biases #17) ------------


@contextlib.contextmanager
def bloom_slopes(rule: str) -> Iterator[None]:
    """Bloom's ``_get_alibi_slopes`` with a wrong rule.

    ``"exponent_off_by_one"``: 2^(-8h/n) for h = 0..n-1 (aprender #2143: slope[0] = 1);
    ``"plain_geometric"``: 2^(-8h/n), h = 1..n, for every n (no non-power-of-two rule, #17).
    """
    from transformers.models.bloom import modeling_bloom

    def slopes(num_heads: int, device: torch.device) -> torch.Tensor:
        h = torch.arange(num_heads, device=device, dtype=torch.float32)
        if rule == "plain_geometric":
            h = h + 1
        return 2.0 ** (-8.0 * h / num_heads)

    with mock.patch.object(modeling_bloom, "_get_alibi_slopes", slopes):
        yield


# --- fully masked rows (PyTorch #103749, #103963, #109517) ---------------------------------------


@contextlib.contextmanager
def eager_mask_minus_inf() -> Iterator[None]:
    """``masking_utils.eager_mask`` filling with -inf instead of ``finfo.min`` (PyTorch #103749's naive path).

    The issue's repro: a softmax over a row whose every entry is -inf is 0/0 = NaN, where
    ``torch.finfo(dtype).min`` keeps the row finite. A left-padded query in a causal model is such a row.
    """
    original = masking_utils.eager_mask

    def eager_mask(*args, **kwargs):
        mask = original(*args, **kwargs)
        return None if mask is None else mask.masked_fill(mask == torch.finfo(mask.dtype).min, -math.inf)

    with _registry_patch(masking_utils.ALL_MASK_ATTENTION_FUNCTIONS, original, eager_mask):
        yield


def _pre_fix_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                  **_):
    """``scaled_dot_product_attention`` as the affected kernels computed it: an all-masked row is 0/0 = NaN.

    PyTorch #103963 (boolean mask with an all-False row) and #109517 (memory-efficient kernel, an
    additive row of ``finfo.min``): the softmax of a row with no admitted key divided zero by zero.
    Fixed since PyTorch 2.1/2.5, where such rows return 0; replayed in float64 math otherwise.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    scores = (query @ key.transpose(-1, -2)) * scale
    q, k = scores.shape[-2:]
    if is_causal:
        scores = scores.masked_fill(~torch.ones(q, k, dtype=torch.bool, device=scores.device).tril(k - q), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:  # the additive form; finfo.min + score overflowed to -inf in the kernel's accumulation
            scores = (scores + attn_mask).masked_fill(attn_mask <= torch.finfo(attn_mask.dtype).min / 2, -math.inf)
    return scores.softmax(-1).to(value.dtype) @ value  # a float32 additive mask promotes bf16/fp16 scores


@contextlib.contextmanager
def sdpa_nan_on_empty_rows(additive_mask: bool = False) -> Iterator[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` with the pre-fix behaviour on empty rows.

    With ``additive_mask`` the masks transformers hands to sdpa are the float ``finfo.min`` form of
    transformers 4.3x (``_prepare_4d_causal_attention_mask_for_sdpa``), as in #109517.
    """
    from transformers.integrations import sdpa_attention

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(sdpa_attention.torch.nn.functional, "scaled_dot_product_attention",
                                              _pre_fix_sdpa))
        if additive_mask:
            original = masking_utils.sdpa_mask

            def sdpa_mask(*args, **kwargs):
                kwargs["allow_is_causal_skip"] = False
                mask = original(*args, **kwargs)
                if mask is None:
                    return None
                zero = torch.zeros((), dtype=torch.float32, device=mask.device)
                return torch.where(mask, zero, torch.finfo(torch.float32).min)

            stack.enter_context(_registry_patch(masking_utils.ALL_MASK_ATTENTION_FUNCTIONS, original, sdpa_mask))
        yield


# --- rotary precision (transformers #25681, #29496, #29285; gpt-neox #1003) ---------------------


@contextlib.contextmanager
def rotary_low_precision(module_path: str, cls_name: str, how: str) -> Iterator[None]:
    """A ``<Model>RotaryEmbedding.forward`` computing its tables in low precision.

    ``"inv_freq_bf16"``: inv_freq rounded to bfloat16 (what ``model.to(torch.bfloat16)`` does to the
    buffer, #25681); ``"phase_bf16"``: positions and phase in bfloat16 (#29496, caches rebuilt in bf16
    under mixed precision; #29285, the product autocast to bf16); ``"tables_fp16"``: inv_freq, phase,
    cos and sin all in float16 (gpt-neox #1003).
    """
    import importlib

    cls = getattr(importlib.import_module(module_path), cls_name)

    def forward(self, x, position_ids):
        inv = self.inv_freq.to(x.device)
        if how == "inv_freq_bf16":
            freqs = position_ids[..., None].float() * inv.to(torch.bfloat16).float()
        elif how == "phase_bf16":
            freqs = (position_ids[..., None].to(torch.bfloat16) * inv.to(torch.bfloat16)).float()
        elif how == "tables_fp16":
            freqs = position_ids[..., None].half() * inv.half()
        else:
            raise ValueError(f"how={how!r} is not one of inv_freq_bf16, phase_bf16, tables_fp16")
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

    with mock.patch.object(cls, "forward", forward):
        yield


# --- scale, dropout (transformers #38290, torchtune #1791) -----------------------------------------


@contextlib.contextmanager
def opt_scale_twice() -> Iterator[None]:
    """OPT's eager attention scaling queries that ``q_proj(x) * scaling`` already scaled (transformers #38290)."""
    from transformers.models.opt import modeling_opt

    original = modeling_opt.eager_attention_forward

    def eager(module, query, key, value, attention_mask, scaling, *args, **kwargs):
        return original(module, query, key, value, attention_mask, module.scaling, *args, **kwargs)

    with mock.patch.object(modeling_opt, "eager_attention_forward", eager):
        yield


@contextlib.contextmanager
def dropout_in_eval() -> Iterator[None]:
    """The sdpa kernel handed the configured attention dropout in eval mode (torchtune #1791).

    ``scaled_dot_product_attention`` applies ``dropout_p`` whatever the module's training flag, so a
    caller must pass 0 outside training; torchtune passed ``self.attn_dropout`` unconditionally.
    """
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def kernel(module, query, key, value, attention_mask, *args, dropout=0.0, **kwargs):
        return original(module, query, key, value, attention_mask, *args, dropout=module.attention_dropout, **kwargs)

    with _registry_patch(ALL_ATTENTION_FUNCTIONS, original, kernel):
        yield


# --- causality and the softmax axis (transformers #48745, xformers #103, labml #146) ---------------


@contextlib.contextmanager
def decoder_gets_bidirectional_mask() -> Iterator[None]:
    """RoFormer's decoder building the bidirectional mask instead of the causal one (transformers #48745)."""
    from transformers.models.roformer import modeling_roformer

    def causal_mask(config, inputs_embeds, attention_mask, cache=None, **kwargs):
        return masking_utils.create_bidirectional_mask(config=config, inputs_embeds=inputs_embeds,
                                                       attention_mask=attention_mask)

    with mock.patch.object(modeling_roformer, "create_causal_mask", causal_mask):
        yield


@contextlib.contextmanager
def sdpa_causal_skipped_without_mask() -> Iterator[None]:
    """The sdpa kernel dropping causality when no mask tensor is passed (xformers #103).

    transformers leaves the mask out for an unpadded causal batch and relies on ``is_causal``; the
    bug treated "no mask" as "no masking at all".
    """
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def kernel(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is None:
            kwargs["is_causal"] = False
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    with _registry_patch(ALL_ATTENTION_FUNCTIONS, original, kernel):
        yield


@contextlib.contextmanager
def softmax_over_queries() -> Iterator[None]:
    """Llama's eager attention normalizing over the query axis (dim=-2) instead of the keys (labml #146)."""
    from transformers.models.llama import modeling_llama

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = modeling_llama.repeat_kv(key, module.num_key_value_groups)
        value_states = modeling_llama.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.softmax(weights, dim=-2, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value_states).transpose(1, 2).contiguous(), weights

    with mock.patch.object(modeling_llama, "eager_attention_forward", eager):
        yield


@contextlib.contextmanager
def padding_masks_query_rows() -> Iterator[None]:
    """The padding mask applied to the padded *queries'* rows as well as to their keys, with -inf fill.

    PyTorch #63271: ``multi_head_attention_forward`` merged a 3D attn_mask with key_padding_mask so that
    padded elements were masked in rows and columns; a padded query's row was then all -inf and its
    softmax NaN, even for right padding, where a padded query normally still sees the real keys before it.
    """
    def padding_mask_function(padding_mask):
        def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
            return padding_mask[batch_idx, kv_idx] & padding_mask[batch_idx, q_idx]

        return inner_mask

    with mock.patch.object(masking_utils, "padding_mask_function", padding_mask_function), eager_mask_minus_inf():
        yield


# --- the declared design: scale, rotary settings, per-layer windows (llama.cpp #8444, unsloth #6197, ...) ------


@contextlib.contextmanager
def gemma2_scale_from_width() -> Iterator[None]:
    """Gemma-2's query scale taken as 1/sqrt(hidden_size / num_attention_heads) (llama.cpp #8444).

    llama.cpp scaled Gemma-2's queries by ``1.0f / sqrtf(float(n_embd / n_head))``; the config's
    ``query_pre_attn_scalar`` (256 for the 9B, whose hidden_size / heads is 224) was not read.
    Acts at construction: ``Gemma2Attention.__init__`` sets ``scaling`` from the width.
    """
    from transformers.models.gemma2 import modeling_gemma2

    original = modeling_gemma2.Gemma2Attention.__init__

    def init(self, config, layer_idx):
        original(self, config, layer_idx)
        self.scaling = (config.hidden_size / config.num_attention_heads) ** -0.5

    with mock.patch.object(modeling_gemma2.Gemma2Attention, "__init__", init):
        yield


def _rope_parameters(config, layer_type=None) -> dict:
    return config.rope_parameters[layer_type] if layer_type is not None else config.rope_parameters


@contextlib.contextmanager
def rope_init(rope_type: str, how: str) -> Iterator[None]:
    """``modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]`` computing what a port that misread the config did.

    Acts at construction (the rotary modules call it in ``__init__``). ``how``:

    - ``"plain"``: the plain RoPE frequencies ``base^(-2i/d)``, the type's scaling skipped (``"llama3"``:
      unsloth #6197, felafax #59; ``"linear"`` on Gemma-3's global layers: mlx-vlm #1709, mlxcel #1340);
    - ``"explicit_factor_times_mscale"``: YaRN's explicit ``attention_factor`` multiplied by the computed
      ``0.1 ln(factor) + 1`` again (sglang #33558: the final mscale treated as a multiplier);
    - ``"explicit_factor_ignored"``: YaRN's explicit ``attention_factor`` ignored, ``0.1 ln(factor) + 1``
      used instead (vLLM #46280, mlx-lm #1507).
    """
    from transformers import modeling_rope_utils

    original = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]

    def init(config, device=None, seq_len=None, layer_type=None, **kwargs):
        inv_freq, attention_factor = original(config, device, seq_len=seq_len, layer_type=layer_type, **kwargs)
        params = _rope_parameters(config, layer_type)
        if how == "plain":
            base, dim = params["rope_theta"], inv_freq.shape[0] * 2
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)).to(inv_freq.device)
            return inv_freq, 1.0
        mscale = modeling_rope_utils.yarn_get_mscale(params["factor"])
        if how == "explicit_factor_times_mscale":
            return inv_freq, attention_factor * mscale
        if how == "explicit_factor_ignored":
            return inv_freq, mscale
        raise ValueError(f"how={how!r} is not one of plain, explicit_factor_times_mscale, explicit_factor_ignored")

    with mock.patch.dict(modeling_rope_utils.ROPE_INIT_FUNCTIONS, {rope_type: init}):
        yield


@contextlib.contextmanager
def rope_theta_ignored(module_path: str, cls_name: str) -> Iterator[None]:
    """``<Model>RotaryEmbedding.compute_default_rope_parameters`` with base 10000 whatever ``rope_theta`` says.

    SpecForge #265: the EAGLE-3 draft's rotary embedding never received the target's ``rope_theta``
    (1e6 for Qwen2.5), so it rotated with the default base 10000. Acts at construction.
    """
    import importlib

    cls = getattr(importlib.import_module(module_path), cls_name)
    original = cls.compute_default_rope_parameters

    def compute(config, *args, **kwargs):
        inv_freq, attention_factor = original(config, *args, **kwargs)
        dim = inv_freq.shape[0] * 2
        return 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)).to(inv_freq.device), \
            attention_factor

    with mock.patch.object(cls, "compute_default_rope_parameters", staticmethod(compute)):
        yield


@contextlib.contextmanager
def partial_rotary_ignored(module_path: str, cls_name: str) -> Iterator[None]:
    """``<Model>RotaryEmbedding.compute_default_rope_parameters`` ignoring ``partial_rotary_factor``.

    mlx-lm #1698: GLM's attention built its RoPE over the whole head_dim, so every dimension rotated
    where the config (partial_rotary_factor 0.5) turns the first half only. GLM's apply_rotary_pos_emb
    rotates ``cos.shape[-1]`` dims, so frequencies over the whole head turn the whole head. Acts at construction.
    """
    import importlib

    cls = getattr(importlib.import_module(module_path), cls_name)

    def compute(config, device=None, seq_len=None, **kwargs):
        base = config.rope_parameters["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)).to(device), 1.0

    with mock.patch.object(cls, "compute_default_rope_parameters", staticmethod(compute)):
        yield


@contextlib.contextmanager
def window_on_full_layers(module_path: str) -> Iterator[None]:
    """The model's full-attention mask built with the sliding window too (vLLM #21863, #11357).

    vLLM's attention layer fell back to the model-wide ``sliding_window`` where a layer's own was None,
    so Gemma-3n's and Command-R7B's global layers attended through the window. Replayed on the modeling
    module's ``create_causal_mask`` (the full layers' mask), ANDed with ``sliding_window_overlay``; the
    full layers keep their full cache and their kv length, so caching and padding still agree.
    """
    import importlib

    module = importlib.import_module(module_path)

    def create_causal_mask(config, *args, and_mask_function=None, **kwargs):
        window = masking_utils.sliding_window_overlay(config.sliding_window)
        both = window if and_mask_function is None else masking_utils.and_masks(window, and_mask_function)
        return masking_utils.create_causal_mask(config, *args, and_mask_function=both, **kwargs)

    with mock.patch.object(module, "create_causal_mask", create_causal_mask):
        yield
