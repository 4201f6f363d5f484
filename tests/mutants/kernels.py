"""Deliberately broken attention kernels, one planted bug each, for the kernel suite (properties/kernels/).

``RefKernel`` is a plain eager kernel written here without attnlab (every feature the suite draws: GQA by
``repeat_interleave``, the scaling it is given, Gemma-2's soft cap before the mask, gpt-oss's sinks, boolean
and additive masks); each mutant overrides one step. ``must_flag`` names the row whose feature the bug
breaks: tests/test_kernels.py shows each caught there and the unbroken reference clean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from properties.kernels import Capabilities, check_kernel


class RefKernel:
    """``fn(module, query, key, value, attention_mask, scaling, softcap, s_aux, sliding_window, **kw)``."""

    attnlab_capabilities = Capabilities(masked_rows="zero")

    def __init__(self, name: str = "reference"):
        self.attnlab_name = name

    def read(self, x: Tensor) -> Tensor:
        return x

    def expand_kv(self, x: Tensor, groups: int) -> Tensor:
        return x.repeat_interleave(groups, dim=1)

    def scale(self, query: Tensor, value: Tensor, scaling: Optional[float]) -> float:
        return query.shape[-1] ** -0.5 if scaling is None else scaling

    def hidden(self, mask: Optional[Tensor], scores: Tensor, window: Optional[int]) -> Tensor:
        """bool: the scores the mask hides."""
        if mask is None:
            return torch.zeros_like(scores, dtype=torch.bool)
        return ~mask if mask.dtype == torch.bool else mask <= torch.finfo(mask.dtype).min / 2

    def bias(self, mask: Optional[Tensor], scores: Tensor) -> Tensor:
        if mask is None or mask.dtype == torch.bool:
            return torch.zeros_like(scores)
        return torch.where(mask <= torch.finfo(mask.dtype).min / 2, 0.0, mask).to(scores.dtype)

    def cap_and_mask(self, scores: Tensor, hidden: Tensor, bias: Tensor, softcap: Optional[float]) -> Tensor:
        if softcap is not None:  # Gemma-2: before the mask
            scores = softcap * torch.tanh(scores / softcap)
        return (scores + bias).masked_fill(hidden, -math.inf)

    def softmax(self, scores: Tensor, sinks: Optional[Tensor]) -> Tensor:
        if sinks is not None:  # gpt-oss: one more logit per head, dropped after the softmax
            sink = sinks.reshape(1, -1, 1, 1).to(torch.float32).expand(*scores.shape[:-1], 1)
            full = torch.cat([scores.float(), sink], dim=-1)
            return full.softmax(-1)[..., :-1].nan_to_num(0.0)
        return scores.float().softmax(-1).nan_to_num(0.0)  # a row that sees no key: 0

    def __call__(self, module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                 scaling: Optional[float] = None, dropout: float = 0.0, softcap: Optional[float] = None,
                 s_aux: Optional[Tensor] = None, sliding_window: Optional[int] = None, **kw: Any
                 ) -> tuple[Tensor, Tensor]:
        query, key, value = self.read(query), self.read(key), self.read(value)
        groups = query.shape[1] // key.shape[1]
        key, value = self.expand_kv(key, groups), self.expand_kv(value, groups)
        scores = query @ key.transpose(-1, -2) * self.scale(query, value, scaling)
        hidden = self.hidden(attention_mask, scores, sliding_window)
        scores = self.cap_and_mask(scores, hidden, self.bias(attention_mask, scores), softcap)
        p = self.softmax(scores, s_aux).to(value.dtype)
        return (p @ value).transpose(1, 2).contiguous(), p


class MaskIgnored(RefKernel):
    def hidden(self, mask, scores, window):
        return torch.zeros_like(scores, dtype=torch.bool)


class WindowOneWider(RefKernel):
    """Builds the window from ``sliding_window`` (flash-attention's contract), keeping one key too many."""

    attnlab_capabilities = Capabilities(window_from_kwarg=True)

    def hidden(self, mask, scores, window):
        out = super().hidden(mask, scores, window)
        if window is not None:
            q, k = scores.shape[-2:]
            qpos = torch.arange(q)[:, None] + (k - q)
            out = out | (torch.arange(k)[None, :] <= qpos - window - 1)  # should be <= qpos - window
        return out


class WindowRight(WindowOneWider):
    """The same kernel with the window right: a kwarg-window kernel can pass (the mutant's witness)."""

    def hidden(self, mask, scores, window):
        out = RefKernel.hidden(self, mask, scores, window)
        if window is not None:
            q, k = scores.shape[-2:]
            qpos = torch.arange(q)[:, None] + (k - q)
            out = out | (torch.arange(k)[None, :] <= qpos - window)
        return out


class ScaleFromValueDim(RefKernel):
    def scale(self, query, value, scaling):
        return value.shape[-1] ** -0.5  # ignores the scaling it is given, and reads the wrong head dim


class GqaRepeatTiled(RefKernel):
    def expand_kv(self, x, groups):
        return x.repeat(1, groups, 1, 1)  # head order 0,1,0,1 instead of 0,0,1,1


class SoftcapAfterMask(RefKernel):
    def cap_and_mask(self, scores, hidden, bias, softcap):
        scores = (scores + bias).masked_fill(hidden, torch.finfo(scores.dtype).min)
        return softcap * torch.tanh(scores / softcap) if softcap is not None else scores  # hidden keys at -cap


class SinksDropped(RefKernel):
    def softmax(self, scores, sinks):
        return super().softmax(scores, None)


class SoftmaxInBfloat16(RefKernel):
    """At bfloat16 it is no bug (the pattern is rounded to bfloat16 there anyway): caught at float32/float16."""

    def softmax(self, scores, sinks):
        if sinks is not None:
            scores = torch.cat([scores, sinks.reshape(1, -1, 1, 1).to(scores.dtype).expand(*scores.shape[:-1], 1)], -1)
            return self.softmax(scores, None)[..., :-1]
        e = (scores - scores.amax(-1, keepdim=True)).to(torch.bfloat16).exp()
        return (e / e.sum(-1, keepdim=True)).float().nan_to_num(0.0)  # rounded to 8 bits over the whole row


class ReadsStorageAsContiguous(RefKernel):
    def read(self, x):
        return torch.as_strided(x, x.shape, torch.empty(x.shape).stride())  # ignores the strides it was given


class NotDeterministic(RefKernel):
    calls = 0

    def softmax(self, scores, sinks):
        NotDeterministic.calls += 1  # an accumulation order that changes from call to call
        p = super().softmax(scores, sinks)
        return p * (1 + (NotDeterministic.calls % 2) * 2.0 ** -23)  # one float32 ulp of 1


class MaskedRowsMixed(RefKernel):
    def softmax(self, scores, sinks):
        if sinks is not None:
            return super().softmax(scores, sinks)
        p = scores.float().softmax(-1)  # NaN on a row that sees no key ...
        return p.nan_to_num(0.0) if p.shape[0] > 1 else p  # ... made 0 only when the batch has two rows


@dataclass(frozen=True)
class KernelMutant:
    name: str
    kernel: RefKernel
    must_flag: str
    bug: str


KERNEL_MUTANTS = (
    KernelMutant("mask_ignored", MaskIgnored("mask_ignored"), "bool_mask", "the attention mask is never read"),
    KernelMutant("window_one_wider", WindowOneWider("window_one_wider"), "sliding_window",
                 "the window built from sliding_window keeps w + 1 keys"),
    KernelMutant("scale_from_value_dim", ScaleFromValueDim("scale_from_value_dim"), "scaling",
                 "scale 1/sqrt(dv) instead of the scaling passed"),
    KernelMutant("gqa_repeat_tiled", GqaRepeatTiled("gqa_repeat_tiled"), "gqa",
                 "K/V heads repeated with repeat (tiled) instead of repeat_interleave"),
    KernelMutant("softcap_after_mask", SoftcapAfterMask("softcap_after_mask"), "softcap",
                 "the soft cap applied after the mask: hidden keys sit at -cap, not -inf"),
    KernelMutant("sinks_dropped", SinksDropped("sinks_dropped"), "sinks", "the sink logits are ignored"),
    KernelMutant("softmax_bfloat16", SoftmaxInBfloat16("softmax_bfloat16"), "decode",
                 "the softmax's exponentials and normalising sum rounded to bfloat16"),
    KernelMutant("reads_storage", ReadsStorageAsContiguous("reads_storage"), "noncontiguous",
                 "a non-contiguous input read as if contiguous (as_strided ignoring its strides)"),
    KernelMutant("not_deterministic", NotDeterministic("not_deterministic"), "determinism",
                 "every other call scales the pattern by 1 + 2^-23 (one float32 ulp)"),
    KernelMutant("masked_rows_mixed", MaskedRowsMixed("masked_rows_mixed"), "masked_rows",
                 "a fully masked row is NaN in a batch of one and 0 otherwise"),
)


def kill_matrix(dtype: str = "float32") -> list[tuple[str, str, list[str]]]:
    """(mutant, its row, every row that fails it) at ``dtype``: ``python -m tests.mutants.kernels``."""
    out = []
    for m in KERNEL_MUTANTS:
        frame = check_kernel(m.kernel, dtypes=(dtype,))
        out.append((m.name, m.must_flag, list(frame[frame.status == "fail"].property)))
    return out


if __name__ == "__main__":
    for name, row, failed in kill_matrix():
        print(f"{name:22s} {'caught' if row in failed else 'ESCAPED'} by {row:15s} (fails: {', '.join(failed)})")
