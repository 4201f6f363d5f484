"""Where each finding's bug lives: the installed modeling code's lines at fault, found by pattern at generation time.

A reproduction names the file, the line number, the function and the line itself (``site``), read from the installed
transformers or TransformerLens source, so a maintainer lands on the code and the report follows the release it was
made with. A pattern that no longer matches raises: the code moved or changed, and the finding needs a new look.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import transformers


class SiteNotFound(LookupError):
    """The modeling code no longer holds the line a finding blames: re-check the finding on this release."""


def _owner(lines: list[str], i: int) -> str:
    """The ``Class.function`` enclosing line ``i`` (by indentation)."""
    names, indent = [], len(lines[i]) - len(lines[i].lstrip())
    for line in reversed(lines[:i]):
        m = re.match(r"(\s*)(?:async\s+)?(def|class)\s+(\w+)", line)
        if m and len(m.group(1)) < indent:
            names.append(m.group(3))
            indent = len(m.group(1))
            if indent == 0:
                break
    return ".".join(reversed(names)) or "module level"


def site(module: str, pattern: str, after: str = "") -> str:
    """``path:line (Class.function): code`` of the first line of ``module`` matching ``pattern`` (past the first
    line matching ``after``, when given); the path starts at the package (``transformers/models/...``)."""
    path = Path(inspect.getsourcefile(importlib.import_module(module)) or "")
    lines = path.read_text().splitlines()
    start = 0
    if after:
        start = next((i for i, line in enumerate(lines) if re.search(after, line)), -1)
        if start < 0:
            raise SiteNotFound(f"{module}: no line matches {after!r}")
    found = next((i for i in range(start, len(lines)) if re.search(pattern, lines[i])), -1)
    if found < 0:
        raise SiteNotFound(f"{module}: no line matches {pattern!r}" + (f" after {after!r}" if after else ""))
    rel = module.replace(".", "/") + ".py"
    owner = _owner(lines, found)
    named = re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", lines[found])
    owner = f"{owner}.{named.group(1)}" if named and owner != "module level" else named.group(1) if named else owner
    return f"{rel}:{found + 1} ({owner}): {lines[found].strip()}"


def _module(class_name: str) -> str:
    return getattr(transformers, class_name).__module__


def _left_pad(model_type: str, class_name: str) -> list[str]:
    mod = _module(class_name)
    return [site(mod, r"def forward\(", after=rf"^class {class_name}\(") + "  -- no position_ids parameter",
            site(mod, r"torch\.arange\(.*(cache_length|past_key_values_length)|self\.embed_positions\(|"
                      r"self\.position_embeddings\(", after=r"^class \w+Decoder\(")]


_LEAKS = {"convbert": ("ConvBertSelfAttention", r"self\.key_conv_attn_layer\(hidden_states",
                       "the span convolution reads the pad's hidden state; the mask only reaches the attention scores"),
          "mobilebert": ("MobileBertEmbeddings", r"if self\.trigram_input:",
                         "the trigram concatenates each token's neighbours' embeddings, the pad's included"),
          "yoso": ("YosoSelfAttention", r"attention_mask = 1\.0 \+ attention_mask",
                   "YosoModel passes the 0/1 mask, not an additive one: .int() of 1 + mask / 10000 is 1 for a pad "
                   "too, so no key is masked"),
          "recurrent_gemma": ("RecurrentGemmaRecurrentBlock", r"self\.conv_1d\(x_branch\)",
                              "the temporal convolution and the RG-LRU never read attention_mask"),
          "rwkv": ("RwkvModel", r"attention_mask. was passed, but it is unused",
                   "the recurrence never reads attention_mask")}


def _leak(model_type: str, class_name: str) -> list[str]:
    owner, pattern, why = _LEAKS[model_type]
    return [site(_module(class_name), pattern, after=rf"^class {owner}\(") + f"  -- {why}"]


def _moshi(model_type: str, class_name: str) -> list[str]:
    mod = _module(class_name)
    return [site(mod, r"self\.sliding_window = config\.sliding_window", after=r"^class MoshiAttention\(")
            + "  -- stored, never passed on",
            site(mod, r"attention_interface\(", after=r"^class MoshiAttention\(") + "  -- no sliding_window=",
            site(mod, r"create_causal_mask\(", after=r"^class MoshiModel\(") + "  -- no sliding-window mask"]


def _prophetnet(model_type: str, class_name: str) -> list[str]:
    mod = _module(class_name)
    # not pinned to one line: the id of a later token reaches nothing, only how many follow, so where to start
    # looking is what the decoder derives from the sequence length (positions, relative buckets)
    where = "  -- where to start: the script shows the effect, the line is not pinned"
    return [site(mod, r"main_stream_pos_embed, position_ids = self\.position_embeddings\(",
                 after=r"^class ProphetNetDecoder\(") + where,
            site(mod, r"def compute_buffered_relative_buckets") + where]


def _deepseek_v4(model_type: str, class_name: str) -> list[str]:
    return [site(_module(class_name), r"causal_threshold = \(position_ids \+ 1\) // self\.compress_rate")]


def _recurrent_gemma(model_type: str, class_name: str) -> list[str]:
    return [site(_module(class_name), r"if position_ids\.shape\[1\] != 1:\s+# prefill")]


def _jamba(model_type: str, class_name: str) -> list[str]:
    mod = _module(class_name)
    return [site(mod, r"TODO.*does not take the past state, it is WRONG if the cache is not empty",
                 after=r"^def mamba_scan_forward\("),
            site(mod, r"scan_output = mamba_selective_scan\(", after=r"^def mamba_scan_forward\(")
            + "  -- a chunk of several tokens after the cache's state starts the scan from zero"]


def _longrope(model_type: str, class_name: str) -> list[str]:
    return [site("transformers.modeling_rope_utils", r"inv_freq = torch\.where\(seq_len > original_max_position")]


def _inv_freq(model_type: str, class_name: str) -> list[str]:
    return [site(_module(class_name), r'register_buffer\("inv_freq"|self\.inv_freq = nn\.Buffer\(',
                 after=r"^class \w+RotaryEmbedding\(")
            + "  -- a buffer, so Module.to(float16) rounds it"]


_TL = "transformer_lens.model_bridge.generalized_components.attention"


def _bridge_causal(model_type: str, class_name: str) -> list[str]:
    return [site(_TL, r"use_direct_hf_mask = attention_mask is not None and attention_mask\.ndim >= 4")
            + "  -- OpenAI GPT's 4D mask holds padding only (its causal mask is the attention's `bias` buffer)",
            site(_module(class_name), r"attention_mask = attention_mask\.unsqueeze\(1\)\.unsqueeze\(2\)",
                 after=r"^class OpenAIGPTModel\(")]


def _bridge_scores(model_type: str, class_name: str) -> list[str]:
    return [site(_TL, r"self\.hook_attn_scores, second_element")
            + "  -- the HF module's returned weights are post-softmax"]


def _bridge_z(model_type: str, class_name: str) -> list[str]:
    return [site(_TL, r'"hook_z": "o\.hook_in"')]


def _bridge_v(model_type: str, class_name: str) -> list[str]:
    return [site(_TL, r'"hook_v": "v\.hook_out"'),
            site(_module(class_name), r"self\.v_norm\(", after=r"^class Gemma4\w*Attention\(")]


def _softcap(model_type: str, class_name: str) -> list[str]:
    mod = _module(class_name)
    return [site(mod, r"self\.attn_logit_softcapping = self\.config\.attn_logit_softcapping",
                 after=r"^class Gemma3Attention\(") + "  -- stored, never passed on",
            site(mod, r"attention_interface\(", after=r"^class Gemma3Attention\(") + "  -- no softcap="]


def _rotary_dim(model_type: str, class_name: str) -> list[str]:
    mod = _module(class_name)
    return [site(mod, r"dim = int\(head_dim \* partial_rotary_factor\)", after=r"^class \w*RotaryEmbedding\(")
            + "  -- rotary_dim is never read",
            site(mod, r"rotary_dim = cos\.shape\[-1\]") + "  -- every channel cos covers turns"]


SITES: dict[str, Callable[[str, str], list[str]]] = {
    "left_padding_moves_positions": _left_pad, "padding_leaks_into_real_tokens": _leak, "window_ignored": _moshi,
    "logits_depend_on_length": _prophetnet, "future_leaks_after_an_offset": _deepseek_v4,
    "left_pad_shifts_compressed_windows": _deepseek_v4, "chunked_prefill_drops_state": _recurrent_gemma,
    "cached_chunk_differs": _jamba, "longrope_cached_step_differs": _longrope, "inv_freq_rounded_by_to": _inv_freq,
    "bridge_not_causal": _bridge_causal, "bridge_attn_scores_is_pattern": _bridge_scores,
    "bridge_z_is_o_proj_input": _bridge_z, "bridge_v_before_v_norm": _bridge_v, "softcap_ignored": _softcap,
    "rotary_dim_ignored": _rotary_dim}
