"""The built-in kernels: what the installed transformers registers, and torch's SDPA and FlexAttention.

transformers 5.x has no global "eager": each model ships its own ``eager_attention_forward``; three stand
for the family (Llama's plain one, Gemma-2's with a soft cap, gpt-oss's with sinks). ``sdpa`` is
``transformers.integrations.sdpa_attention.sdpa_attention_forward``; ``sdpa_<backend>`` is
``torch.nn.functional.scaled_dot_product_attention`` pinned to one backend with ``sdpa_kernel`` (a backend
this machine lacks refuses every call: its rows are n/a with the refusal). ``flex`` is torch's
``flex_attention`` with a ``block_mask`` (boolean masks), a ``score_mod`` (soft cap, additive mask) and sinks
applied through the returned log-sum-exp (as transformers does on CUDA), run uncompiled (compiling costs
~20 s a shape on this 2-core CPU); ``flex_attention_uncompiled`` is transformers' ``flex_attention_forward``
itself with its compile step swapped for the uncompiled call. Kernels registered in
``ALL_ATTENTION_FUNCTIONS`` that cannot run here are listed with the reason.

Uncompiled ``flex_attention`` still traces itself: it runs its higher-order op through ``torch.compile(...,
backend="eager")``, which traces again at each new shape, and at each new closure a ``score_mod`` or
``mask_mod`` reads (12 traces of ~0.4 s for one row of 10 examples here). Both flex kernels call it under
``torch.compiler.set_stance("force_eager")``, which runs the same op without the trace: on every row of the
suite at float32 and bfloat16, both kernels gave the same deviations to the bit as through the trace, the
known finding included, in a fifth of the time (11.4 s against 55.8 s for ``flex``;
tests/test_kernels.py checks the outputs agree).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Callable
from typing import Any, Optional, no_type_check

import torch
import transformers
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers.integrations import flex_attention as hf_flex
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_eager

from harness.adapters.hf_attention import PREFIX as ATTNLAB_WRAPPER
from properties.kernels.capabilities import Capabilities

EAGER_MASKS = ("additive",)  # masking_utils hands eager kernels float masks (0 / finfo.min), never booleans
NO_SOFTCAP = "this kernel has no soft cap (the models that use it never pass one)"
NO_SINKS = "this kernel has no attention sinks (it ignores s_aux)"


def _declare(fn: Callable[..., Any], name: str, caps: Capabilities) -> Callable[..., Any]:
    fn.attnlab_name = name  # type: ignore[attr-defined]
    fn.attnlab_capabilities = caps  # type: ignore[attr-defined]
    return fn


def _wrap(inner: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
               **kw: Any) -> Any:
        return inner(module, query, key, value, attention_mask, **kw)
    return kernel


def _gpt_oss(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
             **kw: Any) -> Any:
    # gpt-oss's eager always reads module.sinks; a model without sinks is the sink -inf (exp(-inf) = 0)
    if module.sinks is None:
        module.sinks = torch.full((query.shape[1],), -math.inf, dtype=query.dtype)
    return gpt_oss_eager(module, query, key, value, attention_mask, **kw)


def sdpa_backend(backend: SDPBackend) -> Callable[..., Any]:
    """``scaled_dot_product_attention`` pinned to ``backend``, behind the attention interface."""

    def kernel(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
               scaling: Optional[float] = None, dropout: float = 0.0, **kw: Any) -> tuple[Tensor, None]:
        groups = query.shape[1] // key.shape[1]
        causal = attention_mask is None and bool(module.is_causal) and query.shape[2] == key.shape[2] > 1
        with sdpa_kernel(backend), warnings.catch_warnings():  # a refusal is raised; its warnings repeat it
            warnings.simplefilter("ignore")
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
                enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None
    return kernel


def flex(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
         scaling: Optional[float] = None, softcap: Optional[float] = None, s_aux: Optional[Tensor] = None,
         **kw: Any) -> tuple[Tensor, None]:
    """FlexAttention: a boolean mask as a ``block_mask`` (its ``mask_mod`` reads the mask), an additive one and
    the soft cap in a ``score_mod``; sinks rescale by ``sigmoid(lse - sink)``, since ``softmax`` with one more
    logit ``s`` is ``softmax * 1 / (1 + exp(s - lse))``."""
    shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    additive, block_mask = None, None
    # @no_type_check on the two mods: FlexAttention tells a mask_mod from a score_mod by the argument count of
    # its code object and traces it with dynamo; a run-time type checker's wrapper (jaxtyping's import hook,
    # which tests run under) has neither (it takes *args and keeps state), and every call would raise
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        seen = attention_mask.expand(shape)

        @no_type_check
        def mask_mod(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
            return seen[b, h, q, k]
        block_mask = create_block_mask(mask_mod, *shape, device=str(query.device))
    elif attention_mask is not None:
        additive = attention_mask.expand(shape)

    @no_type_check
    def score_mod(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if additive is not None:
            score = score + additive[b, h, q, k]
        return score

    with warnings.catch_warnings(), untraced():  # uncompiled flex warns that it runs its reference path
        warnings.simplefilter("ignore")
        out, lse = flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling,
                                  enable_gqa=query.shape[1] != key.shape[1], return_lse=True)
    if s_aux is not None:
        out = out * torch.sigmoid(lse - s_aux.reshape(1, -1, 1).to(lse.dtype)).unsqueeze(-1).to(out.dtype)
    return out.transpose(1, 2).contiguous(), None


def untraced() -> Any:
    """The block runs ``flex_attention``'s op directly, not through its ``backend="eager"`` trace (module doc)."""
    return torch.compiler.set_stance("force_eager")


def _uncompiled(query: Tensor, key: Tensor, value: Tensor, training: bool = False, **kwargs: Any) -> Any:
    with warnings.catch_warnings(), untraced():
        warnings.simplefilter("ignore")
        return flex_attention(query, key, value, **kwargs)


def hf_flex_uncompiled(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                       **kw: Any) -> Any:
    """transformers' ``flex_attention_forward`` with its one ``torch.compile`` step replaced by uncompiled
    ``flex_attention`` for the call (the same function compiled computes the same; compiling costs ~20 s a
    shape here): its score_mod, mask slicing, GQA handling and sink rule are what is checked."""
    saved = hf_flex.compile_friendly_flex_attention
    hf_flex.compile_friendly_flex_attention = _uncompiled
    try:
        # annotated Tensor | BlockMask, but None is read as "no score mask" (score_mask = None)
        return hf_flex.flex_attention_forward(module, query, key, value, attention_mask, **kw)  # type: ignore[arg-type]
    finally:
        hf_flex.compile_friendly_flex_attention = saved


def _unavailable(name: str) -> str:
    if name.startswith("flash_attention"):
        have = importlib.util.find_spec("flash_attn") is not None
        return ("needs CUDA" if have else "the flash_attn package is not installed") + " (CUDA only)"
    if name == "flex_attention":
        return ("transformers compiles flex_attention (torch.compile) at each new shape: about 20 s per shape on "
                "this 2-core CPU, past the suite's time goal; `flex_attention_uncompiled` is the same function with "
                "that one call uncompiled, and `flex` is FlexAttention itself")
    if "paged" in name:
        return "a paged kernel: it reads a paged KV cache (cu_seq_lens), not dense query/key/value"
    return "not run by this suite"


def builtins() -> dict[str, Callable[..., Any]]:
    """Every built-in kernel by name (docs/kernels.md's table), each with its declared capabilities."""
    kernels = {
        "eager": _declare(_wrap(llama_eager), "eager", Capabilities(
            softcap=NO_SOFTCAP, sinks=NO_SINKS, mask_forms=EAGER_MASKS)),
        "eager_gemma2": _declare(_wrap(gemma2_eager), "eager_gemma2", Capabilities(
            sinks=NO_SINKS, mask_forms=EAGER_MASKS)),
        "eager_gpt_oss": _declare(_gpt_oss, "eager_gpt_oss", Capabilities(
            softcap=NO_SOFTCAP, mask_forms=EAGER_MASKS)),
        "sdpa": _declare(_wrap(sdpa_attention_forward), "sdpa", Capabilities(
            softcap="transformers' sdpa raises on softcap", sinks=NO_SINKS, causal_flag=True)),
        "flex": _declare(flex, "flex", Capabilities()),
        # transformers adds a tensor mask in its score_mod (a BlockMask is its other form): additive masks only
        "flex_attention_uncompiled": _declare(hf_flex_uncompiled, "flex_attention_uncompiled", Capabilities(
            mask_forms=EAGER_MASKS)),
    }
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        name = "sdpa_" + backend.name.lower().replace("_attention", "")
        kernels[name] = _declare(sdpa_backend(backend), name, Capabilities(
            softcap=NO_SOFTCAP, sinks=NO_SINKS, causal_flag=True))
    for name in ALL_ATTENTION_FUNCTIONS.valid_keys():
        # attnlab's own wrappers (registered once an HF model is adapted) observe a kernel; they are none
        if name != "sdpa" and not name.startswith(ATTNLAB_WRAPPER):
            kernels[name] = _declare(_wrap(ALL_ATTENTION_FUNCTIONS[name]), name,
                                     Capabilities(unavailable=_unavailable(name)))
    return kernels


TRANSFORMERS_VERSION = transformers.__version__
