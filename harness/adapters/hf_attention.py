"""The attention function HFAdapter registers with transformers' AttentionInterface, and the rotary tap.

:func:`observed_attention` receives what the model passes to its attention kernel: query and key
after rotary and q/k-norm, the value (K/V possibly grouped, Ainslie et al. 2023), the mask the
model built for its kernel, ``scaling``, ``softcap``, ``sliding_window``. It fires the layer's
hook points and calls the model's own configured kernel (``sdpa``, ``eager`` ...) for the output.
The explicit scores ``q.k * scaling`` (soft-capped, masked; Vaswani et al. 2017 eq. 1) and the
pattern (with the per-head attention sinks ``s_aux`` the model passes, :func:`explicit_pattern`) are
computed only when a hook is attached to ``hook_attn_scores`` or ``hook_pattern``;
the kernel's output is replaced by ``pattern @ v`` only when such a hook *edits* them (or edits
grouped K/V, which the kernel cannot take repeated).

:class:`RotaryTap` wraps a modeling module's ``apply_rotary_pos_emb(q, k, cos, sin, ...)`` so that
``hook_q``/``hook_k`` see q and k just before the rotation (after any q/k-norm). It passes
through untouched outside an adapter's attention call.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from harness.errors import AttnlabError
from harness.model.hooks import active

# The prefix of the attention implementations HFAdapter registers: "attnlab_sdpa" wraps "sdpa".
PREFIX = "attnlab_"
# The layer whose attention module is running (set by a pre-hook on that module).
CURRENT: contextvars.ContextVar[Optional[LayerTap]] = contextvars.ContextVar("attnlab_current_layer", default=None)
# attention module -> its LayerTap; weak so a discarded adapter leaves nothing behind.
TAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class LayerTap:
    """What the attention function needs for one layer: its hook points and the model's kernel."""

    layer: int
    points: dict  # short name ("hook_q", ...) -> HookPoint
    base: str  # the configured kernel: "sdpa", "eager", ...
    rotary: bool
    d_head: int
    explicit_calls: int = 0  # how often the explicit scores were computed (tests: idle hooks stay on the kernel)
    rotations: int = 0  # how often this layer's apply_rotary_pos_emb ran on whole heads (DesignFacts.rotary_layers)
    entered: int = 0  # how often this layer's attention module ran under the adapter (its rotations were watched)
    rotary_calls: int = 0  # how often apply_rotary_pos_emb ran in it at all (any slice or head size)

    def active(self, name: str) -> bool:
        return active(self.points[name])


def base_kernel(name: str) -> str:
    """The model's own kernel behind an ``attnlab_`` implementation name ("attnlab_sdpa" -> "sdpa")."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def kernel(module: nn.Module, base: str) -> Any:
    """The function the model would call for ``base``: its own eager function, or the registered kernel.

    Looked up at call time, so a user's patch of the modeling module stays visible.
    """
    if base == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    # transformers.modeling_utils costs ~1.7 s to import; here an HF model is running, so it is loaded already
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[base]


def _repeat(x: Tensor, n_rep: int) -> Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _fire(point: Any, x: Tensor) -> tuple[Tensor, bool]:
    """Run ``[batch, heads, pos, d]`` through a hook point in protocol layout; return it and whether it changed."""
    view = x.transpose(1, 2)
    out = point(view)
    return (x, False) if out is view else (out.transpose(1, 2), True)


def explicit_scores(query: Tensor, key: Tensor, mask: Optional[Tensor], scaling: float, softcap: Optional[float],
                    is_causal: bool, position_bias: Optional[Tensor]) -> Tensor:
    """``[batch, n_heads, query_pos, key_pos]`` pre-softmax scores as the eager kernels compute them.

    Masked entries get the dtype's minimum (as HF's eager mask does), so their weight is exactly 0.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if softcap is not None:  # Gemma 2: softcap * tanh(s / softcap)
        scores = torch.tanh(scores / softcap) * softcap
    if position_bias is not None:
        scores = scores + position_bias
    n_q, n_k = scores.shape[-2:]
    low = torch.finfo(scores.dtype).min
    if mask is None:
        if is_causal and n_q > 1:  # sdpa's mask skip: a plain causal mask, queries at the end of the keys
            allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril(n_k - n_q)
            scores = scores.masked_fill(~allowed, low)
        return scores
    mask = mask[..., :n_k]
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, low)
    return scores + mask


def explicit_pattern(scores: Tensor, sinks: Optional[Tensor]) -> Tensor:
    """The float32 softmax of ``scores`` (as HF's eager kernels take it), with the model's attention sinks if any.

    ``sinks`` (``[n_heads]``, the ``s_aux`` a model passes its kernel: GPT-OSS, MiMo-V2-Flash, DeepSeek-V4 ...)
    is one extra logit per head in the softmax's denominator that attends to nothing: gpt_oss's
    eager_attention_forward concatenates it as a last key column, takes the softmax and drops that
    column, so a row sums to 1 - exp(sink) / (exp(sink) + sum_j exp(s_j)). Granite-SWA's
    ``sigmoid(logsumexp(s) - sink)`` rescaling of the plain softmax is the same number.
    """
    if sinks is None:
        return torch.softmax(scores.float(), dim=-1)
    column = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores.float(), column], dim=-1), dim=-1)[..., :-1]


def observed_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                       attention_mask: Optional[Tensor], **kwargs: Any) -> tuple[Tensor, Optional[Tensor]]:
    """The registered ``attnlab_<kernel>`` attention function (see the module docstring)."""
    tap = TAPS.get(module)
    if tap is None:  # a model pointed at attnlab_* whose adapter is gone: behave as the base kernel
        base = base_kernel(getattr(getattr(module, "config", None), "_attn_implementation", "attnlab_sdpa"))
        return kernel(module, base)(module, query, key, value, attention_mask, **kwargs)
    n_rep = query.shape[1] // key.shape[1]
    q_name, k_name = ("hook_rot_q", "hook_rot_k") if tap.rotary else ("hook_q", "hook_k")
    kv_edited = False
    if tap.active(q_name):
        query, _ = _fire(tap.points[q_name], query)
    key_all, value_all = key, value
    if tap.active(k_name):
        key_all, edited = _fire(tap.points[k_name], _repeat(key, n_rep))
        if edited and n_rep == 1:
            key = key_all
        kv_edited |= edited and n_rep > 1
    if tap.active("hook_v"):
        value_all, edited = _fire(tap.points["hook_v"], _repeat(value, n_rep))
        if edited and n_rep == 1:
            value = value_all
        kv_edited |= edited and n_rep > 1
    explicit = kv_edited or tap.active("hook_attn_scores") or tap.active("hook_pattern")
    replaced = kv_edited
    if explicit:
        tap.explicit_calls += 1
        scaling = kwargs.get("scaling")
        scaling = tap.d_head ** -0.5 if scaling is None else scaling
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        key_rep = key_all if key_all.shape[1] == query.shape[1] else _repeat(key, n_rep)
        scores = explicit_scores(query, key_rep, attention_mask, scaling, kwargs.get("softcap"), bool(is_causal),
                                 kwargs.get("position_bias"))
        seen = tap.points["hook_attn_scores"](scores) if tap.active("hook_attn_scores") else scores
        pattern = explicit_pattern(seen, kwargs.get("s_aux")).to(value.dtype)
        weights = tap.points["hook_pattern"](pattern) if tap.active("hook_pattern") else pattern
        replaced |= seen is not scores or weights is not pattern
    if replaced:
        value_rep = value_all if value_all.shape[1] == query.shape[1] else _repeat(value, n_rep)
        z = torch.matmul(weights, value_rep).transpose(1, 2).contiguous()
        attn_weights: Optional[Tensor] = weights
    else:
        z, attn_weights = kernel(module, tap.base)(module, query, key, value, attention_mask, **kwargs)
    if tap.active("hook_z"):
        z = tap.points["hook_z"](z)  # [batch, pos, n_heads, d_head], the o_proj input before the merge
    return z, attn_weights


class RotaryTap:
    """Wraps ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``: fires ``hook_q``/``hook_k`` on its inputs.

    Fires only inside an adapter's attention call and only when the call rotates whole heads
    (partial rotary applied outside the function, as Phi and StableLM do, rotates a slice: there
    ``hook_q``/``hook_k`` stay silent). An edit returned by the hook is what gets rotated.
    """

    def __init__(self, inner: Any):
        self.inner = inner
        functools.update_wrapper(self, inner)

    def __call__(self, q: Tensor, k: Tensor, *args: Any, **kwargs: Any) -> Any:
        tap = CURRENT.get()
        if tap is not None:
            tap.rotary_calls += 1
        if tap is None or q.shape[-1] != tap.d_head:
            return self.inner(q, k, *args, **kwargs)
        tap.rotations += 1
        unsqueeze = kwargs.get("unsqueeze_dim", args[2] if len(args) > 2 else 1)
        head_first = unsqueeze == 1  # [batch, heads, pos, d] (the HF default) vs [batch, pos, heads, d]
        if tap.active("hook_q"):
            q = self._fire(tap.points["hook_q"], q, head_first, 1)
        if tap.active("hook_k"):
            n_rep = q.shape[1 if head_first else 2] // k.shape[1 if head_first else 2]
            k = self._fire(tap.points["hook_k"], k, head_first, n_rep)
        return self.inner(q, k, *args, **kwargs)

    @staticmethod
    def _fire(point: Any, x: Tensor, head_first: bool, n_rep: int) -> Tensor:
        x_hf = x if head_first else x.transpose(1, 2)
        out, edited = _fire(point, _repeat(x_hf, n_rep))
        if not edited:
            return x
        if n_rep > 1:
            groups = out.unflatten(1, (-1, n_rep))
            if not torch.equal(groups, groups[:, :, :1].expand_as(groups)):
                raise AttnlabError("a hook_k edit differs between query heads that share a key/value head (grouped-"
                                   "query attention): expected the same edit on every head of a group")
            out = groups[:, :, 0]
        return out if head_first else out.transpose(1, 2)


def _hub_wrapped(fn: Any) -> Any:
    """The plain function behind a hub-kernel wrapper, else ``fn``.

    With the ``kernels`` package installed, transformers' ``use_kernel_forward_from_hub`` turns a modeling
    module's ``apply_rotary_pos_emb`` into an ``nn.Module`` whose ``forward(*args, **kwargs)`` calls the original
    (kept in its closure as ``func``) unless a hub kernel was selected. Its own signature says nothing, so the
    (q, k, ...) test reads the original's; the tap still calls the wrapper, so a selected kernel keeps running.
    """
    forward = getattr(type(fn), "forward", None)
    code, cells = getattr(forward, "__code__", None), getattr(forward, "__closure__", None)
    if isinstance(fn, nn.Module) and code is not None and cells and "func" in code.co_freevars:
        inner = cells[code.co_freevars.index("func")].cell_contents
        if callable(inner):
            return inner
    return fn


def install_rotary_tap(attn: nn.Module) -> bool:
    """Wrap the rotary function of ``attn``'s modeling module once; False if it has no (q, k, ...) rotary function."""
    module = sys.modules.get(type(attn).__module__)
    fn = getattr(module, "apply_rotary_pos_emb", None)
    if isinstance(fn, RotaryTap):
        return True
    if module is None or not callable(fn):
        return False
    try:
        names = list(inspect.signature(_hub_wrapped(fn)).parameters)[:2]
    except (TypeError, ValueError):
        return False
    if names != ["q", "k"]:
        return False
    module.__dict__["apply_rotary_pos_emb"] = RotaryTap(fn)  # the modeling module's global, as setattr would
    return True
