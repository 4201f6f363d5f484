"""Hypothesis strategies for property tests, and the settings profiles.

Every strategy validates its arguments (ValueError naming the value) and says what it
shrinks towards, so a failing example is reported in its simplest form.

Profiles, chosen by the ``HYPOTHESIS_PROFILE`` environment variable through :func:`load_profile`:
``ci`` (derandomized, 25 examples), ``dev`` (50 random examples) and ``thorough`` (500).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from torch import Tensor

from harness._checks import check_int, is_int
from harness.errors import AttnlabError
from harness.model.config import ModelConfig

PROFILES: dict[str, dict[str, Any]] = {
    "ci": dict(derandomize=True, max_examples=25, deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]),
    "dev": dict(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
    "thorough": dict(max_examples=500, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]),
}


def register_profiles() -> None:
    """Register ``ci``, ``dev`` and ``thorough`` with hypothesis (idempotent)."""
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, **kwargs)


def load_profile(name: Optional[str] = None) -> str:
    """Load the profile ``name`` (default: ``$HYPOTHESIS_PROFILE``, else ``dev``) and return its name."""
    register_profiles()
    name = name or os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if name not in PROFILES:
        raise AttnlabError(f"hypothesis profile {name!r} is unknown: expected one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name


def _check_range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if hi < lo:
        raise AttnlabError(f"{hi_name}={hi} is invalid: expected >= {lo_name}={lo}")


def _check_subset(name: str, values: Iterable[Any], allowed: tuple) -> tuple:
    values = tuple(values)
    if not values or any(v not in allowed for v in values):
        raise AttnlabError(f"{name}={values!r} is invalid: expected a non-empty subset of {list(allowed)}")
    return values


# --- model configurations -------------------------------------------------------------------

def model_configs(*, positional_types=("none", "standard", "sinusoidal", "rotary", "alibi"),
                  attention_dirs=("causal", "bidirectional"), normalization_types=("LN", "RMS", None),
                  norm_placements=("pre", "post"), max_layers: int = 2, d_models=(16, 32),
                  variants: bool = True, d_vocab: int = 32, n_ctx: int = 32):
    """Small valid :class:`harness.ModelConfig`s.

    Shrinks towards the first entry of each choice list, one layer, the smallest d_model
    and no variants. With ``variants`` it also draws grouped-query attention, gated MLPs,
    attention-only blocks, ``use_attn_result``, tied embeddings and bias-free layers.
    """
    from harness.model.config import ATTENTION_DIRS, NORM_PLACEMENTS, NORMALIZATION_TYPES, POSITIONAL_TYPES

    positional_types = _check_subset("positional_types", positional_types, POSITIONAL_TYPES)
    attention_dirs = _check_subset("attention_dirs", attention_dirs, ATTENTION_DIRS)
    normalization_types = _check_subset("normalization_types", normalization_types, NORMALIZATION_TYPES)
    norm_placements = _check_subset("norm_placements", norm_placements, NORM_PLACEMENTS)
    check_int("max_layers", max_layers, 1)
    check_int("d_vocab", d_vocab, 2)
    check_int("n_ctx", n_ctx, 2)
    d_models = tuple(d_models)
    if not d_models or any(not is_int(d) or d < 8 or d % 8 for d in d_models):
        raise AttnlabError(f"d_models={d_models!r} is invalid: expected multiples of 8 (4 heads of even width)")

    @st.composite
    def build(draw) -> ModelConfig:
        norm = draw(st.sampled_from(normalization_types))
        placements = norm_placements if norm is not None else tuple(p for p in norm_placements if p == "pre")
        if not placements:
            placements = ("pre",)
        d_model = draw(st.sampled_from(d_models))
        n_heads = draw(st.sampled_from((4, 2)))
        extra = {}
        if variants:
            extra = dict(
                n_key_value_heads=draw(st.sampled_from((None, n_heads // 2))),
                gated_mlp=draw(st.booleans()), attn_only=draw(st.booleans()),
                use_attn_result=draw(st.booleans()), tie_embeddings=draw(st.booleans()),
                attn_bias=not draw(st.booleans()), mlp_bias=not draw(st.booleans()),
                act_fn=draw(st.sampled_from(("gelu", "relu", "silu", "gelu_new"))),
            )
        return ModelConfig(
            n_layers=draw(st.integers(1, max_layers)), d_model=d_model, n_heads=n_heads, d_vocab=d_vocab,
            n_ctx=n_ctx, positional_embedding_type=draw(st.sampled_from(positional_types)),
            attention_dir=draw(st.sampled_from(attention_dirs)), normalization_type=norm,
            norm_placement=draw(st.sampled_from(placements)), seed=draw(st.integers(0, 2**16)), **extra,
        )

    return build()


# --- inputs ------------------------------------------------------------------------------------

def token_lists(d_vocab: int, *, min_len: int = 1, max_len: int = 8):
    """One sequence of token ids in ``[0, d_vocab)`` as a list; shrinks towards ``[0] * min_len``."""
    check_int("d_vocab", d_vocab, 1)
    check_int("min_len", min_len, 1)
    check_int("max_len", max_len, 1)
    _check_range("min_len", min_len, "max_len", max_len)
    return st.lists(st.integers(0, d_vocab - 1), min_size=min_len, max_size=max_len)


def token_batches(d_vocab: int, *, min_batch: int = 1, max_batch: int = 3, min_len: int = 1, max_len: int = 8):
    """Token ids ``[batch, pos]`` (int64); shrinks towards one short sequence of zeros."""
    check_int("min_batch", min_batch, 1)
    check_int("max_batch", max_batch, 1)
    _check_range("min_batch", min_batch, "max_batch", max_batch)
    token_lists(d_vocab, min_len=min_len, max_len=max_len)  # validates the rest
    return _token_batches(d_vocab, min_batch, max_batch, min_len, max_len)


# The composites here and in the checks are defined once, at module level, and given their settings as
# arguments: @st.composite reads the decorated function's source to check that it calls draw, and a composite
# defined inside the function that returns the strategy did that at every search (~5% of a tiny model's check).
@st.composite
def _token_batches(draw, d_vocab: int, min_batch: int, max_batch: int, min_len: int, max_len: int) -> Tensor:
    n = draw(st.integers(min_len, max_len))
    rows = draw(st.lists(st.lists(st.integers(0, d_vocab - 1), min_size=n, max_size=n),
                         min_size=min_batch, max_size=max_batch))
    return torch.tensor(rows, dtype=torch.long)


LONGEST_DRAWN = 512  # tokens hypothesis draws one by one; past this a row comes from a drawn seed (its buffer is 8 KiB)


def long_token_batches(d_vocab: int, length: int, *, max_batch: int = 1):
    """Token ids ``[batch, length]`` for sequences too long to draw token by token.

    Hypothesis draws every value through a buffer of a few kilobytes, so a list of thousands of ids
    is too large to generate (every attempt fails and the search is unsatisfiable: a sliding window
    of 4096 needs 4099 tokens). Here each row is ``torch.randint`` from a drawn seed; the rows of a
    seed are the same on every machine (torch's CPU generator). Shrinks towards one row from seed 0.
    """
    check_int("d_vocab", d_vocab, 1)
    check_int("length", length, 1)
    check_int("max_batch", max_batch, 1)
    return _long_token_batches(d_vocab, length, max_batch)


@st.composite
def _long_token_batches(draw, d_vocab: int, length: int, max_batch: int) -> Tensor:
    seeds = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=max_batch))
    rows = [torch.randint(0, d_vocab, (length,), generator=torch.Generator().manual_seed(seed)) for seed in seeds]
    return torch.stack(rows)


def permutations(n: int):
    """A permutation of ``range(n)`` as an int64 tensor; shrinks towards the identity."""
    check_int("n", n, 1)
    return st.permutations(list(range(n))).map(lambda p: torch.tensor(p, dtype=torch.long))


def position_offsets(max_offset: int, *, min_offset: int = 0):
    """A position offset in ``[min_offset, max_offset]``; shrinks towards ``min_offset``."""
    check_int("min_offset", min_offset, 0)
    check_int("max_offset", max_offset, 0)
    _check_range("min_offset", min_offset, "max_offset", max_offset)
    return st.integers(min_offset, max_offset)


@dataclass(frozen=True)
class PaddedBatch:
    """Rows of real tokens padded to one length: ``tokens``/``mask`` ``[batch, pos]`` (mask 1 = real)."""

    rows: tuple[tuple[int, ...], ...]
    sides: tuple[str, ...]
    tokens: Tensor
    mask: Tensor

    def real_positions(self, row: int) -> Tensor:
        return self.mask[row].nonzero().flatten()

    def mirrored(self) -> PaddedBatch:
        """The same rows and pad ids, each row padded on its other side.

        A check that runs a batch and its mirror sees every row both left- and right-padded: right
        padding sits after every real token, so a causal model's leak to a padded key shows only in
        a left-padded row, and a search of few examples may draw none.
        """
        tokens, mask = [], []
        for r, side in enumerate(self.sides):
            real = self.mask[r].bool()
            toks = self.tokens[r]
            first, rest = (toks[real], toks[~real]) if side == "left" else (toks[~real], toks[real])
            tokens.append(torch.cat([first, rest]))
            mask.append(torch.cat([torch.ones_like(first), torch.zeros_like(rest)]) if side == "left"
                        else torch.cat([torch.zeros_like(first), torch.ones_like(rest)]))
        flipped = tuple("right" if side == "left" else "left" for side in self.sides)
        return PaddedBatch(self.rows, flipped, torch.stack(tokens), torch.stack(mask).to(self.mask.dtype))

    def describe(self) -> str:
        return f"tokens={self.tokens.tolist()} mask={self.mask.tolist()}"


def padded_batches(d_vocab: int, *, max_batch: int = 2, max_len: int = 6, max_pad: int = 4,
                   sides=("left", "right")):
    """Rows of 1..``max_len`` real tokens, each padded on a random side with random pad ids.

    Every row is padded to the longest row plus 1..``max_pad`` extra pads, so at least one
    pad is present in every row. Shrinks towards one row, one token, one pad, the first side
    and pad id 0.
    """
    check_int("max_batch", max_batch, 1)
    check_int("max_pad", max_pad, 1)
    sides = _check_subset("sides", sides, ("left", "right"))
    rows_st = token_lists(d_vocab, max_len=max_len)
    return _padded_batches(d_vocab, rows_st, max_batch, max_pad, sides)


@st.composite
def _padded_batches(draw, d_vocab: int, rows_st, max_batch: int, max_pad: int, sides: tuple[str, ...]) -> PaddedBatch:
    rows = draw(st.lists(rows_st, min_size=1, max_size=max_batch))
    total = max(len(r) for r in rows) + draw(st.integers(1, max_pad))
    tokens, mask, row_sides = [], [], []
    for r in rows:
        side = draw(st.sampled_from(sides))
        pads = draw(st.lists(st.integers(0, d_vocab - 1), min_size=total - len(r), max_size=total - len(r)))
        real, fill = list(r), [1] * len(r)
        if side == "left":
            tokens.append(pads + real)
            mask.append([0] * len(pads) + fill)
        else:
            tokens.append(real + pads)
            mask.append(fill + [0] * len(pads))
        row_sides.append(side)
    return PaddedBatch(tuple(tuple(r) for r in rows), tuple(row_sides),
                       torch.tensor(tokens, dtype=torch.long), torch.tensor(mask, dtype=torch.long))
