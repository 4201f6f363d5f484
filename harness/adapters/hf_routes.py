"""How :class:`~harness.adapters.hf.HFAdapter` reaches inside a Hugging Face model: the route per architecture.

Two routes, both observing the model's own modules (nothing is reimplemented):

- ``"attention_interface"``: the modeling code calls
  ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, ...)`` (transformers >= 4.48,
  nearly every modern architecture). The adapter registers ``attnlab_<kernel>`` (e.g.
  ``attnlab_sdpa``) as an attention function and points the model at it; the function fires the
  attention hooks and calls the model's configured kernel for the output.
- ``"module_hooks"``: older modeling code computes attention inline (Bloom, Falcon, GPT-Neo, XGLM,
  MPT, OpenAI GPT). The adapter hooks the attention output projection (``hook_z`` = its input,
  ``hook_attn_out`` = its output) and reads ``hook_pattern`` from the attention module's output
  under ``output_attentions=True``; ``hook_q/k/v`` and ``hook_attn_scores`` never fire there.

Both routes take the residual hooks from the decoder layers' inputs and outputs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, Optional, cast

from torch import nn

from harness.adapters import source_text
from harness.adapters.hf_attention import PREFIX, observed_attention

INTERFACE = "attention_interface"
MODULE_HOOKS = "module_hooks"
ROUTES = (INTERFACE, MODULE_HOOKS)
# Names the attention output projection has across modeling files (the first match inside an
# attention module wins; an MLP's c_proj/dense sits under a module without "Attention" in its name).
OUT_PROJ_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "out_lin", "wo")
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "ln_final")
# Architectures listed in docs/models.md's route table (model_type as the HF config spells it).
TABLE_ARCHS = ("bert", "bloom", "codegen", "cohere", "distilbert", "falcon", "gemma", "gemma2", "gemma3_text",
               "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox", "gptj", "granite", "llama", "mistral", "mpt",
               "olmo", "olmo2", "openai-gpt", "opt", "phi", "phi3", "qwen2", "qwen3", "roberta", "roformer",
               "stablelm", "starcoder2", "xglm")


def uses_interface(module: nn.Module) -> bool:
    """Whether ``module``'s modeling file dispatches attention through transformers' AttentionInterface."""
    source_module = sys.modules.get(type(module).__module__)
    try:
        source = source_text.source(source_module) if source_module is not None else ""
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS.get_interface(" in source


def find_layers(hf_model: nn.Module, n_layers: Optional[int]) -> Optional[nn.ModuleList]:
    """The ModuleList of transformer blocks (the first of length ``n_layers``, else the longest)."""
    lists = [m for m in hf_model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    exact = [m for m in lists if n_layers is not None and len(m) == n_layers]
    if exact:
        return exact[0]
    return max(lists, key=len) if lists else None


def attention_layer_ids(layers: nn.ModuleList) -> list[int]:
    """The indices of the blocks that hold an attention module: every block, except in a hybrid stack."""
    return [i for i, layer in enumerate(layers) if attention_module(layer) is not None]


def _is_attention(module: nn.Module) -> bool:
    return "Attention" in type(module).__name__ or type(module).__name__ == "Attention"


def attention_module(layer: nn.Module) -> Optional[nn.Module]:
    """The innermost attention module of a block (e.g. BertSelfAttention inside BertAttention)."""
    found = [m for m in layer.modules() if _is_attention(m)]
    if not found:
        return None
    # innermost: an attention module none of whose descendants is an attention module
    leaves = [m for m in found if not any(_is_attention(c) for c in m.modules() if c is not m)]
    # attention over the sequence projects its queries and keys from the tokens (submodules with weights);
    # Inkling 2's BlockAttentionResidual, ahead of self_attn in its block, attends over the stack of earlier
    # layers' outputs of one token with a learned query parameter and no projection: not the block's attention
    projecting = [m for m in leaves if any(True for c in m.modules() if c is not m for _ in c.parameters())]
    return (projecting or leaves)[0]


def out_projection(layer: nn.Module) -> Optional[nn.Module]:
    """The module mapping concatenated head outputs to d_model (its input is ``hook_z`` merged)."""
    for name, sub in layer.named_modules():
        parts = name.split(".")
        if parts[-1] not in OUT_PROJ_NAMES or len(parts) < 2:
            continue
        parent = layer.get_submodule(".".join(parts[:-1]))
        pname = type(parent).__name__
        if "Attention" in pname or pname == "Attention" or "SelfOutput" in pname:
            return sub
    return None


def final_norm(hf_model: nn.Module, layers: nn.ModuleList) -> Optional[nn.Module]:
    inside = {id(m) for m in layers.modules()}
    for name, sub in hf_model.named_modules():
        if name.rsplit(".", 1)[-1] in FINAL_NORM_NAMES and id(sub) not in inside and "Norm" in type(sub).__name__:
            return sub
    return None


def register_kernel(base: str) -> str:
    """Register ``attnlab_<base>`` with transformers' attention and mask interfaces; return the name.

    The mask function is the base kernel's own (sdpa's boolean mask or None, eager's additive
    mask), so the model builds exactly the mask it builds for its configured kernel.
    """
    # transformers.modeling_utils costs ~1.7 s to import: loaded here, once an HF model is being wrapped
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import AttentionInterface

    name = PREFIX + base
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, observed_attention)
    masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    if name not in masks and base in masks:
        # cast: transformers' registry infers its values as builtins.function, which is not a Callable to mypy
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, cast(Callable[..., Any], masks[base]))
    return name


def route_for_model_type(model_type: str) -> str:
    """The route the adapter takes for ``model_type``, read from the installed modeling source."""
    package = model_type.replace("-", "_")
    if package == "openai_gpt":
        package = "openai"
    if package == "gemma3_text":
        package = "gemma3"
    try:
        module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
        source = source_text.source(module)
    except (ImportError, OSError):
        return "unsupported"
    return INTERFACE if "ALL_ATTENTION_FUNCTIONS.get_interface(" in source else MODULE_HOOKS


def routes_table(archs: tuple[str, ...] = TABLE_ARCHS) -> list[dict[str, Any]]:
    """One row per architecture: its model_type, the route, and which hooks that route fires."""
    fired = {INTERFACE: "hook_q/k/v, hook_rot_q/k (rotary), hook_attn_scores, hook_pattern, hook_z, hook_attn_out",
             MODULE_HOOKS: "hook_pattern (via output_attentions, read-only), hook_z, hook_attn_out",
             "unsupported": ""}
    rows = []
    for arch in archs:
        route = route_for_model_type(arch)
        rows.append({"arch": arch, "route": route, "attention_hooks": fired[route]})
    return rows


def routes_markdown(archs: tuple[str, ...] = TABLE_ARCHS) -> str:
    lines = ["| architecture (model_type) | route | attention hooks that fire |", "| --- | --- | --- |"]
    lines += [f"| {r['arch']} | {r['route']} | {r['attention_hooks']} |" for r in routes_table(archs)]
    return "\n".join(lines)
