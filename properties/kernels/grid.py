"""The grid: one hypothesis strategy per property (row), each varying one feature over plain defaults.

A row's name says which feature its inputs exercise, so a failure names the feature. Every strategy shrinks
towards its feature's simplest form (small batch, few heads, short rows, head dim 8, the first mask form).
Sizes are kept small: one example is a handful of milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from properties.kernels.capabilities import Capabilities
from properties.kernels.case import Case

HEAD_DIMS = (8, 1, 3, 16, 17, 64, 80, 128, 256)  # odd and large ones; 8 first, what it shrinks to
SEEDS = st.integers(0, 2**16)


@dataclass(frozen=True)
class Row:
    name: str
    feature: str  # the Capabilities field it needs ("" for none)
    doc: str
    draw: Callable[[Any, Capabilities, str], Case]


def _masks(caps: Capabilities, causal_only: bool) -> list[str]:
    """The mask forms a case may take: "none" only where nothing is masked or SDPA's causal flag covers it."""
    return list(caps.mask_forms) + (["none"] if causal_only and caps.causal_flag else [])


def _base(draw: Any, dtype: str, **fixed: Any) -> Case:
    h_kv = draw(st.sampled_from((1, 2)))
    fields: dict[str, Any] = dict(b=draw(st.integers(1, 2)), h_kv=h_kv, h=h_kv * draw(st.sampled_from((1, 2))),
                                  q=draw(st.integers(1, 6)), d=8, dv=8, dtype=dtype, seed=draw(SEEDS))
    fields["k"] = fields["q"]
    fields.update(fixed)
    return Case(**fields)


def _plain(draw: Any, caps: Capabilities, dtype: str) -> Case:
    d = draw(st.sampled_from(HEAD_DIMS))
    case = _base(draw, dtype, d=d, dv=d, h_kv=1, h=draw(st.integers(1, 3)))
    return Case(**{**case.__dict__, "h_kv": case.h})


def _value_dim(draw: Any, caps: Capabilities, dtype: str) -> Case:
    d = draw(st.sampled_from((8, 16, 3, 64)))
    dv = draw(st.sampled_from(tuple(x for x in (16, 8, 32, 5) if x != d)))
    return _base(draw, dtype, d=d, dv=dv, mask=draw(st.sampled_from(["none", *caps.mask_forms])))


def _scaling(draw: Any, caps: Capabilities, dtype: str) -> Case:
    d = draw(st.sampled_from((8, 16, 64)))
    scaling = draw(st.sampled_from((1.0, 0.5, 256 ** -0.5, (2 * d) ** -0.5, 0.125 / 3)))
    return _base(draw, dtype, d=d, dv=d, h_kv=1, h=1, scaling=scaling)


def _causal(draw: Any, caps: Capabilities, dtype: str) -> Case:
    return _base(draw, dtype, causal=True, q=(n := draw(st.integers(2, 12))), k=n,
                 mask=draw(st.sampled_from(_masks(caps, True))))


def _padding(draw: Any, caps: Capabilities, dtype: str) -> Case:
    b = draw(st.integers(2, 3))
    n = draw(st.integers(3, 10))
    side = draw(st.sampled_from(("left", "right")))
    pads = tuple(draw(st.integers(0, n - 1)) for _ in range(b))
    left, right = (pads, ()) if side == "left" else ((), pads)
    return _base(draw, dtype, b=b, q=n, k=n, causal=draw(st.booleans()), pad_left=left, pad_right=right,
                 mask=draw(st.sampled_from(_masks(caps, False))))


def _gqa(draw: Any, caps: Capabilities, dtype: str) -> Case:
    h_kv = draw(st.sampled_from((1, 2, 3)))  # 1: multi-query
    groups = draw(st.sampled_from((2, 3, 4)))
    n = draw(st.integers(1, 8))
    causal = draw(st.booleans()) and n > 1
    mask = draw(st.sampled_from(_masks(caps, causal) if causal else ["none", *caps.mask_forms]))
    return _base(draw, dtype, h=h_kv * groups, h_kv=h_kv, q=n, k=n, causal=causal, mask=mask)


def _decode(draw: Any, caps: Capabilities, dtype: str) -> Case:
    q = draw(st.integers(1, 3))
    k = draw(st.integers(q + 1, 300))  # long rows: a softmax normalised in low precision shows here
    causal = draw(st.booleans())
    return _base(draw, dtype, q=q, k=k, causal=causal, mask=draw(st.sampled_from(
        _masks(caps, False) if causal else ["none", *caps.mask_forms])))


def _window(draw: Any, caps: Capabilities, dtype: str) -> Case:
    k = draw(st.integers(2, 24))
    q = draw(st.sampled_from((k, 1, max(1, k // 2))))
    return _base(draw, dtype, q=q, k=k, causal=True, window=draw(st.integers(1, k)),
                 window_in_mask=not caps.window_from_kwarg, mask=draw(st.sampled_from(_masks(caps, False))))


def _softcap(draw: Any, caps: Capabilities, dtype: str) -> Case:
    n = draw(st.integers(2, 10))
    return _base(draw, dtype, q=n, k=n, causal=True, softcap=draw(st.sampled_from((5.0, 1.0, 20.0, 50.0))),
                 amplitude=draw(st.sampled_from((8.0, 30.0))), mask=draw(st.sampled_from(_masks(caps, False))),
                 pad_left=(draw(st.integers(0, n - 1)),))


def _sinks(draw: Any, caps: Capabilities, dtype: str) -> Case:
    n = draw(st.integers(1, 10))
    return _base(draw, dtype, q=n, k=n, sinks=True, causal=n > 1,
                 mask=draw(st.sampled_from(_masks(caps, False))) if n > 1 else "none")


def _bias(draw: Any, caps: Capabilities, dtype: str) -> Case:
    n = draw(st.integers(1, 10))
    return _base(draw, dtype, q=n, k=n, bias=draw(st.sampled_from(("alibi", "random"))), causal=draw(st.booleans()),
                 mask="additive")


def _bool_mask(draw: Any, caps: Capabilities, dtype: str) -> Case:
    b, k = draw(st.integers(1, 2)), draw(st.integers(2, 12))
    hidden = draw(st.lists(st.tuples(st.integers(0, b - 1), st.integers(0, k - 1)), min_size=1, max_size=k - 1,
                           unique=True))
    per_row: dict[int, int] = {}
    for row, _ in hidden:
        per_row[row] = per_row.get(row, 0) + 1
    hidden = [hk for hk in hidden if per_row[hk[0]] < k]  # keep a visible key in every row
    return _base(draw, dtype, b=b, q=draw(st.integers(1, k)), k=k, hidden=tuple(sorted(hidden)),
                 mask=draw(st.sampled_from(_masks(caps, False))))


def _noncontiguous(draw: Any, caps: Capabilities, dtype: str) -> Case:
    layout = draw(st.sampled_from(("transposed", "sliced", "expanded")))
    case = _base(draw, dtype, layout=layout, d=draw(st.sampled_from((8, 16, 3))))
    return Case(**{**case.__dict__, "dv": case.d, "b": 1 if layout == "expanded" else case.b})


def _masked_rows(draw: Any, caps: Capabilities, dtype: str) -> Case:
    n = draw(st.integers(2, 8))
    rows = tuple(sorted(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 1, unique=True))))
    return _base(draw, dtype, q=n, k=n, masked_rows=rows, mask=draw(st.sampled_from(_masks(caps, False))))


def _determinism(draw: Any, caps: Capabilities, dtype: str) -> Case:
    n = draw(st.integers(1, 40))
    return _base(draw, dtype, q=n, k=n, causal=n > 1, mask=draw(st.sampled_from(_masks(caps, False))) if n > 1
                 else "none")


ROWS: tuple[Row, ...] = tuple(Row(name, feature, doc, fn) for name, feature, doc, fn in (
    ("plain", "", "no mask; head dims 1 to 256, odd ones", _plain),
    ("value_dim", "", "a value head dim other than the query/key one (dv != d, as in MLA)", _value_dim),
    ("scaling", "", "an explicit scaling that is not d^-1/2 (Gemma's query_pre_attn_scalar, T5's 1)", _scaling),
    ("causal", "", "causal, q == k, through the mask (or SDPA's is_causal flag where declared)", _causal),
    ("padding", "", "left or right padding per batch row, causal or not", _padding),
    ("gqa", "gqa", "grouped and multi-query K/V heads (h_kv in 1..3, groups 2..4)", _gqa),
    ("decode", "", "fewer queries than keys (1..3 against up to 300: long rows), causal bottom-right", _decode),
    ("sliding_window", "", "causal sliding windows of 1..k keys, q <= k", _window),
    ("softcap", "softcap", "a soft cap (5, 1, 20, 50) on large scores, with a causal and padding mask", _softcap),
    ("sinks", "sinks", "a sink logit per head in the softmax denominator (s_aux)", _sinks),
    ("additive_bias", "bias", "ALiBi or a random per-head bias in an additive mask", _bias),
    ("bool_mask", "", "an arbitrary pattern of hidden keys, boolean or additive", _bool_mask),
    ("noncontiguous", "", "q, k, v transposed ([b, s, h, d] storage), sliced from wider features, stride-0 batch",
     _noncontiguous),
    ("masked_rows", "", "query rows that see no key: which convention (zero, NaN, uniform), consistently",
     _masked_rows),
    ("determinism", "", "the same call twice gives the same bits", _determinism),
))
NAMES = tuple(r.name for r in ROWS)


def strategy(row: Row, caps: Capabilities, dtype: str) -> st.SearchStrategy[Case]:
    return _case(row, caps, dtype)


# at module level: @st.composite reads the source of the function it decorates, which a composite made per search
# would do at every search
@st.composite
def _case(draw, row: Row, caps: Capabilities, dtype: str) -> Case:
    return row.draw(draw, caps, dtype)

