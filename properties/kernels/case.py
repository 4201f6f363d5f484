"""One grid point of the kernel suite: the inputs of one attention call, and how a kernel is called on them.

A :class:`Case` holds the shapes and the attention features of one call; its tensors are made from ``seed``
in float64 and rounded to ``dtype`` once (:meth:`Case.tensors`), so the kernel, the float64 reference and the
at-dtype eager formula all read the same numbers. Shapes follow transformers' ``AttentionInterface``:
query ``[b, h, q, d]``, key/value ``[b, h_kv, k, d]`` / ``[b, h_kv, k, dv]``, output ``[b, q, h, dv]``.

Masking follows transformers' ``masking_utils``: query ``i`` sits at absolute position ``k - q + i`` (the
queries are the last ``q`` of the ``k`` positions, as when decoding with a cache); causal lets it see keys
``j <= k - q + i``; a sliding window of ``w`` keeps ``j > k - q + i - w`` (the query's own key included);
padding hides key positions. The mask a kernel receives carries every one of these (``mask="bool"``: True
attends, as SDPA reads it; ``mask="additive"``: 0 or the bias where visible, ``finfo(dtype).min`` where
not, as transformers' eager reads it) and the ``sliding_window`` and ``module.is_causal`` it is also given
describe the same mask. ``mask="none"`` means nothing is masked, or, for a kernel that declares
``causal_flag``, a causal mask left to the flag with ``q == k`` (transformers' SDPA path drops the mask then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch import Tensor

MASKS = ("none", "bool", "additive")
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


@dataclass(frozen=True)
class Case:
    b: int = 1
    h: int = 2
    h_kv: int = 2
    q: int = 4
    k: int = 4
    d: int = 8
    dv: int = 8
    dtype: str = "float32"
    scaling: Optional[float] = None  # None: d ** -0.5 (Vaswani et al. 2017 §3.2.1)
    causal: bool = False
    mask: str = "none"
    pad_left: tuple[int, ...] = ()  # per batch row: hidden key positions at the start
    pad_right: tuple[int, ...] = ()  # ... and at the end
    window: Optional[int] = None
    window_in_mask: bool = True  # False: the kernel builds the window from ``sliding_window`` (declared)
    softcap: Optional[float] = None
    sinks: bool = False
    bias: str = "none"  # "alibi" (Press et al. 2022) or "random": per head, added to the scores
    hidden: tuple[tuple[int, int], ...] = ()  # (batch, key) pairs hidden in every row: an arbitrary mask
    masked_rows: tuple[int, ...] = ()  # query rows with every key hidden
    layout: str = "contiguous"
    amplitude: float = 1.0  # scales q, so the scores reach a soft cap
    seed: int = 0

    @property
    def scale(self) -> float:
        return self.d ** -0.5 if self.scaling is None else self.scaling

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def at(self, dtype: str) -> Case:
        return replace(self, dtype=dtype)

    def describe(self) -> str:
        parts = [f"b={self.b} h={self.h} h_kv={self.h_kv} q={self.q} k={self.k} d={self.d}"
                 + (f" dv={self.dv}" if self.dv != self.d else ""), self.dtype, f"mask={self.mask}"]
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling:.4g}")
        for name in ("causal", "sinks"):
            if getattr(self, name):
                parts.append(name)
        if any(self.pad_left) or any(self.pad_right):
            parts.append(f"pad_left={list(self.pad_left)} pad_right={list(self.pad_right)}")
        if self.window is not None:
            parts.append(f"window={self.window}" + ("" if self.window_in_mask else " (from sliding_window only)"))
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g} amplitude={self.amplitude:g}")
        if self.bias != "none":
            parts.append(f"bias={self.bias}")
        if self.hidden:
            parts.append(f"hidden(batch,key)={list(self.hidden)}")
        if self.masked_rows:
            parts.append(f"fully masked query rows={list(self.masked_rows)}")
        if self.layout != "contiguous":
            parts.append(f"layout={self.layout}")
        return " ".join(parts) + f" seed={self.seed}"

    # ----- the masking decisions, as one boolean [b, 1, q, k] (True: the query sees the key)
    def visible(self, window: bool = True) -> Tensor:
        qpos = torch.arange(self.q)[:, None] + (self.k - self.q)
        kpos = torch.arange(self.k)[None, :]
        see = torch.ones(self.b, 1, self.q, self.k, dtype=torch.bool)
        if self.causal:
            see &= kpos <= qpos
        if self.window is not None and window:
            see &= kpos > qpos - self.window  # transformers' sliding_window_overlay
        for row in range(self.b):
            left = self.pad_left[row] if row < len(self.pad_left) else 0
            right = self.pad_right[row] if row < len(self.pad_right) else 0
            see[row, ..., :left] = False
            if right:
                see[row, ..., self.k - right:] = False
        for row, key in self.hidden:
            see[row, ..., key] = False
        for r in self.masked_rows:
            see[:, :, r, :] = False
        return see

    def tensors(self) -> dict[str, Tensor]:
        """q, k, v, sinks [h] and bias [1, h, q, k], drawn in float64 from ``seed`` and rounded to ``dtype``."""
        g = torch.Generator().manual_seed(self.seed)
        dt = self.torch_dtype

        def draw(*shape: int, scale: float = 1.0) -> Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dt)

        out = {"q": draw(self.b, self.h, self.q, self.d, scale=self.amplitude),
               "k": draw(self.b, self.h_kv, self.k, self.d),
               "v": draw(self.b, self.h_kv, self.k, self.dv), "sinks": draw(self.h, scale=2.0)}
        qpos = torch.arange(self.q, dtype=torch.float64)[:, None] + (self.k - self.q)
        dist = torch.arange(self.k, dtype=torch.float64)[None, :] - qpos
        if self.bias == "alibi":  # Press et al. 2022: slope 2^(-8 (i+1) / h) per head times the key's offset
            slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / self.h) for i in range(self.h)], dtype=torch.float64)
            out["bias"] = (slopes[:, None, None] * dist).unsqueeze(0).to(dt)
        elif self.bias == "random":
            out["bias"] = draw(1, self.h, self.q, self.k, scale=2.0)
        return out

    def kernel_mask(self, t: dict[str, Tensor]) -> Optional[Tensor]:
        """The attention_mask a kernel receives (module docstring)."""
        if self.mask == "none":
            return None
        see = self.visible(window=self.window_in_mask)
        if self.mask == "bool":
            return see
        dt = self.torch_dtype
        base = t["bias"] if "bias" in t else torch.zeros((), dtype=dt)
        return torch.where(see, base, torch.tensor(torch.finfo(dt).min, dtype=dt))

    def laid_out(self, x: Tensor) -> Tensor:
        """``x`` with the same values in this case's memory layout (non-contiguous but for "contiguous")."""
        if self.layout == "transposed":  # made [b, s, h, d], as a projection's output is, then transposed
            return x.transpose(1, 2).contiguous().transpose(1, 2)
        if self.layout == "sliced":  # the first d of 2d features of a wider tensor
            wide = torch.cat([x, torch.full_like(x, math.nan)], dim=-1)
            return wide[..., : x.shape[-1]]
        if self.layout == "expanded" and x.shape[0] == 1:  # a stride-0 batch
            return x.expand(2, *x.shape[1:])[:1]
        return x.contiguous()


class StandIn(torch.nn.Module):
    """The attention module a kernel is called with: the attributes transformers' kernels read.

    ``num_key_value_groups`` (eager and SDPA repeat K/V heads by it), ``is_causal`` (SDPA's flag when no mask
    is given), ``training`` (dropout), ``head_dim`` and ``scaling`` (Gemma-2's eager falls back to them),
    ``sinks`` (gpt-oss's eager reads the sink logits from the module), ``config`` and ``layer_idx``.
    """

    def __init__(self, case: Case, sinks: Optional[Tensor]):
        super().__init__()
        self.num_key_value_groups = case.h // case.h_kv
        self.is_causal = case.causal
        self.head_dim = case.d
        self.scaling = case.scale
        self.attention_dropout = 0.0
        self.layer_idx = 0
        self.config = _Config(case)
        self.sinks = sinks
        self.eval()


class _Config:
    def __init__(self, case: Case):
        self.num_attention_heads, self.num_key_value_heads, self.head_dim = case.h, case.h_kv, case.d
        self.sliding_window = case.window
        self.attn_logit_softcapping = case.softcap
        self._attn_implementation = "attnlab"


def call(fn: Any, case: Case, t: Optional[dict[str, Tensor]] = None) -> Tensor:
    """Run kernel ``fn`` on ``case``; its output ``[b, q, h, dv]``. What the kernel raises propagates."""
    t = case.tensors() if t is None else t
    sinks = t["sinks"] if case.sinks else None
    module = StandIn(case, sinks)
    with torch.no_grad():
        out = fn(module, case.laid_out(t["q"]), case.laid_out(t["k"]), case.laid_out(t["v"]), case.kernel_mask(t),
                 scaling=case.scale, dropout=0.0, sliding_window=case.window, softcap=case.softcap, s_aux=sinks)
    out = out[0] if isinstance(out, tuple) else out
    if not isinstance(out, Tensor):
        raise TypeError(f"the kernel returned {type(out).__name__}: expected (attn_output, attn_weights)")
    want = (case.b, case.q, case.h, case.dv)
    if tuple(out.shape) != want:
        raise ValueError(f"the kernel returned shape {list(out.shape)}: expected [b, q, h, dv] = {list(want)}")
    return out
