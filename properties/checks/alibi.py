"""ALiBi slopes: the per-head slopes recovered from the scores are Press et al.'s geometric sequence, or the
model's own where it declares them (``cfg.alibi_slopes``: Falcon-RW's are Press et al.'s / sqrt(head_dim)).

Press, Smith & Lewis 2022 (ALiBi, §3): head h of n adds ``-m_h * (i - j)`` to the score of
query i and key j, with ``m_h = 2^(-8h/n)``, h = 1..n ("the geometric sequence that starts at
2^(-8/n) and uses that same value as its ratio"). For n not a power of two, the authors'
reference code (``get_slopes`` in github.com/ofirpress/attention_with_linear_biases) takes the
slopes for the closest power of two c < n, then every other slope of 2c (its 1st, 3rd, ...)
until there are n. :func:`press_slopes` writes that rule out here, independently of any model.
A model may declare ``cfg.alibi_bias_max`` (MPT's 8 by default: m_h = 2^(-bias_max * h / n)).

Recovery needs no q, k or scale: ALiBi models add no position embedding, so for a sequence that
repeats one token every layer-0 query and key is the same vector and ``q.k`` is one constant;
layer 0's scores are then a per-query constant plus the bias. ``log hook_pattern`` is the scores
minus a per-query constant too, so either hook serves (``hook_attn_scores`` when it fires, else
the pattern: Bloom through HFAdapter exposes only the pattern). Per head the bias is fitted as
``c(row, query) + s * x`` by least squares, ``x = j - i`` for causal models and for
``cfg.alibi_style`` "absolute_key" (Bloom adds ``m * j``: the same slope, a different per-query
constant), ``x = -|i - j|`` for symmetric bidirectional ALiBi. Deviation: ``max_h |s_h - m_h| / allowed_h``
(tolerance 1), ``allowed_h = 1e-3 m_h + eps_h * sum|x_c| / sum x_c^2``: a relative 1e-3 (float32
scores carry ~1e-6 relative error; the smallest slope, 2^-8, over distance 2 is a bias of 8e-3)
plus what rounding the hook's values in their own dtype can move a least-squares slope by, with
``eps_h = 2 u max|score_h|`` for scores and ``2 u`` for log-pattern (u: the dtype's unit roundoff;
it matters for bfloat16/float16 models only).
Field bugs: paiml/aprender #2143 (exponent off by one, slope[0] = 1 for 8 heads),
ofirpress/attention_with_linear_biases #17 (the non-power-of-two rule).
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from harness._checks import check_positive_int
from properties import design
from properties.checks._common import fmt, max_len
from properties.design import unit_roundoff
from properties.precision import capture_activations
from properties.registry import Applies, Case, Plan, model_property

TOLERANCE = 1.0
RTOL = 1e-3


def press_slopes(n_heads: int, bias_max: float = 8.0) -> list[float]:
    """Press et al. 2022 §3 slopes for ``n_heads`` heads, with the reference code's non-power-of-two rule."""
    check_positive_int("n_heads", n_heads)

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-bias_max / n)
        return [start ** (h + 1) for h in range(n)]

    if n_heads & (n_heads - 1) == 0:
        return geometric(n_heads)
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    return geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]


def fitted_slopes(bias: torch.Tensor, allowed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per head, the least-squares s in ``bias [b, h, q, k] = c[b, h, q] + s * x[q, k]`` over ``allowed``."""
    w = allowed.double()  # [q, k]
    count = w.sum(-1, keepdim=True).clamp(min=1)
    bias = bias.where(allowed, bias.new_zeros(()))
    x_c = (x - (x * w).sum(-1, keepdim=True) / count) * w
    b_c = (bias - (bias * w).sum(-1, keepdim=True) / count) * w
    return (b_c * x_c).sum((0, 2, 3)) / ((x_c * x_c).sum() * bias.shape[0]).clamp(min=1e-300)


@model_property(name="alibi_slopes", order=140, tolerance=TOLERANCE,
                rule="the slope error over its allowance, 1e-3 relative plus what rounding the hook's values in "
                     "their dtype moves a least-squares slope by",
                applies=Applies(positional=("alibi",), min_ctx=3),
                needs=("blocks.0.attn.hook_attn_scores|blocks.0.attn.hook_pattern",))
def alibi_slopes(case: Case) -> Plan:
    """The slopes recovered from layer 0's scores (or pattern) are Press et al.'s, or the declared ones, per head
    (ALiBi models)."""
    model, cfg, (name,) = case.model, case.cfg, case.hooks
    if getattr(cfg, "alibi_slopes", None) is not None:  # the model's own slopes, declared (DesignFacts.alibi_slopes)
        expected, source = design.alibi_design(cfg)[0], "declared"
    else:
        expected = torch.tensor(press_slopes(cfg.n_heads, float(getattr(cfg, "alibi_bias_max", 8.0))),
                                dtype=torch.float64)
        source = f"Press et al. for {cfg.n_heads} heads"
    style = str(getattr(cfg, "alibi_style", "") or "").lower()
    causal = cfg.attention_dir == "causal"
    tokens = st.lists(st.integers(0, cfg.d_vocab - 1), min_size=1, max_size=2)
    strategy = st.tuples(tokens, st.integers(3, max(3, max_len(cfg))))  # one repeated token per row

    def measure(example):
        rows, n = example
        x = torch.tensor(rows, dtype=torch.long)[:, None].expand(-1, n).contiguous()
        acts = capture_activations(model, x, capture=[name])
        u = unit_roundoff(acts[name].dtype)
        scores = acts[name].double()  # [batch, n_heads, q, k]
        i, j = torch.arange(n)[:, None].double(), torch.arange(n)[None, :].double()
        allowed = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
        if name.endswith("hook_pattern"):
            scores = scores.log()  # the scores up to a per-query constant
            eps = torch.full((cfg.n_heads,), 2 * u, dtype=torch.float64)
        else:
            eps = 2 * u * scores.where(allowed, scores.new_zeros(())).abs().amax((0, 2, 3))
        offset = j - i if (causal or "key" in style) else -(i - j).abs()
        slopes = fitted_slopes(scores, allowed, offset).nan_to_num(nan=math.inf)
        w = allowed.double()
        x_c = (offset - (offset * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)) * w
        allow = RTOL * expected + eps * float(x_c.abs().sum() / (x_c * x_c).sum())
        err = ((slopes - expected).abs() / allow).nan_to_num(nan=math.inf)
        h = int(err.argmax())
        return float(err.max()), (f"layer 0 head {h}: slope {fmt(float(slopes[h]))}, expected "
                                  f"{fmt(float(expected[h]))} +- {fmt(float(allow[h]))} ({source}); "
                                  f"recovered {[round(float(s), 5) for s in slopes]}, "
                                  f"expected {[round(float(s), 5) for s in expected]}")

    def describe(example):
        rows, n = example
        return f"tokens={[[t] * n for t in rows]}"

    return Plan(strategy, measure, describe)
