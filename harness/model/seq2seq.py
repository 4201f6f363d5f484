"""The encoder-decoder Transformer of Vaswani et al. 2017 (Fig. 1), with TransformerLens-style hooks.

A bidirectional encoder reads the source under its padding mask; a causal decoder reads the target,
each layer attending to itself, then to the encoder's output (:mod:`harness.model.cross_attention`),
then an MLP. The decoder *is* a :class:`~harness.model.transformer.Transformer` whose blocks carry
cross-attention, so its hooks keep today's names (``blocks.{l}.attn.hook_pattern``) and ``cfg`` keeps
describing it (``attention_dir="causal"``); the encoder is a bidirectional ``Transformer`` at
``self.encoder`` (hooks ``encoder.blocks.{l}.attn.hook_pattern`` ...; its unembedding is unused and tied,
so it costs no parameters). Hook names: harness/model/protocol_facts.py; docs/architecture.md.

Protocol: ``forward(tokens, attention_mask=None, position_offset=0, *, source_tokens=None,
source_mask=None)``. ``tokens`` is the decoder's input; without ``source_tokens`` the source is one
token of id 0 per row, so the decoder-only properties check the decoder on a fixed source. A source
token's position counts the real source tokens before it (left padding moves none), as in the decoder.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from harness._checks import check_int, invalid
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.config import ModelConfig
from harness.model.cross_attention import CrossCacheEntry, CrossContext, CrossInput, DecoderBlock
from harness.model.generate import sample
from harness.model.inputs import check_source, check_tokens
from harness.model.kv_cache import KVCache
from harness.model.layers import AttnContext
from harness.model.transformer import Transformer

__all__ = ["Seq2SeqConfig", "EncoderDecoder", "Seq2SeqCache", "DEFAULT_SOURCE_ID"]

DEFAULT_SOURCE_ID = 0  # the one-token source a protocol forward without source_tokens decodes against


@dataclass(frozen=True)
class Seq2SeqConfig(ModelConfig):
    """A :class:`ModelConfig` for the decoder plus ``n_encoder_layers`` (default ``n_layers``).

    Encoder and decoder share every width, the positional type and the vocabulary (one vocabulary for
    source and target, as the paper's shared BPE); the decoder must be causal.
    """

    n_encoder_layers: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_encoder_layers is None:
            object.__setattr__(self, "n_encoder_layers", self.n_layers)
        check_int("n_encoder_layers", self.n_encoder_layers, 1)
        if self.attention_dir != "causal":
            raise invalid("attention_dir", self.attention_dir, "'causal': it describes the decoder (the encoder "
                          "is always bidirectional)")

    @property
    def is_encoder_decoder(self) -> bool:
        return True

    def encoder_config(self) -> ModelConfig:
        """The encoder's config: these widths, ``n_encoder_layers`` layers, bidirectional."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        fields.update(n_layers=self.n_encoder_layers, attention_dir="bidirectional", tie_embeddings=True)
        return ModelConfig(**fields)


class Seq2SeqCache(KVCache):
    """The decoder's KV cache plus, per layer, cross-attention's keys and values and the source mask."""

    layers: list[CrossCacheEntry]  # type: ignore[assignment]  # a KVCacheEntry subclass

    def __init__(self, n_layers: int, capacity: Optional[int] = None):
        super().__init__(n_layers, capacity)
        self.layers = [CrossCacheEntry(capacity) for _ in range(n_layers)]
        self.source_allowed: Optional[Tensor] = None  # bool [batch, 1, 1, src_pos]; None: no source padding
        self.has_source = False  # set once the first call has encoded the source


class EncoderDecoder(Transformer):
    """Encoder-decoder Transformer following the model protocol and its encoder-decoder part."""

    block_class = DecoderBlock

    def __init__(self, cfg: Seq2SeqConfig):
        if not isinstance(cfg, Seq2SeqConfig):
            raise AttnlabTypeError(f"EncoderDecoder expects a harness.model.seq2seq.Seq2SeqConfig, got "
                                   f"{type(cfg).__name__}")
        super().__init__(cfg)
        self.encoder = Transformer(cfg.encoder_config())
        self._cross: Optional[CrossInput] = None  # set for the duration of one forward pass
        self.reset_parameters()  # one seeded generator over encoder and decoder alike
        self.setup()

    def encode(self, source_tokens: Tensor, source_mask: Optional[Tensor] = None
               ) -> Float[Tensor, "batch src_pos d_model"]:
        """The encoder's output (after its final norm), the memory cross-attention reads."""
        enc = self.encoder
        h = enc(source_tokens, attention_mask=source_mask, stop_at_layer=enc.config.n_layers)
        return enc.ln_final(h) if enc.has_ln_final else h

    def _source(self, batch: int, device: torch.device, source_tokens: Optional[Tensor],
                source_mask: Optional[Tensor], cache: Optional[KVCache]) -> CrossInput:
        if cache is not None and not isinstance(cache, Seq2SeqCache):
            raise AttnlabTypeError(f"kv_cache must be a Seq2SeqCache for an encoder-decoder, got "
                                   f"{type(cache).__name__}")
        started = cache is not None and cache.has_source
        if source_tokens is None:
            if source_mask is not None:
                raise AttnlabError("source_mask was given without source_tokens: expected both or neither")
            if started:
                return CrossInput(memory=None, allowed=cache.source_allowed if cache is not None else None)
            source_tokens = torch.full((batch, 1), DEFAULT_SOURCE_ID, dtype=torch.long, device=device)
        elif started:
            raise AttnlabError("source_tokens were given for a cache that already holds a source: expected them "
                               "only at the first call")
        mask = check_source(source_tokens, source_mask, batch, self.config.d_vocab)
        allowed = None if mask is None or bool(mask.all()) else mask[:, None, None, :]
        cross = CrossInput(memory=self.encode(source_tokens, mask), allowed=allowed)
        if cache is not None:
            cache.source_allowed, cache.has_source = allowed, True
        return cross

    def _context(self, batch: int, q: int, device: torch.device, dtype: torch.dtype, mask: Optional[Tensor],
                 offset: int, cache: Optional[KVCache]) -> tuple[Tensor, AttnContext]:
        positions, ctx = super()._context(batch, q, device, dtype, mask, offset, cache)
        fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)}
        return positions, CrossContext(**fields, cross=self._cross)

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0, *,
                source_tokens: Optional[Tensor] = None, source_mask: Optional[Tensor] = None,
                start_at_layer: Optional[int] = None, stop_at_layer: Optional[int] = None,
                kv_cache: Optional[KVCache] = None) -> Tensor:
        """Decoder logits ``[batch, pos, d_vocab]`` given the source (see the module docstring)."""
        if not isinstance(tokens, Tensor) or tokens.ndim < 2:
            check_tokens(tokens, self.config.d_vocab)  # raises the protocol's one message
        self._cross = self._source(tokens.shape[0], tokens.device, source_tokens, source_mask, kv_cache)
        try:
            return super().forward(tokens, attention_mask, position_offset, start_at_layer=start_at_layer,
                                   stop_at_layer=stop_at_layer, kv_cache=kv_cache)
        finally:
            self._cross = None

    def forward_with_cache(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,
                           past: Optional[KVCache] = None, *, source_tokens: Optional[Tensor] = None,
                           source_mask: Optional[Tensor] = None) -> tuple[Tensor, KVCache]:
        """Cached decoding (``harness.adapters.protocol.CachedDecoding``); the source goes with the first call.

        That call encodes it and each layer's cross-attention keys and values go into the cache; later
        calls take ``past`` only and compute none of them again.
        """
        if past is not None and not isinstance(past, Seq2SeqCache):
            raise AttnlabTypeError(f"past must be None or the Seq2SeqCache a previous call returned, got "
                                   f"{type(past).__name__}")
        cache = Seq2SeqCache(self.config.n_layers) if past is None else past
        logits = self(tokens, attention_mask=attention_mask, kv_cache=cache, source_tokens=source_tokens,
                      source_mask=source_mask)
        return logits, cache

    @torch.no_grad()
    def generate(self, tokens: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: Optional[int] = None, attention_mask: Optional[Tensor] = None,
                 generator: Optional[torch.Generator] = None, use_cache: bool = True, return_logits: bool = False,
                 source_tokens: Optional[Tensor] = None, source_mask: Optional[Tensor] = None):
        """Continue the decoder prompt ``tokens`` by ``max_new_tokens`` given the source (sampled as
        :func:`harness.model.generate.sample`; ``temperature=0`` is greedy). With ``return_logits``, also the
        logits that chose each new token ``[batch, max_new_tokens, d_vocab]``."""
        check_int("max_new_tokens", max_new_tokens, 0)
        check_tokens(tokens, self.config.d_vocab)
        out, mask, steps = tokens, attention_mask, []
        logits, past = self.forward_with_cache(tokens, attention_mask, source_tokens=source_tokens,
                                               source_mask=source_mask)
        for i in range(max_new_tokens):
            steps.append(logits[:, -1])
            new = sample(logits[:, -1], temperature, top_k, generator)[:, None]
            out = torch.cat((out, new), 1)
            if mask is not None:
                mask = torch.cat((mask, torch.ones_like(new)), 1)
            if i + 1 < max_new_tokens:
                if use_cache:
                    logits, past = self.forward_with_cache(new, past=past)
                else:
                    logits = self(out, attention_mask=mask, source_tokens=source_tokens, source_mask=source_mask)
        if return_logits:
            empty = tokens.new_zeros((tokens.shape[0], 0, self.config.d_vocab), dtype=torch.float32)
            return out, (torch.stack(steps, 1) if steps else empty)
        return out
