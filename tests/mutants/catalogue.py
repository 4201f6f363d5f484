"""The mutation catalogue: deliberately broken attention models, one planted bug each.

Each mutant subclasses the reference in ``base.py`` and overrides one step. ``must_flag`` names
the properties that, by the argument in the docstring, have to catch it; the test checks those
and records every other property that also fires (the kill matrix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tests.mutants import cross_attention as xa
from tests.mutants.base import RefAttention, RefConfig, RefModel, RefNorm, declaration, rope, sinusoids
from tests.mutants.moe import MoeModel


@dataclass(frozen=True)
class Mutant:
    name: str
    model_cls: type
    cfg: RefConfig
    must_flag: tuple[str, ...]
    bug: str

    def build(self) -> RefModel:
        return self.model_cls(self.cfg)


# --- mask bugs -------------------------------------------------------------------------------

class OffByOneMaskAttention(RefAttention):
    def allowed(self, q_idx, k_idx, key_mask):
        ok = (k_idx[None, :] <= q_idx[:, None] + 1)[None] & key_mask[:, None, :]  # sees one key ahead
        return (ok | (k_idx[None, None, :] == q_idx[None, :, None]))[:, None]


class MaskAfterSoftmaxAttention(RefAttention):
    def apply_mask(self, scores, allowed):
        return scores  # the mask is applied to the pattern instead, and rows are never renormalized

    def normalize(self, scores, allowed):
        return scores.softmax(-1) * allowed


class QueryPaddingAttention(RefAttention):
    def allowed(self, q_idx, k_idx, key_mask):
        ok = torch.ones(len(q_idx), len(k_idx), dtype=torch.bool)
        if self.cfg.attention_dir == "causal":
            ok = k_idx[None, :] <= q_idx[:, None]
        query_mask = key_mask[:, -len(q_idx):]
        ok = ok[None] & query_mask[:, :, None]  # padding removes the padded *queries'* rows
        return (ok | (k_idx[None, None, :] == q_idx[None, :, None]))[:, None]


# --- scale bugs ------------------------------------------------------------------------------

class NoScaleAttention(RefAttention):
    def scale(self):
        return 1.0


class InverseDkAttention(RefAttention):
    def scale(self):
        return 1.0 / self.cfg.d_head


# --- softmax bugs ----------------------------------------------------------------------------

class QuerySoftmaxAttention(RefAttention):
    def normalize(self, scores, allowed):
        return scores.softmax(-2)


# --- rotary bugs -----------------------------------------------------------------------------

class MixedRopeLayoutAttention(RefAttention):
    def rotate_k(self, k, pos):
        return rope(k, pos, self.cfg.base, layout="interleaved")  # q uses rotate-half pairs


class NormChangingRopeAttention(RefAttention):
    def rotate_q(self, q, pos):
        return _skewed_rope(q, pos, self.cfg.base)

    def rotate_k(self, k, pos):
        return _skewed_rope(k, pos, self.cfg.base)


def _skewed_rope(x: Tensor, pos: Tensor, base: float) -> Tensor:
    """cos built with repeat_interleave (interleaved frequencies) but sin with cat (half layout):
    the pair (i, i + d/2) turns by two different angles, which is not a rotation."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None, None] * inv
    cos = ang.cos().repeat_interleave(2, -1).to(x.dtype)
    sin = torch.cat((ang.sin(), ang.sin()), -1).to(x.dtype)
    rotated_half = torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1)
    return x * cos + rotated_half * sin


class AbsoluteLeakRotaryModel(RefModel):
    def embed_positions(self, pos):
        return sinusoids(pos, self.cfg.d_model, self.cfg.base)  # an absolute table left in a rotary model


# --- position bugs -----------------------------------------------------------------------------

class IndexPositionsModel(RefModel):
    def positions(self, mask, offset):
        return offset + torch.arange(mask.shape[1]).expand(mask.shape)  # left padding shifts positions


class PositionLeakModel(RefModel):
    def embed_positions(self, pos):
        index = torch.arange(pos.shape[1]).expand(pos.shape)  # "none" declared, index sinusoids added
        return sinusoids(index, self.cfg.d_model, self.cfg.base)


class OddFrequencySinusoidModel(RefModel):
    def embed_positions(self, pos):
        # the classic slip: PE(pos, 2i+1) = cos(pos / base^((2i+1)/d)) instead of base^(2i/d), so a
        # sin/cos pair no longer shares a frequency and a shift is no longer a rotation
        d = self.cfg.d_model
        ang = pos.double()[..., None] / self.cfg.base ** (torch.arange(d, dtype=torch.float64) / d)
        even = torch.arange(d) % 2 == 0
        return torch.where(even, ang.sin(), ang.cos()).float()


class RestartingCacheModel(RefModel):
    def step_positions(self, full_mask, past, offset):
        return self.positions(full_mask[:, past:], offset)  # each cached step restarts at position 0


# --- normalization bug -------------------------------------------------------------------------

class BatchStatsNorm(RefNorm):
    def stats_dims(self):
        return (0, -1)  # statistics over the batch axis too, like a BatchNorm/LayerNorm hybrid


class BatchNormModel(RefModel):
    norm_cls = BatchStatsNorm


# --- field-bug families (tests/field_bugs replays the real ones in transformers) ---------------

class WideWindowAttention(RefAttention):
    def window(self):
        w = super().window()
        return None if w is None else w + 1  # declares w, admits w + 1 keys (transformers #29623)


class EveryLayerWindowAttention(RefAttention):
    def window(self):
        return 3  # the window of the sliding layers applied to the full ones too (vLLM #21863, Gemma 2/3, Cohere2)


class OffBaseRopeAttention(RefAttention):
    # turns by a base 1% off the one the config declares (a port reading a rounded or default rope_theta)
    def rotate_q(self, q, pos):
        return rope(q, pos, self.cfg.base * 1.01)

    def rotate_k(self, k, pos):
        return rope(k, pos, self.cfg.base * 1.01)


class TwoSidedKernelWindowAttention(RefAttention):
    def kernel(self, raw_scores, pattern, v, q_idx, k_idx, key_mask):
        # FlashAttention's window_size=(w, w) admits i - w <= j <= i under causality: w + 1 keys,
        # while the explicit mask (and so hook_pattern) admits w (transformers #39408)
        w = self.window()
        ok = (k_idx[None, :] <= q_idx[:, None]) & (k_idx[None, :] >= q_idx[:, None] - w)
        ok = (ok[None] & key_mask[:, None, :]) | (k_idx[None, None, :] == q_idx[None, :, None])
        weights = raw_scores.masked_fill(~ok[:, None], float("-inf")).softmax(-1)
        return torch.einsum("bhqk,bkhd->bqhd", weights, v)


class OffByOneSlopeAttention(RefAttention):
    def slopes(self):
        n = self.cfg.n_heads
        return torch.tensor([2 ** (-8 * i / n) for i in range(n)])  # h = 0..n-1: slope[0] = 1 (aprender #2143)


class GeometricOnlySlopeAttention(RefAttention):
    def slopes(self):
        n = self.cfg.n_heads
        return torch.tensor([2 ** (-8 * (i + 1) / n) for i in range(n)])  # no non-power-of-two rule (alibi #17)


class NoSelfAttention(RefAttention):
    def allowed(self, q_idx, k_idx, key_mask):
        ok = k_idx[None, :] <= q_idx[:, None]
        return (ok[None] & key_mask[:, None, :])[:, None]  # a left-padded query sees no key: softmax of all -inf


class Bfloat16PhaseAttention(RefAttention):
    def rotate_q(self, q, pos):
        return _bf16_rope(q, pos, self.cfg.base)

    def rotate_k(self, k, pos):
        return _bf16_rope(k, pos, self.cfg.base)


def _bf16_rope(x: Tensor, pos: Tensor, base: float) -> Tensor:
    """RoPE with inv_freq and the phase in bfloat16 (transformers #25681, gpt-neox #1003)."""
    d = x.shape[-1]
    inv = (1.0 / base ** (torch.arange(0, d, 2).float() / d)).bfloat16()
    ang = (pos.bfloat16()[..., None, None] * inv).float()
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


def _model(attention: type) -> type:
    return type(f"{attention.__name__}Model", (RefModel,), {"attention_cls": attention})


def _cfg(**kw) -> RefConfig:
    return RefConfig(**kw)


MUTANTS: list[Mutant] = [
    Mutant("causal_mask_off_by_one", _model(OffByOneMaskAttention), _cfg(positional_embedding_type="standard"),
           ("causal_outputs", "causal_pattern"), "query i also sees key i + 1"),
    Mutant("mask_after_softmax", _model(MaskAfterSoftmaxAttention), _cfg(positional_embedding_type="rotary"),
           ("pattern_distribution", "attention_scale"), "causal mask multiplies the pattern after the softmax"),
    Mutant("missing_scale", _model(NoScaleAttention), _cfg(), ("attention_scale",), "no 1/sqrt(d_k)"),
    Mutant("inverse_dk_scale", _model(InverseDkAttention), _cfg(positional_embedding_type="alibi"),
           ("attention_scale",), "1/d_k instead of 1/sqrt(d_k)"),
    Mutant("rope_mixed_pair_layouts", _model(MixedRopeLayoutAttention), _cfg(positional_embedding_type="rotary"),
           ("relative_position",), "q rotated in rotate-half pairs, k in interleaved pairs"),
    Mutant("rotary_absolute_leak", AbsoluteLeakRotaryModel, _cfg(positional_embedding_type="rotary"),
           ("relative_position",), "a sinusoidal absolute table added in a rotary model"),
    Mutant("padding_masks_queries", _model(QueryPaddingAttention), _cfg(attention_dir="bidirectional"),
           ("padding_outputs", "padding_pattern"), "padding masks query rows instead of key columns"),
    Mutant("left_padding_shifts_positions", IndexPositionsModel, _cfg(positional_embedding_type="standard"),
           ("padding_outputs",), "positions are token indices, so left padding moves them"),
    Mutant("batch_axis_norm", BatchNormModel, _cfg(normalization_type="RMS"),
           ("batch_independence",), "norm statistics over the batch axis"),
    Mutant("moe_capacity_undeclared", MoeModel, _cfg(), ("batch_independence",),
           "an MoE router drops tokens past an expert capacity counted over the batch, not declared"),
    Mutant("position_leak_without_positions", PositionLeakModel, _cfg(attention_dir="bidirectional"),
           ("permutation_equivariance",), "index sinusoids added to a model declared without positions"),
    Mutant("softmax_over_queries", _model(QuerySoftmaxAttention), _cfg(),
           ("pattern_distribution", "causal_outputs"), "softmax over the query axis"),
    Mutant("rotary_changes_norm", _model(NormChangingRopeAttention), _cfg(positional_embedding_type="rotary"),
           ("rotary_norm",), "cos and sin built with different frequency layouts"),
    Mutant("sinusoid_pairs_split_frequency", OddFrequencySinusoidModel,
           _cfg(positional_embedding_type="sinusoidal", attention_dir="bidirectional"),
           ("sinusoidal_shift",), "cos uses exponent (2i+1)/d, sin 2i/d"),
    Mutant("kv_cache_restarts_positions", RestartingCacheModel, _cfg(positional_embedding_type="standard"),
           ("kv_cache",), "cached decoding numbers each new token from position 0"),
    Mutant("sliding_window_one_wider", _model(WideWindowAttention),
           _cfg(positional_embedding_type="rotary", sliding_window=(3, None)),
           ("sliding_window",), "a window declared w admits w + 1 keys"),
    Mutant("window_on_full_layers", _model(EveryLayerWindowAttention),
           _cfg(positional_embedding_type="rotary", sliding_window=(3, None), source_config=declaration(
               RefConfig(), layer_types=["sliding_attention", "full_attention"], sliding_window=3)),
           ("window_layout",), "the sliding layers' window applied to a full-attention layer"),
    Mutant("rope_base_one_percent_off", _model(OffBaseRopeAttention),
           _cfg(positional_embedding_type="rotary", source_config=declaration(RefConfig())),
           ("rotary_frequencies",), "q and k turned by a base 1% off the config's rope_theta"),
    Mutant("kernel_window_two_sided", _model(TwoSidedKernelWindowAttention),
           _cfg(positional_embedding_type="rotary", sliding_window=(3, 3)),
           ("kernel_consistency",), "the kernel's window admits w + 1 keys, the explicit pattern w"),
    Mutant("alibi_slope_exponent_off_by_one", _model(OffByOneSlopeAttention), _cfg(positional_embedding_type="alibi"),
           ("alibi_slopes",), "slopes 2^(-8h/n) for h = 0..n-1"),
    Mutant("alibi_slopes_ignore_non_power_of_two", _model(GeometricOnlySlopeAttention),
           _cfg(positional_embedding_type="alibi", n_heads=6, d_model=48),
           ("alibi_slopes",), "6 heads get the plain geometric sequence 2^(-8h/6)"),
    Mutant("fully_masked_rows_nan", _model(NoSelfAttention), _cfg(positional_embedding_type="rotary"),
           ("finite_outputs",), "left-padded queries see no key: softmax over all -inf"),
    Mutant("rotary_phase_in_bfloat16", _model(Bfloat16PhaseAttention), _cfg(positional_embedding_type="rotary"),
           ("rotary_precision",), "inv_freq and the phase computed in bfloat16"),
    # encoder-decoders (tests/mutants/cross_attention.py: harness's EncoderDecoder with one bug each)
    Mutant("encoder_causal_by_mistake", xa.CausalEncoder, xa.CFG, ("encoder_bidirectional",),
           "the encoder is built causal"),
    Mutant("cross_attention_ignores_source_mask", xa.CrossIgnoresSourceMask, xa.CFG,
           ("cross_attention_pattern", "source_padding_outputs"), "cross-attention drops the source mask"),
    Mutant("source_summary_over_pads", xa.SourceSummaryOverPads, xa.CFG, ("source_padding_outputs",),
           "a source mean over the pads too is added to the memory"),
    Mutant("cross_kv_recomputed_every_step", xa.CrossKVRecomputed, xa.CFG, ("cross_kv_cache",),
           "cross K/V recomputed at every cached step"),
    Mutant("cross_kv_cache_from_unmasked_encoder", xa.CrossKVFromUnmaskedEncoder, xa.CFG, ("cross_kv_cache",),
           "the cached cross K/V come from an encoder pass without the source mask"),
    Mutant("decoder_sees_future_targets", xa.DecoderSeesFuture, xa.CFG, ("causal_pattern", "causal_outputs"),
           "the decoder's self-attention is not causal"),
]
