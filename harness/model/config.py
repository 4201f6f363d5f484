"""Validated configuration dataclasses.

Field names follow TransformerLens's config so that TransformerLens helpers
(``ActivationCache.decompose_resid`` and friends) read them unchanged.
``__post_init__`` validates and nothing else: no seeding, no device choice.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

from harness._checks import (
    MAX_SEED,  # noqa: F401 - re-exported: the seed bound is part of what a config accepts
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_seed,
    invalid,
)
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.protocol_facts import ATTENTION_DIRS, POSITIONAL_TYPES  # the protocol's values, defined once

ACT_FNS = ("relu", "gelu", "gelu_new", "silu")
NORMALIZATION_TYPES = ("LN", "RMS", None)
NORM_PLACEMENTS = ("pre", "post")
DTYPES = ("float32", "float64", "bfloat16", "float16")
BOOL_WORDING = "a bool (True or False)"  # what the config fields say a bool is


class _JSONMixin:
    """JSON round-trip shared by the config dataclasses."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass

    def to_json(self, path: Optional[str | Path] = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: dict):
        if not isinstance(data, dict):
            raise AttnlabTypeError(f"{cls.__name__}.from_dict expects a dict, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise AttnlabError(f"{cls.__name__}: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path):
        path = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        text = path.read_text() if path is not None else str(text_or_path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            where = f" in {path}" if path is not None else ""
            raise AttnlabError(f"{cls.__name__}: invalid JSON{where}: {exc}") from None
        return cls.from_dict(data)


@dataclass(frozen=True)
class ModelConfig(_JSONMixin):
    """Architecture of a :class:`harness.Transformer`.

    ``d_head`` defaults to ``d_model // n_heads``; ``d_mlp`` to ``4 * d_model``.
    ``positional_embedding_type``: "standard" is a learned absolute table of ``n_ctx`` rows.
    ``n_key_value_heads`` < ``n_heads`` gives grouped-query attention (Ainslie et al. 2023).
    """

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_head: Optional[int] = None
    d_mlp: Optional[int] = None
    d_vocab: int = 64
    n_ctx: int = 128
    act_fn: str = "gelu"
    gated_mlp: bool = False
    normalization_type: Optional[str] = "LN"
    norm_placement: str = "pre"
    positional_embedding_type: str = "standard"
    rotary_base: float = 10000.0
    attention_dir: str = "causal"
    attn_only: bool = False
    use_attn_scale: bool = True
    use_attn_result: bool = False
    tie_embeddings: bool = False
    n_key_value_heads: Optional[int] = None
    attn_bias: bool = True
    mlp_bias: bool = True
    eps: float = 1e-5
    init_range: float = 0.02
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_vocab", "n_ctx"):
            check_int(name, getattr(self, name), 1)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise invalid("d_head", None, f"an explicit d_head, since d_model={self.d_model} "
                            f"is not divisible by n_heads={self.n_heads}")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        check_int("d_head", self.d_head, 1)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        check_int("d_mlp", self.d_mlp, 1)
        check_choice("act_fn", self.act_fn, ACT_FNS)
        check_choice("normalization_type", self.normalization_type, NORMALIZATION_TYPES)
        check_choice("norm_placement", self.norm_placement, NORM_PLACEMENTS)
        check_choice("positional_embedding_type", self.positional_embedding_type, POSITIONAL_TYPES)
        check_choice("attention_dir", self.attention_dir, ATTENTION_DIRS)
        check_choice("dtype", self.dtype, DTYPES)
        for name in ("gated_mlp", "attn_only", "use_attn_scale", "use_attn_result",
                     "tie_embeddings", "attn_bias", "mlp_bias"):
            check_bool(name, getattr(self, name), expected=BOOL_WORDING)
        check_number("rotary_base", self.rotary_base, 1.0)
        check_number("eps", self.eps, 0.0, 1.0)
        check_number("init_range", self.init_range, 0.0)
        check_seed("seed", self.seed)
        if self.n_key_value_heads is not None:
            check_int("n_key_value_heads", self.n_key_value_heads, 1)
            if self.n_heads % self.n_key_value_heads:
                raise invalid("n_key_value_heads", self.n_key_value_heads,
                            f"a divisor of n_heads={self.n_heads}")
        if self.positional_embedding_type == "rotary" and cast(int, self.d_head) % 2:  # resolved above
            raise invalid("d_head", self.d_head, "an even number for rotary embeddings (RoPE rotates pairs)")
        if self.positional_embedding_type == "sinusoidal" and self.d_model % 2:
            raise invalid("d_model", self.d_model, "an even number for sinusoidal embeddings (sin/cos pairs)")
        if self.norm_placement == "post" and self.normalization_type is None:
            raise invalid("norm_placement", "post", "'pre' when normalization_type is None "
                        "(post-norm means normalizing after each residual add)")

    # TransformerLens helpers read these names.
    @property
    def n_kv_heads(self) -> int:
        return self.n_key_value_heads or self.n_heads

    @property
    def final_rms(self) -> bool:
        return False

    @property
    def default_prepend_bos(self) -> bool:
        return False

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (configs are never mutated)."""
        return dataclasses.replace(self, **changes)
