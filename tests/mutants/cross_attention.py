"""Encoder-decoder mutants: harness's EncoderDecoder with one planted bug each (listed in catalogue.py).

Each subclass overrides one step of :class:`harness.model.seq2seq.EncoderDecoder` (``encode``,
``_source``, ``_context``) so that exactly one encoder-decoder fact breaks; the docstrings say which
property has to catch it and why. The unbroken model passes every row (tests/test_properties_cross.py).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from harness.model.cross_attention import CrossInput
from harness.model.kv_cache import KVCache
from harness.model.layers import AttnContext
from harness.model.seq2seq import EncoderDecoder, Seq2SeqCache, Seq2SeqConfig
from harness.model.transformer import Transformer

CFG = Seq2SeqConfig(n_layers=2, n_encoder_layers=2, d_model=32, n_heads=4, d_vocab=32, n_ctx=32,
                    positional_embedding_type="standard")


class CausalEncoder(EncoderDecoder):
    """The encoder is built causal by mistake: a real source token no longer sees the real ones after it.

    ``encoder_bidirectional`` sees the later real keys at score -inf, weight 0.
    """

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__(cfg)
        self.encoder = Transformer(cfg.encoder_config().replace(attention_dir="causal"))
        self.reset_parameters()
        self.setup()


class CrossIgnoresSourceMask(EncoderDecoder):
    """Cross-attention drops the source mask (the encoder keeps it): decoder queries weigh the pads.

    ``cross_attention_pattern`` sees the weight on padded keys; ``source_padding_outputs`` the logits move.
    """

    def _source(self, batch, device, source_tokens, source_mask, cache) -> CrossInput:
        cross = super()._source(batch, device, source_tokens, source_mask, cache)
        return CrossInput(memory=cross.memory, allowed=None)


class SourceSummaryOverPads(EncoderDecoder):
    """A pooled summary of the source is added to every memory position, averaged over the pads too.

    No attention pattern changes, so only ``source_padding_outputs`` can see it.
    """

    def encode(self, source_tokens: Tensor, source_mask: Optional[Tensor] = None) -> Tensor:
        memory = super().encode(source_tokens, source_mask)
        return memory + memory.mean(1, keepdim=True)


class _RememberingCache(Seq2SeqCache):
    memory: Optional[Tensor] = None
    source_tokens: Optional[Tensor] = None


class CrossKVRecomputed(EncoderDecoder):
    """Cached decoding keeps the encoder output and recomputes every layer's cross K/V at every step.

    The logits stay right; ``cross_kv_cache`` sees ``cross_attn.hook_k`` fire after the first call.
    """

    def forward_with_cache(self, tokens, attention_mask=None, past=None, *, source_tokens=None, source_mask=None):
        cache = _RememberingCache(self.config.n_layers) if past is None else past
        return super().forward_with_cache(tokens, attention_mask, cache, source_tokens=source_tokens,
                                          source_mask=source_mask)

    def _source(self, batch, device, source_tokens, source_mask, cache: Optional[KVCache]) -> CrossInput:
        if isinstance(cache, _RememberingCache) and cache.has_source:
            for entry in cache.layers:
                entry.cross_k = entry.cross_v = None
            return CrossInput(memory=cache.memory, allowed=cache.source_allowed)
        cross = super()._source(batch, device, source_tokens, source_mask, cache)
        if isinstance(cache, _RememberingCache):
            cache.memory = cross.memory
        return cross


class CrossKVFromUnmaskedEncoder(EncoderDecoder):
    """The cross K/V written into the cache come from an encoder pass that forgot the source mask.

    A plain forward is right; cached decoding reads keys and values of the wrong encoder state, so
    ``cross_kv_cache`` finds cached logits that differ from recomputation (hook_k never fires again).
    """

    def _source(self, batch, device, source_tokens, source_mask, cache) -> CrossInput:
        fresh = isinstance(cache, Seq2SeqCache) and not cache.has_source
        cross = super()._source(batch, device, source_tokens, source_mask, cache)
        if fresh and source_tokens is not None:
            wrong = self.encode(source_tokens, None)
            for block, entry in zip(self.blocks, cache.layers, strict=True):
                entry.cross_k, entry.cross_v = block.cross_attn.keys_values(wrong)
        return cross


class DecoderSeesFuture(EncoderDecoder):
    """The decoder's self-attention loses its causal mask: a target position reads later target tokens.

    The decoder is what ``cfg`` describes, so the decoder-only rows catch it: ``causal_pattern`` sees
    weight above the diagonal, ``causal_outputs`` a logit that moves with a later token.
    """

    def _context(self, batch, q, device, dtype, mask, offset, cache) -> tuple[Tensor, AttnContext]:
        positions, ctx = super()._context(batch, q, device, dtype, mask, offset, cache)
        ctx.is_causal = False
        if ctx.allowed is not None and ctx.allowed.shape[-1] == ctx.allowed.shape[-2]:
            real_keys = ctx.allowed.any(-2, keepdim=True)  # the last real query sees every real key
            ctx.allowed = ctx.allowed | real_keys.expand_as(ctx.allowed)
        return positions, ctx

