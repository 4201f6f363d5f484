"""Position encodings as pure functions of integer positions.

Shapes use the legend of :mod:`harness.model.transformer` (a leading space, as in ``" n_heads"``,
marks a one-dimension shape string for linters).

Every function takes an integer tensor ``positions`` of any shape (usually
``[batch, pos]``) so left padding and KV-cache offsets need no special cases.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from harness.errors import AttnlabError


def mask_positions(real: Optional[Tensor], offset: int, length: int, device: torch.device
                   ) -> Int[Tensor, "batch pos"]:
    """The protocol's positions: ``offset`` plus the number of real tokens before each token.

    ``real`` is the bool or 0/1 mask ``[batch, length]`` (None: every token real, which gives
    ``[1, length]``). Left padding therefore does not move a sequence's positions; a padding
    token's own position is not defined by the protocol (this gives it 0 before the first real
    token). The model, the Hugging Face adapter and the bridge adapter all number tokens with it.
    """
    if real is None:
        return torch.arange(offset, offset + length, device=device)[None]
    return offset + (real.long().cumsum(-1) - 1).clamp(min=0)


def sinusoidal_table(positions: Int[Tensor, "*batch"], d_model: int, base: float = 10000.0,
                     dtype: torch.dtype = torch.float32) -> Float[Tensor, "*batch d_model"]:
    """Vaswani et al. 2017 §3.5: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...).

    Returns ``[*positions.shape, d_model]``. Computed in float64 and cast, so large
    positions keep their precision. Because sin/cos pairs share a frequency,
    PE(pos + k) is a fixed rotation R(k) of PE(pos) (see :func:`sinusoidal_shift_matrix`).
    """
    if d_model % 2:
        raise AttnlabError(f"d_model={d_model} is invalid: expected an even number")
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device) / d_model)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., d_model/2]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # interleave sin, cos
    return table.to(dtype)


def sinusoidal_shift_matrix(k: int, d_model: int, base: float = 10000.0) -> Float[Tensor, "d_model d_model"]:
    """The block-diagonal rotation R(k) with PE(pos + k) = R(k) @ PE(pos) (float64).

    Each (sin, cos) pair at frequency w turns by angle k*w:
    sin(a + kw) = sin a cos kw + cos a sin kw;  cos(a + kw) = cos a cos kw - sin a sin kw.
    """
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    theta = k * inv_freq
    c, s = theta.cos(), theta.sin()
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    idx = torch.arange(0, d_model, 2)
    R[idx, idx] = c
    R[idx, idx + 1] = s
    R[idx + 1, idx] = -s
    R[idx + 1, idx + 1] = c
    return R


def rotary_cos_sin(positions: Int[Tensor, "*batch"], d_head: int, base: float = 10000.0,
                   dtype: torch.dtype = torch.float32
                   ) -> tuple[Float[Tensor, "*batch d_head"], Float[Tensor, "*batch d_head"]]:
    """cos and sin for RoPE (Su et al. 2021, RoFormer eq. 34), ``[*positions.shape, d_head]``.

    Frequencies theta_i = base^(-2i/d_head). We use the "rotate-half" pair layout of
    GPT-NeoX and Hugging Face Llama: dimension i pairs with i + d_head/2, so converted
    Llama weights need no permutation. The angle is computed in float64 so a position
    offset does not lose precision before the cast.
    """
    if d_head % 2:
        raise AttnlabError(f"d_head={d_head} is invalid: expected an even number for rotary")
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64, device=positions.device) / d_head)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., d_head/2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: Float[Tensor, "*batch d_head"]) -> Float[Tensor, "*batch d_head"]:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Float[Tensor, "*batch d_head"], cos: Float[Tensor, "*#batch d_head"],
                 sin: Float[Tensor, "*#batch d_head"]) -> Float[Tensor, "*batch d_head"]:
    """Rotate each pair of ``x`` ``[..., d_head]`` by its angle: R_m x = x cos + rotate_half(x) sin.

    Rotations preserve norms and <R_m q, R_n k> = <q, R_{n-m} k> depends only on n - m.
    """
    return x * cos + rotate_half(x) * sin


def alibi_slopes(n_heads: int) -> Float[Tensor, " n_heads"]:
    """Per-head ALiBi slopes (Press et al. 2022 §3): the geometric sequence 2^(-8/n), 2^(-16/n), ...

    For n not a power of two, the paper's recipe: take the slopes for the closest
    smaller power of two, then every other slope of the next power of two.
    """
    if n_heads < 1:
        raise AttnlabError(f"n_heads={n_heads} is invalid: expected an integer >= 1")

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(q_positions: Int[Tensor, "batch query_pos"], k_positions: Int[Tensor, "batch key_pos"],
               slopes: Float[Tensor, " n_heads"], dtype: torch.dtype = torch.float32
               ) -> Float[Tensor, "batch n_heads query_pos key_pos"]:
    """ALiBi bias -m_h * |i - j| added to the scores, ``[batch, n_heads, q, k]``.

    Press et al. 2022 define -m * (i - j) for j <= i (causal); the absolute distance
    is the same there and extends to bidirectional attention. It depends only on the
    query–key offset, so it is invariant to a shift of every position.
    """
    dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().to(torch.float64)  # [b, q, k]
    bias = -slopes.to(dist.device)[None, :, None, None] * dist[:, None]
    return bias.to(dtype)
