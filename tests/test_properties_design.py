"""Checks follow the model's declared design (cfg fields, properties.design), and still bite.

Each design has a pair: a reference model (tests/mutants/base.py) built that way and declaring it
passes; the same model declaring something else, or breaking the declared design, fails. Small
models (1 layer, d_model 32) and few examples: every planted discrepancy is visible on a single
token or two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from transformer_lens.config.transformer_bridge_config import TransformerBridgeConfig

import properties
from harness import ModelConfig, Transformer
from harness.model.positions import alibi_slopes
from properties import design
from tests.mutants.base import RefAttention, RefConfig, RefModel, rope

FAST = 6

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Declared(RefConfig):
    """RefConfig plus the optional design fields a model may declare."""

    n_layers: int = 1
    attn_scale: Optional[float] = None
    attn_softcap: Optional[float] = None
    alibi_style: Optional[str] = None
    alibi_slopes: Optional[tuple[float, ...]] = None
    rotary_dim: Optional[int] = None
    rotary_style: Optional[str] = None
    qk_norm: bool = False


def model(attention: type, **cfg) -> RefModel:
    cls = type(f"{attention.__name__}Model", (RefModel,), {"attention_cls": attention})
    return cls(Declared(**cfg))


def row(m, name: str):
    return properties.check_model(m, max_examples=FAST, properties=[name]).iloc[0]


# --- the attention scale -----------------------------------------------------------------------

class HalfScale(RefAttention):
    def scale(self):
        return 0.5


def test_declared_scale_passes_and_is_reported_against_the_textbook():
    r = row(model(HalfScale, attn_scale=0.5), "attention_scale")
    assert r.status == "pass", r.counterexample
    assert "1/sqrt(d_head)=0.354" in r.reason and "measured 0.5 = 1.41 x 1/sqrt(d_head)" in r.reason


def test_a_scale_other_than_the_declared_one_fails():
    r = row(model(RefAttention, attn_scale=0.5), "attention_scale")  # uses 1/sqrt(8), declares 0.5
    assert r.status == "fail" and "q.k * 0.5" in r.counterexample
    assert row(model(HalfScale), "attention_scale").status == "fail"  # uses 0.5, declares nothing


class SoftCapped(RefAttention):
    CAP = 0.5  # small against scores of order 1, so tanh is far from linear

    def apply_mask(self, scores, allowed):
        return super().apply_mask(self.CAP * torch.tanh(scores / self.CAP), allowed)  # Gemma 2's order


def test_soft_cap_is_followed_when_declared():
    assert row(model(SoftCapped, attn_softcap=0.5), "attention_scale").status == "pass"
    assert row(model(SoftCapped), "attention_scale").status == "fail"
    assert row(model(RefAttention, attn_softcap=0.5), "attention_scale").status == "fail"


# --- sliding windows ---------------------------------------------------------------------------

class IgnoresWindow(RefAttention):
    def window(self):
        return None  # the cfg declares a window the attention does not apply


class HiddenWindow(RefAttention):
    def window(self):
        return 2  # a window the cfg does not declare


def test_a_declared_sliding_window_is_respected():
    m = model(RefAttention, sliding_window=(2,))
    frame = properties.check_model(m, max_examples=FAST, properties=["causal_pattern", "attention_scale"])
    assert (frame.status == "pass").all(), frame.to_dict("records")


def test_weight_outside_the_declared_window_fails():
    r = row(model(IgnoresWindow, sliding_window=(2,)), "causal_pattern")
    assert r.status == "fail" and "outside its window of 2" in r.counterexample
    assert row(model(IgnoresWindow, sliding_window=(2,)), "attention_scale").status == "fail"


def test_an_undeclared_window_is_a_masked_score_where_one_is_expected():
    r = row(model(HiddenWindow), "attention_scale")
    assert r.status == "fail" and "masked" not in r.counterexample  # an allowed key got -inf
    assert row(model(HiddenWindow), "causal_pattern").status == "pass"  # less weight is not a leak


# --- ALiBi -------------------------------------------------------------------------------------

class AbsoluteKeyAlibi(RefAttention):
    def alibi_bias(self, q_pos, k_pos):
        # Bloom: m_h * j, which is -m_h (i - j) plus the per-query constant m_h * i
        return self.slopes()[None, :, None, None] * k_pos[:, None, None, :].expand(-1, -1, q_pos.shape[1], -1)


class DoubledSlopeAbsoluteKey(AbsoluteKeyAlibi):
    def slopes(self):
        return 2 * super().slopes()


def test_absolute_key_alibi_passes_modulo_a_per_query_constant():
    r = row(model(AbsoluteKeyAlibi, positional_embedding_type="alibi", alibi_style="absolute_key"),
            "attention_scale")
    assert r.status == "pass", r.counterexample
    assert "ALiBi absolute_key" in r.reason


def test_absolute_key_alibi_is_not_relative_and_a_wrong_slope_fails():
    undeclared = row(model(AbsoluteKeyAlibi, positional_embedding_type="alibi"), "attention_scale")
    assert undeclared.status == "fail"  # the relative comparison is exact: the constant m_h * i shows
    wrong = row(model(DoubledSlopeAbsoluteKey, positional_embedding_type="alibi", alibi_style="absolute_key"),
                "attention_scale")
    assert wrong.status == "fail" and "modulo a per-query constant" in wrong.counterexample


class DoubledSlope(RefAttention):
    def slopes(self):
        return 2 * super().slopes()


def test_declared_alibi_slopes_are_the_ones_expected():
    """Falcon-RW's slopes are Press et al.'s / sqrt(head_dim), declared by the HF adapter: the slopes row follows
    what a model declares, and still fails slopes that are neither declared nor Press et al.'s."""
    doubled = tuple(2 * float(s) for s in alibi_slopes(4))
    declared = row(model(DoubledSlope, positional_embedding_type="alibi", alibi_slopes=doubled), "alibi_slopes")
    assert declared.status == "pass", declared.counterexample
    undeclared = row(model(DoubledSlope, positional_embedding_type="alibi"), "alibi_slopes")
    assert undeclared.status == "fail" and "Press et al. for 4 heads" in undeclared.counterexample
    broken = row(model(RefAttention, positional_embedding_type="alibi", alibi_slopes=doubled), "alibi_slopes")
    assert broken.status == "fail" and "(declared)" in broken.counterexample


def test_bad_declarations_are_errors_before_any_work():
    with pytest.raises(ValueError, match="alibi_style"):
        row(model(RefAttention, positional_embedding_type="alibi", alibi_style="bloom"), "attention_scale")
    with pytest.raises(ValueError, match="attn_softcap"):
        row(model(RefAttention, attn_softcap=-1.0), "attention_scale")


# --- rotary --------------------------------------------------------------------------------------

def _rms(x):
    return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


class QKNormRotary(RefAttention):
    """q/k RMS-norm between hook_q/hook_k and the rotation (Qwen3)."""

    def rotate_q(self, q, pos):
        return rope(_rms(q), pos, self.cfg.base)

    def rotate_k(self, k, pos):
        return rope(_rms(k), pos, self.cfg.base)


class PartialRotary(RefAttention):
    """Only the first half of each head's dims rotate, in rotate-half pairs (GPT-NeoX's rotary_pct)."""

    def rotate_q(self, q, pos):
        return torch.cat((rope(q[..., :4], pos, self.cfg.base), q[..., 4:]), -1)

    def rotate_k(self, k, pos):
        return torch.cat((rope(k[..., :4], pos, self.cfg.base), k[..., 4:]), -1)


def test_qk_norm_before_the_rotation_passes_rotary_norm():
    m = model(QKNormRotary, positional_embedding_type="rotary", qk_norm=True)
    frame = properties.check_model(m, max_examples=FAST, properties=["rotary_norm", "attention_scale",
                                                                     "relative_position"])
    assert (frame.status == "pass").all(), frame.to_dict("records")


def test_partial_rotary_passes_with_its_declared_layout_and_fails_with_another():
    ok = row(model(PartialRotary, positional_embedding_type="rotary", rotary_dim=4, rotary_style="half"),
             "rotary_norm")
    assert ok.status == "pass" and "rotary_dim=4, half pairs" in ok.reason
    wrong = row(model(PartialRotary, positional_embedding_type="rotary", rotary_dim=4, rotary_style="interleaved"),
                "rotary_norm")
    assert wrong.status == "fail" and "position_offsets=" in wrong.counterexample


def test_a_transformer_lens_config_declares_its_scale_as_a_divisor():
    # TransformerLens divides q.k by cfg.attn_scale (-1: sqrt(d_head)) and caps with attn_scores_soft_cap
    def tl(**kw):
        return TransformerBridgeConfig(d_model=32, d_head=8, n_layers=1, n_ctx=32, n_heads=4, d_vocab=32, **kw)

    assert design.attn_scale(tl(), 0) == pytest.approx(8 ** -0.5)
    assert design.attn_scale(tl(attn_scale=4.0), 0) == 0.25
    assert design.attn_scale(tl(use_attn_scale=False), 0) == 1.0
    assert design.softcap(tl()) is None and design.softcap(tl(attn_scores_soft_cap=50.0)) == 50.0


def test_an_unscaled_harness_model_declares_it():
    model = Transformer(ModelConfig(n_layers=1, d_model=32, n_heads=4, d_vocab=32, n_ctx=32, use_attn_scale=False))
    assert model.cfg.attn_scale == 1.0
    r = row(model, "attention_scale")
    assert r.status == "pass" and "measured 1 = 2.83 x 1/sqrt(d_head)" in r.reason
